/* Change events as MongoDB writes them, for the local server's oplog: see
 * AggboxMongoH2Server.java and docs/design.md "The local server". */

import de.bwaldvogel.mongo.bson.Document;

import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;

/**
 * The update description of an update event, as MongoDB reports it (updatedFields,
 * removedFields, truncatedArrays), from the update's operators and the document after it.
 *
 * mongo-java-server's events of an update have no updateDescription and, as documentKey,
 * the update itself: a change-stream reader cannot tell which document changed, nor how,
 * without a full-document lookup per event. MongoDB reports what each operator did:
 * $set/$inc/... the field's new value at its path, $unset a removed field, a $push of
 * $each items onto an existing array its new elements as "path.index" keys (the whole array
 * when the push created it, or used $slice/$sort/$position), $pull/$pop/$addToSet/$pullAll
 * the whole array. That is what is built here; the post-image (the document as the update
 * left it) is captured by the collection while it applies the update (PostImages), so
 * nothing is read again. An update of another shape (a replacement, an unknown operator, a
 * positional path) is reported as MongoDB would for the fields concerned: their whole
 * top-level values.
 */
final class ChangeEvents {

    private ChangeEvents() {
    }

    /** The documents the current request's updates left, by _id, per thread: set by the
     * collection as it applies each update, taken by the oplog when it records them. */
    static final class PostImages {
        private static final ThreadLocal<Map<Object, Document>> CAPTURED = ThreadLocal.withInitial(HashMap::new);

        private PostImages() {
        }

        static void put(Document after) {
            Object id = after.get("_id");
            if (id != null) {
                CAPTURED.get().put(id, after);
            }
        }

        static Document take(Object id) {
            return CAPTURED.get().remove(id);
        }

        static void clear() {
            CAPTURED.get().clear();
        }
    }

    /** True for an update document made of operators ($set, $push, ...); false for a
     * replacement. */
    static boolean isOperatorUpdate(Document update) {
        for (String key : update.keySet()) {
            return key.startsWith("$");
        }
        return false;
    }

    /** MongoDB's updateDescription of {@code update} (operators) that left {@code after}. */
    static Document describe(Document update, Document after) {
        Document updated = new Document();
        List<String> removed = new ArrayList<>();
        for (Map.Entry<String, Object> op : update.entrySet()) {
            if (!(op.getValue() instanceof Document spec)) {
                continue;
            }
            for (Map.Entry<String, Object> field : spec.entrySet()) {
                String path = field.getKey();
                if (path.contains(".$") || path.startsWith("$")) { // positional: its array, whole
                    wholeTopLevel(path, after, updated, removed);
                    continue;
                }
                switch (op.getKey()) {
                    case "$setOnInsert":
                        break;
                    case "$unset":
                        removed.add(path);
                        break;
                    case "$rename":
                        removed.add(path);
                        if (field.getValue() instanceof String to) {
                            put(updated, removed, to, after);
                        }
                        break;
                    case "$push":
                        push(path, field.getValue(), after, updated, removed);
                        break;
                    case "$set":
                    case "$inc":
                    case "$mul":
                    case "$min":
                    case "$max":
                    case "$currentDate":
                    case "$bit":
                    case "$addToSet":
                    case "$pull":
                    case "$pullAll":
                    case "$pop":
                        put(updated, removed, path, after);
                        break;
                    default:
                        wholeTopLevel(path, after, updated, removed);
                }
            }
        }
        return new Document("updatedFields", updated)
            .append("removedFields", removed)
            .append("truncatedArrays", new ArrayList<>());
    }

    /** A $push: its new elements as "path.index" when it appended $each items (or one value)
     * to an array that had some already, else the whole array (created, $slice, $sort,
     * $position). */
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
            updated.put(path, copy(array)); // the push created the array (or it was empty)
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

    private static void wholeTopLevel(String path, Document after, Document updated, List<String> removed) {
        String top = path.startsWith("$") ? null : path.split("\\.", 2)[0];
        if (top == null) {
            return;
        }
        put(updated, removed, top, after);
    }

    private static final Object MISSING = new Object();

    /** The value at a dotted path (array indexes allowed), MISSING when there is none. */
    static Object valueAt(Document doc, String path) {
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

    /** A deep copy: the event must not share mutable values with the stored document. */
    static Object copy(Object value) {
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
