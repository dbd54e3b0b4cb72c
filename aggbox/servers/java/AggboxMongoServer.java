/*
 * aggbox's launcher for mongo-java-server (de.bwaldvogel:mongo-java-server), the MongoDB
 * stand-in used by tests and the embedded default when no mongod is available.
 *
 * Usage: java -cp <classes>:<jars> AggboxMongoServer <port> [--ignore-stdin] [--no-oplog]
 *
 * - in-memory backend, reporting MongoDB 5.0.0 / wire version 13 (pymongo >= 4.18 refuses
 *   the library's default wire version 8);
 * - oplog enabled (change streams), unless --no-oplog is given: then the server refuses
 *   $changeStream as a standalone mongod does (code 40573; the library itself would fail
 *   with a NullPointerException and no code), for tests of the polling fallback;
 * - binds 127.0.0.1:<port> only and prints "AGGBOX-MJS READY 127.0.0.1:<port>" on stdout;
 * - exits when its stdin reaches end of file (the parent process closed the pipe or died),
 *   unless --ignore-stdin is given, and on SIGTERM/SIGINT (JVM shutdown hook).
 *
 * Compiled once by aggbox.servers.maven.compile_java and cached.
 */

import de.bwaldvogel.mongo.MongoServer;
import de.bwaldvogel.mongo.MongoVersion;
import de.bwaldvogel.mongo.backend.memory.MemoryBackend;
import de.bwaldvogel.mongo.bson.Document;
import de.bwaldvogel.mongo.exception.MongoServerError;

import io.netty.channel.Channel;

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

    /** Without an oplog: {@code $changeStream} refused with a standalone mongod's error. */
    private static final class NoOplogBackend extends MemoryBackend {
        @Override
        public Document handleCommand(Channel channel, String databaseName, String command, Document query) {
            if ("aggregate".equalsIgnoreCase(command) && opensChangeStream(query)) {
                throw new MongoServerError(40573, "Location40573",
                    "The $changeStream stage is only supported on replica sets");
            }
            return super.handleCommand(channel, databaseName, command, query);
        }

        private static boolean opensChangeStream(Document query) {
            Object pipeline = query.get("pipeline");
            if (!(pipeline instanceof List<?> stages) || stages.isEmpty()) {
                return false;
            }
            return stages.get(0) instanceof Document first && first.containsKey("$changeStream");
        }
    }

    private AggboxMongoServer() {
    }

    public static void main(String[] args) throws Exception {
        if (args.length < 1) {
            System.err.println("usage: AggboxMongoServer <port> [--ignore-stdin] [--no-oplog]");
            System.exit(2);
        }
        int port = Integer.parseInt(args[0]);
        List<String> options = List.of(args).subList(1, args.length);
        boolean watchStdin = !options.contains("--ignore-stdin");
        boolean oplog = !options.contains("--no-oplog");

        MemoryBackend backend = oplog ? new MemoryBackend() : new NoOplogBackend();
        backend.version(new Mongo50());
        MongoServer server = new MongoServer(backend);
        if (oplog) {
            server.enableOplog();
        }
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
