/*
 * aggbox's launcher for the persistent local MongoDB stand-in (`aggbox local start`):
 * mongo-java-server (de.bwaldvogel:mongo-java-server) with its H2 MVStore backend, so the
 * data survives a stop and a start of the server.
 *
 * Usage: java -cp <classes>:<jars> AggboxMongoH2Server <port> <data file>
 *
 * - H2 backend on <data file> (created if missing), reporting MongoDB 5.0.0 / wire version 13
 *   like AggboxMongoServer;
 * - oplog enabled (change streams; the oplog is a collection in the same file);
 * - binds 127.0.0.1:<port> only and prints "AGGBOX-MJS READY 127.0.0.1:<port>" on stdout;
 *   exits with status 3 when the port is taken;
 * - runs until SIGTERM/SIGINT; the JVM shutdown hook stops the server, which commits and
 *   closes the data file. It does not watch stdin: it is meant to outlive its starter.
 *
 * Compiled once by aggbox.servers.maven.compile_java and cached.
 */

import de.bwaldvogel.mongo.MongoServer;
import de.bwaldvogel.mongo.MongoVersion;
import de.bwaldvogel.mongo.backend.h2.H2Backend;

import java.util.List;

public final class AggboxMongoH2Server {

    /** MongoDB 5.0: the feature level mongo-java-server implements best. */
    private static final class Mongo50 implements MongoVersion {
        @Override
        public List<Integer> getVersionArray() {
            return List.of(5, 0, 0);
        }

        @Override
        public int getWireVersion() {
            return 13;
        }
    }

    private AggboxMongoH2Server() {
    }

    public static void main(String[] args) throws Exception {
        if (args.length != 2) {
            System.err.println("usage: AggboxMongoH2Server <port> <data file>");
            System.exit(2);
        }
        int port = Integer.parseInt(args[0]);

        H2Backend backend = new H2Backend(args[1]);
        backend.version(new Mongo50());
        MongoServer server = new MongoServer(backend);
        server.enableOplog();
        try {
            server.bind("127.0.0.1", port);
        } catch (RuntimeException e) {
            System.out.println("AGGBOX-MJS BIND-FAILED 127.0.0.1:" + port + " " + e);
            System.out.flush();
            e.printStackTrace();
            server.shutdownNow();
            System.exit(3);
        }
        Runtime.getRuntime().addShutdownHook(new Thread(server::shutdown, "aggbox-mjs-shutdown"));
        System.out.println("AGGBOX-MJS READY 127.0.0.1:" + port);
        System.out.flush();
        Thread.currentThread().join();
    }
}
