/*
 * aggbox's launcher for mongo-java-server (de.bwaldvogel:mongo-java-server), the MongoDB
 * stand-in used by tests and the embedded default when no mongod is available.
 *
 * Usage: java -cp <classes>:<jars> AggboxMongoServer <port> [--ignore-stdin]
 *
 * - in-memory backend, reporting MongoDB 5.0.0 / wire version 13 (pymongo >= 4.18 refuses
 *   the library's default wire version 8);
 * - oplog enabled (change streams);
 * - binds 127.0.0.1:<port> only and prints "AGGBOX-MJS READY 127.0.0.1:<port>" on stdout;
 * - exits when its stdin reaches end of file (the parent process closed the pipe or died),
 *   unless --ignore-stdin is given, and on SIGTERM/SIGINT (JVM shutdown hook).
 *
 * Compiled once by aggbox.servers.maven.compile_java and cached.
 */

import de.bwaldvogel.mongo.MongoServer;
import de.bwaldvogel.mongo.MongoVersion;
import de.bwaldvogel.mongo.backend.memory.MemoryBackend;

import java.util.List;

public final class AggboxMongoServer {

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

    private AggboxMongoServer() {
    }

    public static void main(String[] args) throws Exception {
        if (args.length < 1) {
            System.err.println("usage: AggboxMongoServer <port> [--ignore-stdin]");
            System.exit(2);
        }
        int port = Integer.parseInt(args[0]);
        boolean watchStdin = !(args.length > 1 && "--ignore-stdin".equals(args[1]));

        MemoryBackend backend = new MemoryBackend();
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
        Runtime.getRuntime().addShutdownHook(new Thread(server::shutdownNow, "aggbox-mjs-shutdown"));
        System.out.println("AGGBOX-MJS READY 127.0.0.1:" + port);
        System.out.flush();

        if (watchStdin) {
            try {
                while (System.in.read() != -1) {
                    // the parent never writes; EOF means it closed the pipe or died
                }
            } catch (java.io.IOException e) {
                // treat as EOF
            }
            System.err.println("AggboxMongoServer: stdin closed, shutting down");
            System.exit(0);
        } else {
            Thread.currentThread().join();
        }
    }
}
