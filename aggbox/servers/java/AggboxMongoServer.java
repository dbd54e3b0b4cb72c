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
 *   unless --ignore-stdin is given, and on SIGTERM/SIGINT (JVM shutdown hook);
 * - its oplog (TimestampOplog below) keeps the entries in a map ordered by timestamp, so a
 *   change-stream read is a range read from the stream's position and an updateLookup goes
 *   through the _id index, and its change events are MongoDB's: the _id as documentKey, an
 *   update's updateDescription (from the update's operators and the document it left,
 *   kept by the collection while it applies the update: Describe and Collection below), a
 *   replacement as a "replace" event with its document, ns and wallTime. mongo-java-server's
 *   own oplog (CollectionBackedOplog) reads its whole collection per getMore, scans the
 *   watched collection per updateLookup, and its update events carry neither an
 *   updateDescription nor the _id (their documentKey is the update). With the system
 *   property aggbox.mjs.stockChangeEvents=true (a JVM option) the stock oplog and events are
 *   kept: tests of the dispatcher's fallback for such a server use it.
 *
 * Compiled once by aggbox.servers.maven.compile_java and cached.
 */

import de.bwaldvogel.mongo.MongoCollection;
import de.bwaldvogel.mongo.MongoDatabase;
import de.bwaldvogel.mongo.MongoServer;
import de.bwaldvogel.mongo.MongoVersion;
import de.bwaldvogel.mongo.backend.AbstractCursor;
import de.bwaldvogel.mongo.backend.ArrayFilters;
import de.bwaldvogel.mongo.backend.CollectionOptions;
import de.bwaldvogel.mongo.backend.Cursor;
import de.bwaldvogel.mongo.backend.CursorRegistry;
import de.bwaldvogel.mongo.backend.Utils;
import de.bwaldvogel.mongo.backend.aggregation.Aggregation;
import de.bwaldvogel.mongo.backend.aggregation.stage.AggregationStage;
import de.bwaldvogel.mongo.backend.aggregation.stage.ProjectStage;
import de.bwaldvogel.mongo.backend.memory.MemoryBackend;
import de.bwaldvogel.mongo.backend.memory.MemoryCollection;
import de.bwaldvogel.mongo.backend.memory.MemoryDatabase;
import de.bwaldvogel.mongo.bson.BsonTimestamp;
import de.bwaldvogel.mongo.bson.Document;
import de.bwaldvogel.mongo.exception.MongoServerError;
import de.bwaldvogel.mongo.oplog.Oplog;

import io.netty.channel.Channel;

import java.time.Instant;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.Iterator;
import java.util.List;
import java.util.Map;
import java.util.Spliterator;
import java.util.Spliterators;
import java.util.UUID;
import java.util.concurrent.ConcurrentNavigableMap;
import java.util.concurrent.ConcurrentSkipListMap;
import java.util.stream.Collectors;
import java.util.stream.Stream;
import java.util.stream.StreamSupport;

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

    /** The in-memory backend with aggbox's databases and oplog (see the file's comment). */
    private static final class Backend extends MemoryBackend {
        @Override
        public MemoryDatabase openOrCreateDatabase(String databaseName) {
            return new Database(databaseName, getCursorRegistry());
        }

        @Override
        protected Oplog createOplog() {
            return new TimestampOplog(this, getCursorRegistry());
        }

        /** A change stream's aggregate and getMore replies get their postBatchResumeToken
         * (TimestampOplog.postBatchToken). */
        @Override
        public Document handleCommand(Channel channel, String databaseName, String command, Document query) {
            Document reply = super.handleCommand(channel, databaseName, command, query);
            if ("ping".equalsIgnoreCase(command) && oplog instanceof TimestampOplog timestamps) {
                reply.put("operationTime", timestamps.operationTime()); // as a replica set member
                return reply;
            }
            if (("getMore".equals(command) || "aggregate".equals(command)) && reply.get("cursor") instanceof Document cursor
                && cursor.get("id") instanceof Number id && id.longValue() != 0) {
                Object open;
                try {
                    open = getCursorRegistry().getCursor(id.longValue());
                } catch (MongoServerError e) { // closed meanwhile
                    return reply;
                }
                if (open instanceof TimestampOplog.StreamCursor stream && stream.batchToken != null) {
                    cursor.put("postBatchResumeToken", stream.batchToken);
                }
            }
            return reply;
        }
    }

    private static final class Database extends MemoryDatabase {
        Database(String databaseName, CursorRegistry cursorRegistry) {
            super(databaseName, cursorRegistry);
        }

        @Override
        protected MemoryCollection openOrCreateCollection(String collectionName, CollectionOptions options) {
            return new Collection(this, collectionName, options, cursorRegistry);
        }
    }

    /** MemoryCollection keeping the document each update leaves, for the oplog. */
    private static final class Collection extends MemoryCollection {
        Collection(MongoDatabase database, String name, CollectionOptions options, CursorRegistry cursorRegistry) {
            super(database, name, options, cursorRegistry);
        }

        @Override
        public synchronized Document updateDocuments(Document selector, Document update, ArrayFilters arrayFilters,
                                                     boolean multi, boolean upsert, Oplog oplog) {
            POST_IMAGES.get().clear();
            try {
                return super.updateDocuments(selector, update, arrayFilters, multi, upsert, oplog);
            } finally {
                POST_IMAGES.get().clear();
            }
        }

        @Override
        protected void handleUpdate(Integer position, Document oldDocument, Document newDocument) {
            super.handleUpdate(position, oldDocument, newDocument);
            Object id = newDocument.get("_id");
            if (id != null) {
                POST_IMAGES.get().put(id, newDocument);
            }
        }
    }

    /** The documents the current request's updates left, by _id (per thread). */
    private static final ThreadLocal<Map<Object, Document>> POST_IMAGES = ThreadLocal.withInitial(HashMap::new);

    public static void main(String[] args) throws Exception {
        if (args.length < 1) {
            System.err.println("usage: AggboxMongoServer <port> [--ignore-stdin] [--no-oplog]");
            System.exit(2);
        }
        int port = Integer.parseInt(args[0]);
        List<String> options = List.of(args).subList(1, args.length);
        boolean watchStdin = !options.contains("--ignore-stdin");
        boolean oplog = !options.contains("--no-oplog");

        boolean stock = Boolean.getBoolean("aggbox.mjs.stockChangeEvents");
        MemoryBackend backend = !oplog ? new NoOplogBackend() : stock ? new MemoryBackend() : new Backend();
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

    /**
     * The oplog: entries in a map keyed by their timestamp (seconds << 32 | increment, unique
     * and increasing), appended under one lock; a stream's read is a range read after its
     * position; its resume tokens are {_data: hex of ts}. Entries: as mongo-java-server's
     * (ts, op, ns, o, o2, wall), plus "ud" (an update's description) and "rep" (a
     * replacement, "o" its document). Not bounded: the server lives for one test session or
     * one command.
     */
    static final class TimestampOplog implements Oplog {
        private final MemoryBackend backend;
        private final CursorRegistry cursorRegistry;
        private final ConcurrentSkipListMap<Long, Document> entries = new ConcurrentSkipListMap<>();
        private final UUID ui = UUID.randomUUID();
        private long lastTs;

        TimestampOplog(MemoryBackend backend, CursorRegistry cursorRegistry) {
            this.backend = backend;
            this.cursorRegistry = cursorRegistry;
        }

        /** The time of the last operation (h2server/BoundedOplog.operationTime). */
        synchronized BsonTimestamp operationTime() {
            return new BsonTimestamp(lastTs > 0 ? lastTs : Instant.now().getEpochSecond() << 32);
        }

        private synchronized void append(List<Document> bodies) {
            for (Document body : bodies) {
                long candidate = (Instant.now().getEpochSecond() << 32) | 1L;
                lastTs = Math.max(candidate, lastTs + 1);
                Document entry = new Document("ts", new BsonTimestamp(lastTs)).append("t", 1L).append("h", 0L)
                    .append("v", 2L);
                entry.putAll(body);
                entry.append("ui", ui).append("wall", Instant.now());
                entries.put(lastTs, entry);
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
            if (!isLocal(namespace)) {
                append(documents.stream().map(d -> body("i", namespace).append("o", d.cloneDeeply()))
                    .collect(Collectors.toList()));
            }
        }

        @Override
        public void handleUpdate(String namespace, Document selector, Document query, List<Object> modifiedIds) {
            if (isLocal(namespace)) {
                return;
            }
            List<Document> bodies = new ArrayList<>();
            for (Object id : modifiedIds) {
                Document body = body("u", namespace);
                Document after = POST_IMAGES.get().remove(id);
                if (after != null && !Describe.isOperatorUpdate(query)) {
                    body.append("o", after.cloneDeeply()).append("o2", new Document("_id", id)).append("rep", true);
                } else {
                    body.append("o", query).append("o2", new Document("_id", id));
                    if (after != null) {
                        body.append("ud", Describe.update(query, after));
                    }
                }
                bodies.add(body);
            }
            append(bodies);
        }

        @Override
        public void handleDelete(String namespace, Document query, List<Object> deletedIds) {
            if (!isLocal(namespace)) {
                append(deletedIds.stream().map(id -> body("d", namespace).append("o", new Document("_id", id)))
                    .collect(Collectors.toList()));
            }
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
            BsonTimestamp startAt = (BsonTimestamp) changeStreamDocument.get("startAtOperationTime");
            long after;
            if (startAfter != null || resumeAfter != null) {
                after = tokenTs(startAfter != null ? startAfter : resumeAfter);
                if (resumeAfter != null && startAfter == null && droppedAt(namespace, after)) {
                    long at = after;
                    return new AbstractCursor(cursorRegistry.generateCursorId()) {
                        @Override
                        public boolean isEmpty() {
                            return false;
                        }

                        @Override
                        public List<Document> takeDocuments(int numberToReturn) {
                            return List.of(new Document("_id", new Document("_data", Long.toHexString(at)))
                                .append("operationType", "invalidate"));
                        }
                    };
                }
            } else if (startAt != null) {
                after = startAt.getValue() - 1;
            } else {
                synchronized (this) {
                    after = lastTs;
                }
            }
            fastExclusions(aggregation);
            StreamCursor cursor = new StreamCursor(cursorRegistry.generateCursorId(), changeStreamDocument, namespace,
                aggregation, after);
            cursorRegistry.add(cursor);
            return cursor;
        }

        private boolean droppedAt(String namespace, long ts) {
            Document entry = entries.get(ts);
            return entry != null && "c".equals(entry.get("op"))
                && (Utils.getDatabaseNameFromFullName(namespace) + ".$cmd").equals(entry.get("ns"))
                && new Document("drop", Utils.getCollectionNameFromFullName(namespace)).equals(entry.get("o"));
        }

        private static boolean matchesNamespace(Document entry, String namespace) {
            String ns = (String) entry.get("ns");
            return ns.equals(namespace)
                || Utils.getDatabaseNameFromFullName(namespace).equals(Utils.getDatabaseNameFromFullName(ns))
                && Utils.getCollectionNameFromFullName(ns).equals("$cmd");
        }

        /**
         * The postBatchResumeToken MongoDB sends with every change-stream batch: where the
         * stream has read to, past the events its pipeline filtered out (the same as
         * h2server/BoundedOplog.java: marked "hw" when the batch went through to the end of
         * the oplog, so it differs from its last event's token; the last event's token when
         * the batch size cut it).
         */
        static Document postBatchToken(long position, boolean complete) {
            Document token = new Document("_data", Long.toHexString(position));
            return complete ? token.append("hw", true) : token;
        }

        final class StreamCursor extends AbstractCursor {
            private final Document changeStreamDocument;
            private final String namespace;
            private final Aggregation aggregation;
            private long position;
            volatile Document batchToken;

            StreamCursor(long id, Document changeStreamDocument, String namespace, Aggregation aggregation,
                         long after) {
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
                ConcurrentNavigableMap<Long, Document> tail = entries.tailMap(position, false);
                Iterator<Map.Entry<Long, Document>> source = tail.entrySet().iterator();
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
                if (!documents.isEmpty()) {
                    position = tokenTs((Document) documents.get(documents.size() - 1).get("_id"));
                }
                boolean complete = numberToReturn <= 0 || documents.size() < numberToReturn;
                if (complete) {
                    position = Math.max(position, scanned[0]); // filtered out: not scanned again
                }
                batchToken = postBatchToken(position, complete);
                return documents;
            }

            private Document toChangeEvent(Document entry) {
                String op = (String) entry.get("op");
                BsonTimestamp ts = (BsonTimestamp) entry.get("ts");
                Document id = new Document("_data", Long.toHexString(ts.getValue()));
                Document o = (Document) entry.get("o");
                String ns = (String) entry.get("ns");
                Document nsDoc = new Document("db", Utils.getDatabaseNameFromFullName(ns))
                    .append("coll", Utils.getCollectionNameFromFullName(ns));
                Document event = new Document("_id", id);
                switch (op) {
                    case "i":
                        return event.append("operationType", "insert").append("clusterTime", ts)
                            .append("wallTime", entry.get("wall")).append("ns", nsDoc)
                            .append("documentKey", new Document("_id", o.get("_id"))).append("fullDocument", o);
                    case "u":
                        if (Boolean.TRUE.equals(entry.get("rep"))) {
                            return event.append("operationType", "replace").append("clusterTime", ts)
                                .append("wallTime", entry.get("wall")).append("ns", nsDoc)
                                .append("documentKey", entry.get("o2")).append("fullDocument", o);
                        }
                        event.append("operationType", "update").append("clusterTime", ts)
                            .append("wallTime", entry.get("wall")).append("ns", nsDoc)
                            .append("documentKey", entry.get("o2"));
                        if (entry.get("ud") != null) {
                            event.append("updateDescription", entry.get("ud"));
                        }
                        if ("updateLookup".equals(changeStreamDocument.get("fullDocument"))) {
                            event.append("fullDocument", lookUp(entry));
                        }
                        return event;
                    case "d":
                        return event.append("operationType", "delete").append("clusterTime", ts)
                            .append("wallTime", entry.get("wall")).append("ns", nsDoc).append("documentKey", o);
                    case "c":
                        return event.append("operationType", o.keySet().iterator().next()).append("clusterTime", ts);
                    default:
                        throw new IllegalArgumentException("unexpected oplog operation: " + op);
                }
            }

            /** The document now, through the _id index (null when it is gone, as on MongoDB). */
            private Document lookUp(Document entry) {
                String ns = (String) entry.get("ns");
                MongoCollection<?> collection = backend.resolveDatabase(Utils.getDatabaseNameFromFullName(ns))
                    .resolveCollection(Utils.getCollectionNameFromFullName(ns), false);
                if (collection == null) {
                    return null;
                }
                Object id = ((Document) entry.get("o2")).get("_id");
                for (Document found : collection.handleQuery(new Document("_id", id))) {
                    return found;
                }
                return null;
            }
        }
    }


    /**
     * mongo-java-server's $project evaluates every dotted path with regular expressions
     * (Utils.getSubkey calls String.matches twice per path and document) and deep-copies the
     * document: the exclusion of a few fields of aggbox's change events cost about 0.3 ms of
     * server CPU per event (issue 42, JFR). A change stream's exclusion-only $project (every
     * value 0 or false, no "$" in a path) runs here instead, with MongoDB's result: each path
     * removed where it exists (from each document of an array on its way), the events the
     * oplog keeps untouched (what a path goes through is copied, not changed).
     */
    private static void fastExclusions(Aggregation aggregation) {
        List<AggregationStage> stages = aggregation.getStages();
        for (int i = 0; i < stages.size(); i++) {
            if (stages.get(i) instanceof ProjectStage project) {
                List<String[]> paths = exclusionPaths(project);
                if (paths != null) {
                    try {
                        stages.set(i, new ExclusionStage(paths));
                    } catch (UnsupportedOperationException e) {
                        return; // an unmodifiable list: mongo-java-server's own stage stays
                    }
                }
            }
        }
    }

    private static List<String[]> exclusionPaths(ProjectStage project) {
        Object projection;
        try {
            java.lang.reflect.Field field = ProjectStage.class.getDeclaredField("projection");
            field.setAccessible(true);
            projection = field.get(project);
        } catch (ReflectiveOperationException | RuntimeException e) {
            return null;
        }
        if (!(projection instanceof Document spec) || spec.isEmpty()) {
            return null;
        }
        List<String[]> paths = new ArrayList<>();
        for (Map.Entry<String, Object> entry : spec.entrySet()) {
            Object value = entry.getValue();
            boolean excluded = Boolean.FALSE.equals(value) || value instanceof Number number && number.doubleValue() == 0;
            if (!excluded || entry.getKey().contains("$") || entry.getKey().equals("_id") || entry.getKey().isEmpty()) {
                return null;
            }
            paths.add(entry.getKey().split("\\.", -1));
        }
        return paths;
    }

    private static final class ExclusionStage implements AggregationStage {
        private final List<String[]> paths;

        ExclusionStage(List<String[]> paths) {
            this.paths = paths;
        }

        @Override
        public String name() {
            return "$project";
        }

        @Override
        public Stream<Document> apply(Stream<Document> stream) {
            return stream.map(this::exclude);
        }

        private Document exclude(Document document) {
            Document out = new Document(document);
            for (String[] path : paths) {
                remove(out, path, 0);
            }
            return out;
        }

        /** Removes path[i..] from doc, a copy of our own; copies what it goes through. */
        private static void remove(Document doc, String[] path, int i) {
            if (!doc.containsKey(path[i])) {
                return;
            }
            if (i == path.length - 1) {
                doc.remove(path[i]);
                return;
            }
            Object child = doc.get(path[i]);
            if (child instanceof Document inner) {
                Document copy = new Document(inner);
                remove(copy, path, i + 1);
                doc.put(path[i], copy);
            } else if (child instanceof List<?> list) {
                List<Object> copy = new ArrayList<>(list.size());
                for (Object item : list) {
                    if (item instanceof Document inner) {
                        Document itemCopy = new Document(inner);
                        remove(itemCopy, path, i + 1);
                        copy.add(itemCopy);
                    } else {
                        copy.add(item);
                    }
                }
                doc.put(path[i], copy);
            }
        }
    }

    /**
     * MongoDB's updateDescription of an update of operators, from the document it left (the
     * same rules as h2server/ChangeEvents.java, which says why): $set and friends the new
     * value at the path, $unset a removed field, a $push of $each items (or one value) onto an
     * existing array its new elements as "path.index", anything else on an array the whole
     * array, a positional path or an unknown operator its whole top-level field.
     */
    private static final class Describe {
        private static final Object MISSING = new Object();

        static boolean isOperatorUpdate(Document update) {
            for (String key : update.keySet()) {
                return key.startsWith("$");
            }
            return false;
        }

        static Document update(Document update, Document after) {
            Document updated = new Document();
            List<String> removed = new ArrayList<>();
            for (Map.Entry<String, Object> op : update.entrySet()) {
                if (!(op.getValue() instanceof Document spec)) {
                    continue;
                }
                for (Map.Entry<String, Object> field : spec.entrySet()) {
                    String path = field.getKey();
                    String operator = op.getKey();
                    if (path.contains(".$") || path.startsWith("$")) {
                        if (!path.startsWith("$")) {
                            put(updated, removed, path.split("\\.", 2)[0], after);
                        }
                    } else if (operator.equals("$setOnInsert")) {
                        continue;
                    } else if (operator.equals("$unset")) {
                        removed.add(path);
                    } else if (operator.equals("$rename")) {
                        removed.add(path);
                        if (field.getValue() instanceof String to) {
                            put(updated, removed, to, after);
                        }
                    } else if (operator.equals("$push")) {
                        push(path, field.getValue(), after, updated, removed);
                    } else if (List.of("$set", "$inc", "$mul", "$min", "$max", "$currentDate", "$bit", "$addToSet",
                        "$pull", "$pullAll", "$pop").contains(operator)) {
                        put(updated, removed, path, after);
                    } else {
                        put(updated, removed, path.split("\\.", 2)[0], after);
                    }
                }
            }
            return new Document("updatedFields", updated).append("removedFields", removed)
                .append("truncatedArrays", new ArrayList<>());
        }

        private static void push(String path, Object spec, Document after, Document updated, List<String> removed) {
            Object now = valueAt(after, path);
            if (!(now instanceof List<?> array)) {
                put(updated, removed, path, after);
                return;
            }
            int pushed = 1;
            if (spec instanceof Document modifiers && modifiers.containsKey("$each")) {
                if (modifiers.size() != 1 || !(modifiers.get("$each") instanceof List<?> each)) {
                    updated.put(path, copy(array));
                    return;
                }
                pushed = each.size();
            }
            int before = array.size() - pushed;
            if (before <= 0) {
                updated.put(path, copy(array));
                return;
            }
            for (int i = before; i < array.size(); i++) {
                updated.put(path + "." + i, copy(array.get(i)));
            }
        }

        private static void put(Document updated, List<String> removed, String path, Document after) {
            Object value = valueAt(after, path);
            if (value == MISSING) {
                removed.add(path);
            } else {
                updated.put(path, copy(value));
            }
        }

        private static Object valueAt(Document doc, String path) {
            Object current = doc;
            for (String part : path.split("\\.")) {
                if (current instanceof Document d) {
                    if (!d.containsKey(part)) {
                        return MISSING;
                    }
                    current = d.get(part);
                } else if (current instanceof List<?> list) {
                    int index;
                    try {
                        index = Integer.parseInt(part);
                    } catch (NumberFormatException e) {
                        return MISSING;
                    }
                    if (index < 0 || index >= list.size()) {
                        return MISSING;
                    }
                    current = list.get(index);
                } else {
                    return MISSING;
                }
            }
            return current;
        }

        private static Object copy(Object value) {
            if (value instanceof Document d) {
                return d.cloneDeeply();
            }
            if (value instanceof List<?> list) {
                List<Object> out = new ArrayList<>(list.size());
                for (Object item : list) {
                    out.add(copy(item));
                }
                return out;
            }
            return value;
        }
    }
}
