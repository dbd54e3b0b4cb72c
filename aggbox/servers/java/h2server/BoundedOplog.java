/* The oplog window of the local server: see AggboxMongoH2Server.java and docs/design.md
 * "The local server". */

import de.bwaldvogel.mongo.MongoCollection;
import de.bwaldvogel.mongo.MongoDatabase;
import de.bwaldvogel.mongo.backend.AbstractCursor;
import de.bwaldvogel.mongo.backend.Cursor;
import de.bwaldvogel.mongo.backend.CursorRegistry;
import de.bwaldvogel.mongo.backend.Utils;
import de.bwaldvogel.mongo.backend.aggregation.Aggregation;
import de.bwaldvogel.mongo.backend.h2.H2Backend;
import de.bwaldvogel.mongo.bson.BsonTimestamp;
import de.bwaldvogel.mongo.bson.Document;
import de.bwaldvogel.mongo.exception.MongoServerError;
import de.bwaldvogel.mongo.oplog.NoopOplog;
import de.bwaldvogel.mongo.oplog.Oplog;

import org.h2.mvstore.MVMap;
import org.h2.mvstore.MVStore;

import java.time.Instant;
import java.util.ArrayList;
import java.util.Iterator;
import java.util.List;
import java.util.Map;
import java.util.NoSuchElementException;
import java.util.Spliterator;
import java.util.Spliterators;
import java.util.UUID;
import java.util.concurrent.atomic.AtomicLong;
import java.util.stream.Collectors;
import java.util.stream.Stream;
import java.util.stream.StreamSupport;

/**
 * The oplog: change events for mongo-java-server's change streams, bounded like a capped
 * oplog.
 *
 * Storage: MVMap "aggbox.oplog" (ts as long -> the entry document, fields as in
 * CollectionBackedOplog: ts, t, h, v, op, ns, ui, wall, o, o2) and MVMap
 * "aggbox.oplog.meta" ("trimmedThrough": the greatest ts ever removed, 0 when none).
 * Entries are appended under one lock, a ts taken and put in one step, so a reader, which
 * sees one version of the map, always sees a prefix of the oplog: an event is never
 * skipped because an older ts was put after a newer one.
 *
 * Bound: every trim interval, the entries beyond the newest maxEntries, and those older than
 * maxAgeSeconds, are removed (trimmedThrough is raised first). A stream whose position is
 * below trimmedThrough may have lost events: opening it (resumeAfter, startAfter,
 * startAtOperationTime) and reading it (getMore) fail with code 286,
 * ChangeStreamHistoryLost, as on MongoDB when the oplog has rolled over. (The stock oplog
 * would silently continue after the gap.)
 */
final class BoundedOplog implements Oplog {

    /** MongoDB's ChangeStreamHistoryLost: aggbox's dispatcher answers it with a fresh stream
     * and a full sweep. */
    static final int CHANGE_STREAM_HISTORY_LOST = 286;

    record Settings(long maxEntries, long maxAgeSeconds, long trimIntervalSeconds) {
    }

    private static final String DATA_MAP = "aggbox.oplog";
    private static final String META_MAP = "aggbox.oplog.meta";
    private static final String TRIMMED_THROUGH = "trimmedThrough";
    private static final String LEGACY_OPLOG = "oplog.rs";
    private static final int TRIM_BATCH = 10_000;
    private static final long SUMMARY_EVERY_MS = 60_000L;

    private final H2Backend backend;
    private final MVStore store;
    private final CursorRegistry cursorRegistry;
    private final Settings settings;
    private final MVMap<Long, Document> entries;
    private final MVMap<String, Object> meta;
    private final UUID ui = UUID.randomUUID();
    private final Object appendLock = new Object();
    private long lastTs;
    private volatile long trimmedThrough;
    private final AtomicLong trimmedSinceStart = new AtomicLong();
    private long trimmedSinceSummary;
    private long lastSummaryMs = System.currentTimeMillis();

    BoundedOplog(H2Backend backend, MVStore store, CursorRegistry cursorRegistry, Settings settings) {
        this.backend = backend;
        this.store = store;
        this.cursorRegistry = cursorRegistry;
        this.settings = settings;
        this.entries = store.openMap(DATA_MAP);
        this.meta = store.openMap(META_MAP);
        Object stored = meta.get(TRIMMED_THROUGH);
        this.trimmedThrough = stored instanceof Long ? (Long) stored : 0L;
        Long last = entries.lastKey();
        this.lastTs = Math.max(last == null ? 0L : last, trimmedThrough);
    }

    /**
     * A data file written by an earlier launcher holds mongo-java-server's own oplog, the
     * collection local.oplog.rs, possibly large: it is dropped, and the greatest ts it held
     * becomes trimmedThrough, so resume tokens from before are answered "history lost".
     */
    void dropLegacyOplog(MongoDatabase local) {
        MongoCollection<?> legacy = local.resolveCollection(LEGACY_OPLOG, false);
        if (legacy == null) {
            return;
        }
        long count = 0;
        long greatest = 0;
        Iterator<Document> all = legacy.queryAll().iterator();
        while (all.hasNext()) {
            Object ts = all.next().get("ts");
            count++;
            if (ts instanceof BsonTimestamp) {
                greatest = Math.max(greatest, ((BsonTimestamp) ts).getValue());
            }
        }
        synchronized (appendLock) {
            raiseTrimmedThrough(greatest);
            lastTs = Math.max(lastTs, greatest);
        }
        local.dropCollection(LEGACY_OPLOG, NoopOplog.get());
        store.commit();
        System.out.println("AGGBOX-OPLOG dropped the legacy oplog local.oplog.rs (" + count
            + " entries); resume tokens up to " + Long.toHexString(greatest) + " are history-lost");
        System.out.flush();
    }

    // ---- writing -------------------------------------------------------------------------

    private long nextTs() {
        long candidate = (Instant.now().getEpochSecond() << 32) | 1L;
        lastTs = Math.max(candidate, lastTs + 1);
        return lastTs;
    }

    private void append(List<Document> bodies) {
        if (bodies.isEmpty()) {
            return;
        }
        synchronized (appendLock) {
            for (Document body : bodies) {
                long ts = nextTs();
                Document entry = new Document()
                    .append("ts", new BsonTimestamp(ts))
                    .append("t", 1L)
                    .append("h", 0L)
                    .append("v", 2L);
                entry.putAll(body);
                entry.append("ui", ui).append("wall", Instant.now());
                entries.put(ts, entry);
            }
        }
    }

    private static Document body(String op, String namespace) {
        return new Document("op", op).append("ns", namespace);
    }

    private static boolean isLocal(String namespace) {
        return "local".equals(Utils.getDatabaseNameFromFullName(namespace));
    }

    @Override
    public void handleInsert(String namespace, List<Document> documents) {
        if (isLocal(namespace)) {
            return;
        }
        append(documents.stream()
            .map(d -> body("i", namespace).append("o", d.cloneDeeply()))
            .collect(Collectors.toList()));
    }

    @Override
    public void handleUpdate(String namespace, Document selector, Document query, List<Object> modifiedIds) {
        if (isLocal(namespace)) {
            return;
        }
        append(modifiedIds.stream()
            .map(id -> updateBody(namespace, query, id))
            .collect(Collectors.toList()));
    }

    /**
     * An update's entry: as mongo-java-server's ("o" the update, "o2" the _id), plus what
     * MongoDB's event reports and the stock one lacks (ChangeEvents.java): "ud", the update
     * description, for an update of operators; for a replacement "o" is the document as
     * replaced and "rep" is set (a "replace" event carrying it). Without the post-image (not
     * captured: an update outside updateDocuments) the entry is the stock one, and its event
     * has no updateDescription.
     */
    private static Document updateBody(String namespace, Document query, Object id) {
        Document body = body("u", namespace);
        Document after = ChangeEvents.PostImages.take(id);
        if (after != null && !ChangeEvents.isOperatorUpdate(query)) {
            return body.append("o", after.cloneDeeply()).append("o2", new Document("_id", id)).append("rep", true);
        }
        body.append("o", query).append("o2", new Document("_id", id));
        if (after != null) {
            body.append("ud", ChangeEvents.describe(query, after));
        }
        return body;
    }

    @Override
    public void handleDelete(String namespace, Document query, List<Object> deletedIds) {
        if (isLocal(namespace)) {
            return;
        }
        append(deletedIds.stream()
            .map(id -> body("d", namespace).append("o", new Document("_id", id)))
            .collect(Collectors.toList()));
    }

    @Override
    public void handleDropCollection(String namespace) {
        if (isLocal(namespace)) {
            return;
        }
        String databaseName = Utils.getDatabaseNameFromFullName(namespace);
        String collectionName = Utils.getCollectionNameFromFullName(namespace);
        append(List.of(body("c", databaseName + ".$cmd").append("o", new Document("drop", collectionName))));
    }

    // ---- trimming ------------------------------------------------------------------------

    private void raiseTrimmedThrough(long ts) {
        if (ts > trimmedThrough) {
            trimmedThrough = ts; // before any removal: readers check it after reading
            meta.put(TRIMMED_THROUGH, ts);
        }
    }

    /** Removes what is beyond the bounds; returns the number of entries removed. */
    long trim() {
        MVStore.TxCounter usage = store.registerVersionUsage();
        try {
            Long cutoff = null;
            long size = entries.sizeAsLong();
            if (settings.maxEntries() > 0 && size > settings.maxEntries()) {
                cutoff = entries.getKey(size - settings.maxEntries() - 1);
            }
            if (settings.maxAgeSeconds() > 0) {
                long limit = (Instant.now().getEpochSecond() - settings.maxAgeSeconds()) << 32;
                Long old = entries.lowerKey(limit);
                if (old != null && (cutoff == null || old > cutoff)) {
                    cutoff = old;
                }
            }
            if (cutoff == null) {
                return 0;
            }
            raiseTrimmedThrough(cutoff);
            long removed = 0;
            while (trimming) {
                List<Long> batch = new ArrayList<>(TRIM_BATCH);
                Iterator<Long> keys = entries.keyIterator(null);
                while (keys.hasNext() && batch.size() < TRIM_BATCH) {
                    Long key = keys.next();
                    if (key > cutoff) {
                        break;
                    }
                    batch.add(key);
                }
                if (batch.isEmpty()) {
                    break;
                }
                for (Long key : batch) {
                    entries.remove(key);
                }
                removed += batch.size();
            }
            trimmedSinceStart.addAndGet(removed);
            return removed;
        } finally {
            store.deregisterVersionUsage(usage);
        }
    }

    private volatile boolean trimming = true;
    private Thread trimmer;

    void stopTrimming() {
        trimming = false;
        Thread t = trimmer;
        if (t != null) {
            t.interrupt();
            try {
                t.join(30_000L);
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
            }
        }
    }

    void startTrimming() {
        trimmer = new Thread(() -> {
            while (trimming) {
                try {
                    Thread.sleep(Math.max(1L, settings.trimIntervalSeconds()) * 1000L);
                    long removed = trim();
                    trimmedSinceSummary += removed;
                    long now = System.currentTimeMillis();
                    if (trimmedSinceSummary > 0 && now - lastSummaryMs >= SUMMARY_EVERY_MS) {
                        System.out.println("AGGBOX-OPLOG " + Instant.now() + " trimmed " + trimmedSinceSummary
                            + " entries; " + entries.sizeAsLong() + " kept, trimmedThrough "
                            + Long.toHexString(trimmedThrough));
                        System.out.flush();
                        trimmedSinceSummary = 0;
                        lastSummaryMs = now;
                    }
                } catch (InterruptedException e) {
                    return;
                } catch (RuntimeException e) {
                    if (!trimming || store.isClosed()) {
                        return;
                    }
                    if (StorageErrors.is(e)) {
                        StorageErrors.report("oplog trim", e);
                    } else {
                        e.printStackTrace();
                    }
                }
            }
        }, "aggbox-oplog-trim");
        trimmer.setDaemon(true);
        trimmer.start();
    }

    void appendStats(Document stats) {
        Long first = entries.firstKey();
        Long last = entries.lastKey();
        stats.append("entries", entries.sizeAsLong())
            .append("firstTs", first == null ? null : new BsonTimestamp(first))
            .append("lastTs", last == null ? null : new BsonTimestamp(last))
            .append("trimmedThrough", new BsonTimestamp(trimmedThrough))
            .append("trimmedSinceStart", trimmedSinceStart.get())
            .append("maxEntries", settings.maxEntries())
            .append("maxAgeSeconds", settings.maxAgeSeconds());
    }

    // ---- reading -------------------------------------------------------------------------

    /**
     * The postBatchResumeToken MongoDB sends with every change-stream batch (since 4.0.7):
     * the point the stream has read to, past the events its pipeline filtered out. A reader
     * resumes there; pymongo's resume_token is this token once the batch's last event was
     * returned, which tells a reader that nothing more is buffered (the dispatcher publishes
     * a batch as soon as the server's batch ends instead of reading on). The token of a
     * batch that went through to the end of the oplog is marked ("hw": the high-water mark,
     * distinct from its last event's own token even where their position is the same); one
     * cut by the batch size is the last event's token (more follow).
     */
    static Document postBatchToken(long position, boolean complete) {
        Document token = new Document("_data", Long.toHexString(position));
        return complete ? token.append("hw", true) : token;
    }

    /**
     * The operationTime a replica set member puts in its replies: the time of the last
     * operation in the oplog (the current second's start when there is none). aggbox adds
     * it to ping replies, where clients read the server's position (a reader that opens a
     * change stream knows that every event after it is newer than its open). Without it,
     * the server's localTime rounded to the second was all a client had.
     */
    BsonTimestamp operationTime() {
        synchronized (appendLock) {
            return new BsonTimestamp(lastTs > 0 ? lastTs : Instant.now().getEpochSecond() << 32);
        }
    }

    /** Adds the cursor's postBatchResumeToken to a change stream's aggregate or getMore
     * reply (mongo-java-server sends none). */
    void addPostBatchResumeToken(Document reply) {
        if (!(reply.get("cursor") instanceof Document cursor) || !(cursor.get("id") instanceof Number id)
            || id.longValue() == 0) {
            return;
        }
        Object open;
        try {
            open = cursorRegistry.getCursor(id.longValue());
        } catch (MongoServerError e) { // closed meanwhile
            return;
        }
        if (open instanceof StreamCursor stream && stream.batchToken != null) {
            cursor.put("postBatchResumeToken", stream.batchToken);
        }
    }

    private static MongoServerError historyLost(String what) {
        return new MongoServerError(CHANGE_STREAM_HISTORY_LOST, "ChangeStreamHistoryLost",
            "Resume of change stream was not possible, as the resume point may no longer be in the oplog ("
                + what + ")");
    }

    private static long tokenTs(Document token) {
        Object data = token.get("_data");
        if (!(data instanceof String)) {
            throw new MongoServerError(260, "InvalidResumeToken", "invalid resume token: " + token);
        }
        try {
            return Long.parseUnsignedLong((String) data, 16);
        } catch (NumberFormatException e) {
            throw new MongoServerError(260, "InvalidResumeToken", "invalid resume token: " + token);
        }
    }

    @Override
    public Cursor createCursor(Document changeStreamDocument, String namespace, Aggregation aggregation) {
        Document startAfter = (Document) changeStreamDocument.get("startAfter");
        Document resumeAfter = (Document) changeStreamDocument.get("resumeAfter");
        BsonTimestamp startAtOperationTime = (BsonTimestamp) changeStreamDocument.get("startAtOperationTime");
        long after; // the stream returns the entries with ts > after
        if (startAfter != null || resumeAfter != null) {
            after = tokenTs(startAfter != null ? startAfter : resumeAfter);
            if (after < trimmedThrough) {
                throw historyLost("resume token " + Long.toHexString(after) + ", oplog trimmed through "
                    + Long.toHexString(trimmedThrough));
            }
            if (resumeAfter != null && startAfter == null && droppedAt(namespace, after)) {
                return invalidated(after);
            }
        } else if (startAtOperationTime != null) {
            after = startAtOperationTime.getValue() - 1; // inclusive
            if (after < trimmedThrough) {
                throw historyLost("startAtOperationTime " + Long.toHexString(startAtOperationTime.getValue())
                    + ", oplog trimmed through " + Long.toHexString(trimmedThrough));
            }
        } else {
            synchronized (appendLock) {
                after = lastTs;
            }
        }
        ChangeEvents.fastExclusions(aggregation);
        StreamCursor cursor = new StreamCursor(cursorRegistry.generateCursorId(), changeStreamDocument,
            namespace, aggregation, after);
        cursorRegistry.add(cursor);
        return cursor;
    }

    /**
     * Resuming after the drop of the watched collection (the token is that event's)
     * invalidates the stream. (CollectionBackedOplog looked for a drop anywhere up to the
     * token, reading the whole oplog, and so invalidated every resume on a collection once
     * dropped and created again.)
     */
    private boolean droppedAt(String namespace, long ts) {
        Document entry = entries.get(ts);
        if (entry == null) {
            return false;
        }
        String databaseName = Utils.getDatabaseNameFromFullName(namespace);
        String collectionName = Utils.getCollectionNameFromFullName(namespace);
        return "c".equals(entry.get("op")) && (databaseName + ".$cmd").equals(entry.get("ns"))
            && new Document("drop", collectionName).equals(entry.get("o"));
    }

    private Cursor invalidated(long after) {
        // mongo-java-server's InvalidateOplogCursor, with our token format
        return new AbstractCursor(cursorRegistry.generateCursorId()) {
            @Override
            public boolean isEmpty() {
                return false;
            }

            @Override
            public List<Document> takeDocuments(int numberToReturn) {
                return List.of(new Document("_id", new Document("_data", Long.toHexString(after)))
                    .append("operationType", "invalidate"));
            }
        };
    }

    private Iterator<Map.Entry<Long, Document>> entryIterator(long from) {
        org.h2.mvstore.Cursor<Long, Document> cursor = entries.cursor(from);
        return new Iterator<>() {
            @Override
            public boolean hasNext() {
                return cursor.hasNext();
            }

            @Override
            public Map.Entry<Long, Document> next() {
                if (!cursor.hasNext()) {
                    throw new NoSuchElementException();
                }
                Long key = cursor.next();
                return Map.entry(key, cursor.getValue());
            }
        };
    }

    private static boolean matchesNamespace(Document entry, String namespace) {
        String ns = (String) entry.get("ns");
        if (ns.equals(namespace)) {
            return true;
        }
        return Utils.getDatabaseNameFromFullName(namespace).equals(Utils.getDatabaseNameFromFullName(ns))
            && Utils.getCollectionNameFromFullName(ns).equals("$cmd");
    }

    /** A change stream's cursor: each batch is a range read of the entries after its position. */
    private final class StreamCursor extends AbstractCursor {
        private final Document changeStreamDocument;
        private final String namespace;
        private final Aggregation aggregation;
        private long position;
        /** The postBatchResumeToken of the last batch (see postBatchResumeToken). */
        private volatile Document batchToken;

        StreamCursor(long id, Document changeStreamDocument, String namespace, Aggregation aggregation, long after) {
            super(id);
            this.changeStreamDocument = changeStreamDocument;
            this.namespace = namespace;
            this.aggregation = aggregation;
            this.position = after;
        }

        @Override
        public boolean isEmpty() {
            return false;
        }

        @Override
        public synchronized List<Document> takeDocuments(int numberToReturn) {
            long[] scanned = {position};
            Iterator<Map.Entry<Long, Document>> source = entryIterator(position == Long.MAX_VALUE ? position : position + 1);
            Stream<Document> raw = StreamSupport.stream(
                    Spliterators.spliteratorUnknownSize(source, Spliterator.ORDERED | Spliterator.NONNULL), false)
                .peek(e -> scanned[0] = e.getKey())
                .map(Map.Entry::getValue)
                .filter(entry -> matchesNamespace(entry, namespace))
                .map(this::toChangeEvent);
            Stream<Document> events = aggregation.runStagesAsStream(raw);
            if (numberToReturn > 0) {
                events = events.limit(numberToReturn);
            }
            List<Document> documents = events.collect(Collectors.toList());
            if (position < trimmedThrough) {
                // entries after our position were removed while we were not looking
                cursorRegistry.remove(this);
                throw historyLost("getMore at " + Long.toHexString(position) + ", oplog trimmed through "
                    + Long.toHexString(trimmedThrough));
            }
            if (!documents.isEmpty()) {
                position = tokenTs((Document) documents.get(documents.size() - 1).get("_id"));
            }
            boolean complete = numberToReturn <= 0 || documents.size() < numberToReturn;
            if (complete) {
                // the read went through to the end: the entries scanned and not returned were
                // filtered out by the namespace or the pipeline; do not scan them again
                position = Math.max(position, scanned[0]);
            }
            batchToken = postBatchToken(position, complete);
            return documents;
        }

        private Document toChangeEvent(Document entry) {
            String op = (String) entry.get("op");
            BsonTimestamp ts = (BsonTimestamp) entry.get("ts");
            Document id = new Document("_data", Long.toHexString(ts.getValue()));
            Document o = (Document) entry.get("o");
            switch (op) {
                case "i":
                    return new Document("_id", id)
                        .append("operationType", "insert")
                        .append("fullDocument", o)
                        .append("documentKey", new Document("_id", o.get("_id")))
                        .append("clusterTime", ts);
                case "u":
                    if (Boolean.TRUE.equals(entry.get("rep"))) {
                        return new Document("_id", id)
                            .append("operationType", "replace")
                            .append("clusterTime", ts)
                            .append("wallTime", entry.get("wall"))
                            .append("ns", ns(entry))
                            .append("documentKey", entry.get("o2"))
                            .append("fullDocument", o);
                    }
                    if (entry.get("ud") instanceof Document description) {
                        // as MongoDB: the _id as documentKey, the update description, and the
                        // document only when asked for (updateLookup)
                        Document event = new Document("_id", id)
                            .append("operationType", "update")
                            .append("clusterTime", ts)
                            .append("wallTime", entry.get("wall"))
                            .append("ns", ns(entry))
                            .append("documentKey", entry.get("o2"))
                            .append("updateDescription", description);
                        if ("updateLookup".equals(changeStreamDocument.get("fullDocument"))) {
                            event.append("fullDocument", lookUp(entry));
                        }
                        return event;
                    }
                    // an entry without a description (written by an earlier launcher): as
                    // mongo-java-server's own events, with the _id as documentKey
                    return new Document("_id", id)
                        .append("operationType", "update")
                        .append("fullDocument", lookUp(entry))
                        .append("documentKey", entry.get("o2"))
                        .append("clusterTime", ts);
                case "d":
                    return new Document("_id", id)
                        .append("operationType", "delete")
                        .append("fullDocument", null)
                        .append("documentKey", o)
                        .append("clusterTime", ts);
                case "c":
                    return new Document("_id", id)
                        .append("operationType", o.keySet().iterator().next())
                        .append("clusterTime", ts);
                default:
                    throw new IllegalArgumentException("unexpected oplog operation: " + op);
            }
        }

        private Document ns(Document entry) {
            String ns = (String) entry.get("ns");
            return new Document("db", Utils.getDatabaseNameFromFullName(ns))
                .append("coll", Utils.getCollectionNameFromFullName(ns));
        }

        private Document lookUp(Document entry) {
            Document update = (Document) entry.get("o");
            Document delta = new Document();
            if (update.get("$set") instanceof Document) {
                delta.putAll((Document) update.get("$set"));
            }
            if (update.get("$unset") instanceof Document) {
                delta.putAll((Document) update.get("$unset"));
            }
            if (!"updateLookup".equals(changeStreamDocument.get("fullDocument"))) {
                return delta;
            }
            String ns = (String) entry.get("ns");
            MongoCollection<?> collection = backend.resolveDatabase(Utils.getDatabaseNameFromFullName(ns))
                .resolveCollection(Utils.getCollectionNameFromFullName(ns), false);
            if (collection == null) {
                return delta;
            }
            Object id = ((Document) entry.get("o2")).get("_id");
            // {_id: id} is answered from the _id index (the stock oplog scanned the collection)
            for (Document found : collection.handleQuery(new Document("_id", id))) {
                return found;
            }
            return delta;
        }
    }
}
