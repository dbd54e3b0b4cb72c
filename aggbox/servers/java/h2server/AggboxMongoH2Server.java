/*
 * aggbox's launcher for the persistent local MongoDB stand-in (`aggbox local start`):
 * mongo-java-server (de.bwaldvogel:mongo-java-server) with its H2 MVStore backend, so the
 * data survives a stop and a start of the server.
 *
 * Usage: java -cp <classes>:<jars> AggboxMongoH2Server <port> <data file>
 *            [--oplog-max-entries N] [--oplog-max-age-seconds S] [--oplog-trim-interval-seconds S]
 *
 * - H2 backend on <data file> (created if missing), reporting MongoDB 5.0.0 / wire version 13
 *   like AggboxMongoServer;
 * - a bounded, indexed oplog (change streams; BoundedOplog.java) in the same file;
 * - every request runs with its MVStore version registered (VersionGuardedH2Backend.java);
 * - binds 127.0.0.1:<port> only and prints "AGGBOX-MJS READY 127.0.0.1:<port>" on stdout;
 *   exits with status 3 when the port is taken;
 * - the command {aggboxOplogStats: 1} (any database) reports the oplog's size and bounds, the
 *   data file's size and the storage errors seen (ServerStats.java);
 * - storage errors (H2's MVStoreException, in a request or in H2's background writer) are
 *   printed as lines starting with "AGGBOX-STORAGE-ERROR" (StorageErrors.java);
 * - runs until SIGTERM/SIGINT; the JVM shutdown hook stops the server, which commits and
 *   closes the data file. It does not watch stdin: it is meant to outlive its starter.
 *
 * Why not mongo-java-server's own oplog (CollectionBackedOplog on the collection local.oplog.rs):
 *
 * 1. It is never trimmed, and every change-stream open and every getMore reads the whole
 *    collection (queryAllAsStream, then a filter on ts and a sort), and a full-document
 *    lookup (fullDocument: "updateLookup") scans the looked-up collection. Reads cost
 *    O(oplog) + O(collection) per event: seconds at ~10^5 entries.
 * 2. Those long scans are what made H2 report "Chunk N not found" (see VersionGuardedH2Backend).
 *
 * BoundedOplog keeps the entries in an MVMap keyed by their timestamp (ts as a long:
 * seconds << 32 | increment, unique and increasing), so a read is a range read from the
 * stream's position, a trim removes the map's head, and the update lookup goes through the
 * _id index. The change events it produces are those of CollectionBackedOplog (same fields,
 * same resume tokens: {_data: hex of ts}).
 *
 * The files of this folder (aggbox/servers/java/h2server/) are compiled together, once, by
 * aggbox.servers.maven.compile_java("h2server", ...) and cached; the main class is this one.
 * docs/design.md "The local server" says what each adds to mongo-java-server and which tests
 * hold it.
 */

import de.bwaldvogel.mongo.MongoServer;
import de.bwaldvogel.mongo.MongoVersion;

import org.h2.mvstore.MVStore;

import java.util.List;

public final class AggboxMongoH2Server {

    /** Defaults of the oplog's bounds; aggbox.servers.persistent passes its own (the same). */
    static final long DEFAULT_MAX_ENTRIES = 250_000L;
    static final long DEFAULT_MAX_AGE_SECONDS = 7L * 24 * 3600;
    static final long DEFAULT_TRIM_INTERVAL_SECONDS = 10L;

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

    private static long longOption(String[] args, int index, String name) {
        if (index >= args.length) {
            System.err.println("AggboxMongoH2Server: " + name + " needs a value");
            System.exit(2);
        }
        try {
            long value = Long.parseLong(args[index]);
            if (value < 0) {
                throw new NumberFormatException("negative");
            }
            return value;
        } catch (NumberFormatException e) {
            System.err.println("AggboxMongoH2Server: " + name + " must be a non-negative integer: " + args[index]);
            System.exit(2);
            return 0;
        }
    }

    public static void main(String[] args) throws Exception {
        if (args.length < 2) {
            System.err.println("usage: AggboxMongoH2Server <port> <data file> [--oplog-max-entries N]"
                + " [--oplog-max-age-seconds S] [--oplog-trim-interval-seconds S]");
            System.exit(2);
        }
        int port = Integer.parseInt(args[0]);
        long maxEntries = DEFAULT_MAX_ENTRIES;
        long maxAge = DEFAULT_MAX_AGE_SECONDS;
        long interval = DEFAULT_TRIM_INTERVAL_SECONDS;
        for (int i = 2; i < args.length; i += 2) {
            switch (args[i]) {
                case "--oplog-max-entries":
                    maxEntries = longOption(args, i + 1, args[i]);
                    break;
                case "--oplog-max-age-seconds":
                    maxAge = longOption(args, i + 1, args[i]);
                    break;
                case "--oplog-trim-interval-seconds":
                    interval = longOption(args, i + 1, args[i]);
                    break;
                default:
                    System.err.println("AggboxMongoH2Server: unknown option " + args[i]);
                    System.exit(2);
            }
        }

        // H2's defaults (MVStore.open(fileName) as mongo-java-server does): autocommit about once
        // a second, auto-compaction, 45 s chunk retention, 16 MB page cache. Errors in H2's
        // background writer are reported instead of only printed by H2.
        MVStore store = new MVStore.Builder()
            .fileName(args[1])
            .backgroundExceptionHandler((thread, error) -> StorageErrors.report("H2 background writer", error))
            .open();
        BoundedOplog.Settings settings = new BoundedOplog.Settings(maxEntries, maxAge, interval);
        VersionGuardedH2Backend backend = new VersionGuardedH2Backend(store, settings);
        backend.version(new Mongo50());
        MongoServer server = new MongoServer(backend);
        server.enableOplog();
        backend.boundedOplog().startTrimming();
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
        System.out.println("AGGBOX-MJS READY 127.0.0.1:" + port + " oplog max entries " + maxEntries
            + ", max age " + maxAge + " s");
        System.out.flush();
        Thread.currentThread().join();
    }
}
