/* The local server's databases: index keys compared without serializing them again, and
 * the post-image of every update kept for its change event. See AggboxMongoH2Server.java
 * and docs/design.md "The local server". */

import de.bwaldvogel.mongo.MongoCollection;
import de.bwaldvogel.mongo.backend.ArrayFilters;
import de.bwaldvogel.mongo.backend.CollectionOptions;
import de.bwaldvogel.mongo.backend.CursorRegistry;
import de.bwaldvogel.mongo.backend.Index;
import de.bwaldvogel.mongo.backend.IndexKey;
import de.bwaldvogel.mongo.backend.KeyValue;
import de.bwaldvogel.mongo.backend.h2.H2Collection;
import de.bwaldvogel.mongo.backend.h2.H2Database;
import de.bwaldvogel.mongo.bson.Document;
import de.bwaldvogel.mongo.oplog.Oplog;

import org.h2.mvstore.MVMap;
import org.h2.mvstore.MVStore;
import org.h2.mvstore.type.ObjectDataType;

import java.util.IdentityHashMap;
import java.util.List;

/**
 * H2Database with two changes:
 *
 * 1. Index maps compare their keys (mongo-java-server's KeyValue) through IndexKeyType.
 *    H2's ObjectDataType orders objects of a class it does not know by their Java
 *    serialization: every comparison of a B-tree search serialized both keys again
 *    (ObjectOutputStream). Under the dispatcher benchmark's load that was half of the
 *    server's CPU (issue 42: JFR samples in SerializedObjectType.compare and serialize, from
 *    every _id lookup, update and insert). IndexKeyType orders them exactly so — by the same
 *    serialized bytes, so the maps already in a data file keep their order and their format
 *    — but serializes each key object once: the bytes are remembered per object (the search
 *    key of one lookup, and the keys of the pages H2 keeps in its cache).
 * 2. Its collections keep the document each update leaves (ChangeEvents.PostImages), from
 *    which the oplog writes the event's updateDescription.
 *
 * The maps are opened here before H2Database opens them (MVStore returns an open map as it
 * is), under the names H2Database gives them.
 */
final class AggboxH2Database extends H2Database {

    /** The store of the databases: set before the backend opens any (H2Database's constructor
     * opens the existing collections and indexes, before a subclass's fields are set). */
    private static volatile MVStore store;

    static MVStore use(MVStore mvStore) {
        store = mvStore;
        return mvStore;
    }

    AggboxH2Database(String databaseName, MVStore mvStore, CursorRegistry cursorRegistry) {
        super(databaseName, mvStore, cursorRegistry);
    }

    @Override
    protected Index<Object> openOrCreateUniqueIndex(String collectionName, String indexName, List<IndexKey> keys,
                                                    boolean sparse) {
        store.openMap(getFullCollectionNamespace(collectionName) + "._index_" + indexName,
            new MVMap.Builder<KeyValue, Object>().keyType(IndexKeyType.INSTANCE));
        return super.openOrCreateUniqueIndex(collectionName, indexName, keys, sparse);
    }

    @Override
    protected MongoCollection<Object> openOrCreateCollection(String collectionName, CollectionOptions options) {
        String fullName = getFullCollectionNamespace(collectionName);
        MVMap<Object, Document> dataMap = store.openMap("databases." + fullName);
        MVMap<String, Object> metaMap = store.openMap("meta." + fullName);
        return new Collection(this, collectionName, options, dataMap, metaMap, cursorRegistry);
    }

    /** H2Collection keeping the post-image of each update for the oplog. */
    static final class Collection extends H2Collection {
        Collection(H2Database database, String name, CollectionOptions options, MVMap<Object, Document> dataMap,
                   MVMap<String, Object> metaMap, CursorRegistry cursorRegistry) {
            super(database, name, options, dataMap, metaMap, cursorRegistry);
        }

        @Override
        public synchronized Document updateDocuments(Document selector, Document update, ArrayFilters arrayFilters,
                                                     boolean multi, boolean upsert, Oplog oplog) {
            ChangeEvents.PostImages.clear();
            try {
                return super.updateDocuments(selector, update, arrayFilters, multi, upsert, oplog);
            } finally {
                ChangeEvents.PostImages.clear();
            }
        }

        @Override
        protected void handleUpdate(Object position, Document oldDocument, Document newDocument) {
            super.handleUpdate(position, oldDocument, newDocument);
            ChangeEvents.PostImages.put(newDocument);
        }
    }

    /** ObjectDataType whose order of two KeyValues is ObjectDataType's own (their serialized
     * bytes), each key serialized once. */
    static final class IndexKeyType extends ObjectDataType {
        static final IndexKeyType INSTANCE = new IndexKeyType();
        private static final int REMEMBERED = 1 << 15;
        private static final ThreadLocal<IdentityHashMap<Object, byte[]>> BYTES =
            ThreadLocal.withInitial(IdentityHashMap::new);

        @Override
        public int compare(Object a, Object b) {
            if (a == b) {
                return 0;
            }
            if (a instanceof KeyValue && b instanceof KeyValue) {
                // ObjectDataType: same (serialized) type, not Comparable -> compareNotNull of
                // serialize(a) and serialize(b)
                return compareNotNull(bytes(a), bytes(b));
            }
            return super.compare(a, b);
        }

        private static byte[] bytes(Object key) {
            IdentityHashMap<Object, byte[]> known = BYTES.get();
            byte[] bytes = known.get(key);
            if (bytes == null) {
                if (known.size() >= REMEMBERED) {
                    known.clear();
                }
                bytes = serialize(key);
                known.put(key, bytes);
            }
            return bytes;
        }
    }
}
