/* Change events as MongoDB writes them, for the local server's oplog: see
 * AggboxMongoH2Server.java and docs/design.md "The local server". */

import de.bwaldvogel.mongo.backend.aggregation.Aggregation;
import de.bwaldvogel.mongo.backend.aggregation.stage.AggregationStage;
import de.bwaldvogel.mongo.backend.aggregation.stage.ProjectStage;
import de.bwaldvogel.mongo.bson.Document;

import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.stream.Stream;

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

    /**
     * mongo-java-server's $project evaluates every dotted path with regular expressions
     * (Utils.getSubkey calls String.matches twice per path and document) and deep-copies the
     * document: the exclusion of a few fields of aggbox's change events cost about 0.3 ms of
     * server CPU per event (issue 42, JFR). A change stream's exclusion-only $project (every
     * value 0 or false, no "$" in a path) runs here instead, with MongoDB's result: each path
     * removed where it exists (from each document of an array on its way), the events the
     * oplog keeps untouched (what a path goes through is copied, not changed).
     */
    static void fastExclusions(Aggregation aggregation) {
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
}
