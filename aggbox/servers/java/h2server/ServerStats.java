/* Stats of the local server: see AggboxMongoH2Server.java and docs/design.md
 * "The local server". */

import de.bwaldvogel.mongo.bson.Document;

import org.h2.mvstore.FileStore;
import org.h2.mvstore.MVStore;

/**
 * The answer to the command {aggboxOplogStats: 1} (any database; mongo-java-server has no
 * serverStatus worth reading): the oplog's size and bounds (entries, firstTs, lastTs,
 * trimmedThrough, trimmedSinceStart, maxEntries, maxAgeSeconds), the data file's size and fill
 * rates, and the storage errors seen. Read by tests/servers/test_local_soak.py and by
 * bench/soak.py, bench/aging.py, bench/h2_chunks.py to see the oplog stay bounded.
 */
final class ServerStats {

    private ServerStats() {
    }

    static Document collect(BoundedOplog oplog, MVStore store) {
        Document stats = new Document();
        if (oplog != null) {
            oplog.appendStats(stats);
        }
        FileStore<?> fileStore = store.getFileStore();
        stats.append("fileBytes", fileStore == null ? 0L : fileStore.size());
        stats.append("fillRate", fileStore == null ? 0 : fileStore.getFillRate());
        stats.append("chunksFillRate", fileStore == null ? 0 : fileStore.getChunksFillRate());
        stats.append("storageErrors", StorageErrors.COUNT.get());
        stats.append("ok", 1.0);
        return stats;
    }
}
