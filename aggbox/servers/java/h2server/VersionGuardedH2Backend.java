/* Chunk registration of the local server: see AggboxMongoH2Server.java and docs/design.md
 * "The local server". */

import de.bwaldvogel.mongo.MongoDatabase;
import de.bwaldvogel.mongo.backend.QueryResult;
import de.bwaldvogel.mongo.backend.h2.H2Backend;
import de.bwaldvogel.mongo.bson.Document;
import de.bwaldvogel.mongo.oplog.Oplog;
import de.bwaldvogel.mongo.wire.message.MongoMessage;
import de.bwaldvogel.mongo.wire.message.MongoQuery;

import io.netty.channel.Channel;

import org.h2.mvstore.MVStore;

/**
 * H2Backend whose every request runs with its MVStore version registered.
 *
 * Why: MVStore (H2 2.x) frees a chunk once no page of the current version lives in it, it
 * is older than the retention time (45 s) and its last use is older than the "oldest version
 * to keep", which is the current version minus versionsToKeep (5) unless a reader registered
 * an older one with registerVersionUsage(). H2's SQL engine registers every statement;
 * mongo-java-server never does. A request that walks a map (a collection scan, the old
 * oplog scan) holds the root of the version it started on; the background writer commits
 * about once a second (more often under load) and rewrites sparse chunks (auto-compaction),
 * so after a few versions a page the walk has not reached yet may sit in a chunk already
 * freed: "MVStoreException: Chunk N not found". The longer the walk (the bigger the oplog or
 * the collection) and the busier the store, the likelier. Registering the version for the
 * duration of each request (all of mongo-java-server's results, cursors' batches included,
 * are built within one request) keeps its chunks; it costs two atomic operations.
 */
final class VersionGuardedH2Backend extends H2Backend {

    /** Time H2 may spend compacting the file when the server stops cleanly. */
    static final int CLOSE_COMPACT_MS = 10_000;

    private final MVStore store;
    private final BoundedOplog.Settings oplogSettings;
    private volatile BoundedOplog boundedOplog;

    VersionGuardedH2Backend(MVStore store, BoundedOplog.Settings oplogSettings) {
        super(AggboxH2Database.use(store)); // H2Backend opens the existing databases at once
        this.store = store;
        this.oplogSettings = oplogSettings;
    }

    /** aggbox's databases (AggboxH2Database.java): index keys compared without serializing
     * them again, post-images kept for the change events. */
    @Override
    protected MongoDatabase openOrCreateDatabase(String databaseName) {
        return new AggboxH2Database(databaseName, getMvStore(), getCursorRegistry());
    }

    @Override
    public Document handleCommand(Channel channel, String databaseName, String command, Document query) {
        if ("aggboxOplogStats".equalsIgnoreCase(command)) {
            return ServerStats.collect(boundedOplog, store);
        }
        MVStore.TxCounter usage = store.registerVersionUsage();
        try {
            Document reply = super.handleCommand(channel, databaseName, command, query);
            BoundedOplog oplog = boundedOplog;
            if (oplog != null && ("getMore".equals(command) || "aggregate".equals(command))) {
                oplog.addPostBatchResumeToken(reply);
            } else if (oplog != null && "ping".equalsIgnoreCase(command)) {
                reply.put("operationTime", oplog.operationTime());
            }
            return reply;
        } catch (RuntimeException e) {
            if (StorageErrors.is(e) && !store.isClosed()) {
                StorageErrors.report("command " + command + " on " + databaseName, e);
            }
            throw e;
        } finally {
            store.deregisterVersionUsage(usage);
        }
    }

    @Override
    public QueryResult handleQuery(MongoQuery query) {
        MVStore.TxCounter usage = store.registerVersionUsage();
        try {
            return super.handleQuery(query);
        } catch (RuntimeException e) {
            if (StorageErrors.is(e) && !store.isClosed()) {
                StorageErrors.report("query", e);
            }
            throw e;
        } finally {
            store.deregisterVersionUsage(usage);
        }
    }

    @Override
    public Document handleMessage(MongoMessage message) {
        MVStore.TxCounter usage = store.registerVersionUsage();
        try {
            return super.handleMessage(message);
        } catch (RuntimeException e) {
            if (StorageErrors.is(e) && !store.isClosed()) {
                StorageErrors.report("message", e);
            }
            throw e;
        } finally {
            store.deregisterVersionUsage(usage);
        }
    }

    /**
     * A clean stop (SIGTERM: `aggbox local stop`) gives H2 up to CLOSE_COMPACT_MS to
     * rewrite sparse chunks and move chunks to the front, so the file shrinks; H2Backend's
     * own close() does no compaction.
     */
    @Override
    public void close() {
        BoundedOplog current = boundedOplog;
        if (current != null) {
            current.stopTrimming();
        }
        try {
            store.close(CLOSE_COMPACT_MS);
        } catch (RuntimeException e) {
            StorageErrors.report("close", e);
        }
        super.close(); // the store is closed: its close() does nothing more
    }

    @Override
    protected Oplog createOplog() {
        BoundedOplog created = new BoundedOplog(this, store, getCursorRegistry(), oplogSettings);
        created.dropLegacyOplog(resolveDatabase("local"));
        boundedOplog = created;
        return created;
    }

    BoundedOplog boundedOplog() {
        return boundedOplog;
    }
}
