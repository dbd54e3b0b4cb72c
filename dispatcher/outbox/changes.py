"""What the change events of one stream read say about the documents' outboxes (pure;
docs/design.md "The dispatcher", "How stream mode finds new entries").

The stream names the documents that changed and, where the event carries it, what their
outbox was then; a document whose event does not carry it is read (one batched, projected
``find`` per read: :func:`fetch_projection`). Per document, over the events of a read:

- an **insert** or **replace** event carries the document (projected: ``_id``, ``_type``,
  ``_p``, ``outbox``): its outbox as it was then;
- an **update** event (no full-document lookup) carries ``documentKey._id`` and the update
  description. The writer appends with ``$push: {outbox: {$each: [...]}}``, which MongoDB
  reports as ``outbox.<n>`` keys for the new elements of an array that had some (``n`` from
  the length before), or as the whole ``outbox`` when the push created the array; the
  dispatcher's ``$pull`` as the whole remaining ``outbox``. What the event shows is a
  **prefix** of the outbox at that event: the whole array, or ``outbox.0 … outbox.k-1``
  (appended to an empty array), or — following a known prefix of length ``n`` in the same
  read — ``outbox.n …``. A prefix is enough: publishing the first entries of an outbox, in
  order, never puts a later entry before an earlier one; entries after it are published
  from a later view (their own event, a read, a sweep). Keys that start further on
  (``outbox.5`` with the first five unknown), deeper paths (``outbox.3.x``), a truncated
  ``outbox``, or an update without a description make the document **read** instead;
  an ``outbox`` removed means an empty one. Entries a prefix shows that were published
  already are told apart by the in-flight set (:mod:`dispatcher.outbox.inflight`), as for
  an insert event's document, which is also the document as it was at its event;
- an update event's view lacks ``_type`` and ``_p`` (the emitter type, for records, and the
  partition, for the fence): both are written once, at insert, so they are remembered per
  document from what the stream and the reads saw (:class:`DocMeta`; an update of ``_p`` or
  ``_type`` itself, e.g. ``aggbox migrate partitions``, updates it). A document not
  remembered is read.
- with **full-document lookup** (the fallback below), an update event's ``fullDocument`` is
  the document as it is now: used as a view.

Views only come from events newer than the stream's open (``fresh_after``: the server's
operation time right after it, :func:`~dispatcher.outbox.stream.server_time`). An older
event — replayed from a resume token, or from a start point rounded down to the second —
shows an outbox as it was: entries in it may have been published and pulled since by a
previous owner of the partition (a hand-over, a restart), which this instance cannot tell
from pending ones (its in-flight set knows only its own). Their documents are read
instead, as they are now. After the open, only this instance pulls the partition's
entries, and its in-flight set recognises what it has pulled already.

Partitions: inserts and replaces are selected by the stream's ``$match`` on
``fullDocument._p``; an update event has no ``_p``, so its document is selected here — by
its remembered ``_p`` (none: partition 0), else skipped when neither the partition of its
``_id`` (:func:`~aggregates.core.partitions.partition_of`; ``_p`` is that or absent) nor
partition 0 is held, else read (the read's result is selected by its ``_p``).

An update event whose ``documentKey`` has no ``_id`` and which brings no looked-up document
(mongo-java-server's own change events: their ``documentKey`` is the update) cannot name
its document: :class:`NoDocumentKey`; the follower then reopens the stream from before the
read with ``full_document="updateLookup"`` and stays so.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any, Final

from bson import Timestamp

from aggregates.core.partitions import partition_of
from aggregates.dedup.core import F_HW, F_INBOX
from aggregates.dedup.runstate import F_RUN
from aggregates.fold.document import F_BLOCKED, F_OUTBOX, F_PARTITION, F_STATE, F_TIMERS, F_TYPE

__all__ = [
    "FETCH_PROJECTION",
    "LOOKUP_PIPELINE",
    "PIPELINE",
    "ChangeSet",
    "DocMeta",
    "NoDocumentKey",
    "delta_pipeline",
    "pipeline",
    "selected",
]

#: The fields the dispatcher reads of a document (sweeps, reads, the stream's projection).
FETCH_PROJECTION: Final = {F_OUTBOX: 1, F_TYPE: 1, F_PARTITION: 1}
_ABSENT: Final = object()  # a document without ``_p`` (partition 0)
_META_CAPACITY: Final = 100_000
_PREFIX: Final = F_OUTBOX + "."


#: The stream with full-document lookup (the fallback for a server whose update events name
#: no document): matched and projected on the looked-up document.
LOOKUP_PIPELINE: Final[list[dict[str, Any]]] = [
    {"$match": {
        "operationType": {"$in": ["insert", "update", "replace"]},
        f"fullDocument.{F_OUTBOX}.0": {"$exists": True},
    }},
    # Only what the dispatcher reads: the looked-up document's id, type and outbox (its
    # state, dedup record … are neither sent nor decoded), and the event's own fields.
    {"$project": {"operationType": 1, "clusterTime": 1, "fullDocument._id": 1,
                  f"fullDocument.{F_TYPE}": 1, f"fullDocument.{F_OUTBOX}": 1,
                  f"fullDocument.{F_PARTITION}": 1}},
]
PIPELINE = LOOKUP_PIPELINE  # (the name of issue 35's code)

#: Fields of an aggregate document the dispatcher never reads that can be large (the state,
#: the dedup record, the timers): left out of the events it is sent (an exclusion
#: projection — mongo-java-server evaluates a ``$filter`` over the update description's
#: keys at about half a millisecond per event, issue 42). An update description's other
#: fields (``_v``, ``_seq``, …) are small; an event that changes none of ``outbox``, ``_p``
#: and ``_type`` is read and dropped by the dispatcher.
_NOT_READ: Final = (F_STATE, F_INBOX, F_HW, F_TIMERS, F_BLOCKED, F_RUN)


def delta_pipeline(where: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The stream without lookup: inserts and replaces with an outbox (of the partitions
    ``where`` selects on ``fullDocument._p``), and updates — but the ``$pull`` that leaves
    an empty outbox; each event without the fields the dispatcher never reads."""
    documents = {"operationType": {"$in": ["insert", "replace"]},
                 f"fullDocument.{F_OUTBOX}.0": {"$exists": True}, **where}
    if "$or" in documents:  # partition 0 also selects documents without _p
        documents = {"$and": [{k: v for k, v in documents.items() if k != "$or"},
                              {"$or": documents["$or"]}]}
    dropped: dict[str, Any] = {"ns": 0, "wallTime": 0}
    for name in _NOT_READ:
        dropped[f"updateDescription.updatedFields.{name}"] = 0
        dropped[f"fullDocument.{name}"] = 0
    return [
        {"$match": {"$or": [
            documents,
            {"operationType": "update",
             f"updateDescription.updatedFields.{F_OUTBOX}": {"$ne": []}},
        ]}},
        {"$project": dropped},
    ]


def pipeline(where: Mapping[str, Any], *, lookup: bool = True) -> list[dict[str, Any]]:
    """The stream's pipeline, with ``where`` (the partitions, on ``fullDocument``) added."""
    if not lookup:
        return delta_pipeline(where)
    if not where:
        return LOOKUP_PIPELINE
    return [{"$match": {**LOOKUP_PIPELINE[0]["$match"], **where}}, *LOOKUP_PIPELINE[1:]]


class NoDocumentKey(Exception):
    """An update event names no document (no ``documentKey._id``, no looked-up document)."""


class DocMeta:
    """``_type`` and ``_p`` of the documents seen (bounded; both never change but by an
    update of their own, which the stream reports)."""

    def __init__(self, capacity: int = _META_CAPACITY) -> None:
        self._known: dict[Any, tuple[Any, Any]] = {}
        self._capacity = capacity

    def __len__(self) -> int:
        return len(self._known)

    def learn(self, doc: Mapping[str, Any]) -> None:
        """From a document that has both fields projected (absent ``_p``: partition 0)."""
        key = doc.get("_id")
        if key is None:
            return
        if len(self._known) >= self._capacity and key not in self._known:
            self._known.clear()
        self._known[key] = (doc.get(F_TYPE), doc.get(F_PARTITION, _ABSENT))

    def changed(self, key: Any, fields: Mapping[str, Any], removed: Iterable[str]) -> None:
        """An update event set or removed ``_type`` or ``_p``."""
        known = self._known.get(key)
        if known is None:
            return
        atype, part = known
        if F_TYPE in fields:
            atype = fields[F_TYPE]
        if F_PARTITION in fields:
            part = fields[F_PARTITION]
        for name in removed:
            if name == F_TYPE:
                atype = None
            elif name == F_PARTITION:
                part = _ABSENT
        self._known[key] = (atype, part)

    def view(self, key: Any, outbox: list[Any]) -> dict[str, Any] | None:
        """The document's view (as a sweep reads it) with this outbox; ``None`` when its
        ``_type`` and ``_p`` are not known."""
        known = self._known.get(key)
        if known is None:
            return None
        atype, part = known
        doc: dict[str, Any] = {"_id": key, F_OUTBOX: outbox}
        if atype is not None:
            doc[F_TYPE] = atype
        if part is not _ABSENT:
            doc[F_PARTITION] = part
        return doc

    def partition(self, key: Any) -> Any:
        """The remembered partition (``_ABSENT``-free: 0 without ``_p``), ``None`` unknown."""
        known = self._known.get(key)
        if known is None:
            return None
        return 0 if known[1] is _ABSENT else known[1]


def selected(doc: Mapping[str, Any], partitions: frozenset[int] | None) -> bool:
    """Whether a document belongs to these partitions (``None``: all of them)."""
    if partitions is None:
        return True
    return doc.get(F_PARTITION, 0) in partitions


class ChangeSet:
    """The documents the events of one read name, in order of their last event: a view
    (the outbox the events showed) or a read."""

    __slots__ = ("_fresh_after", "_looked_up", "_meta", "_parts", "_prefix", "_read")

    def __init__(self, meta: DocMeta, partitions: Callable[[], frozenset[int] | None]
                 = lambda: None, *, fresh_after: Timestamp | None = None,
                 looked_up: bool = False) -> None:
        self._meta = meta
        self._parts = partitions()
        #: events at or before this cluster time are read, not viewed (None: all viewed)
        self._fresh_after = fresh_after
        #: update events carry the document as it is now (full-document lookup)
        self._looked_up = looked_up
        #: document → a prefix of its outbox at its last event (None: read it), in order
        self._prefix: dict[Any, list[Any] | None] = {}
        self._read: set[Any] = set()

    def _old(self, event: Mapping[str, Any]) -> bool:
        """The event predates the stream's open: what it shows may have been pulled since."""
        if self._fresh_after is None:
            return False
        at = event.get("clusterTime")
        return not isinstance(at, Timestamp) or at <= self._fresh_after

    def add(self, event: Mapping[str, Any]) -> None:
        """Take one change event (insert, update, replace); raises :class:`NoDocumentKey`."""
        doc = event.get("fullDocument")
        if isinstance(doc, Mapping) and "_id" in doc:  # an insert, a replace, a lookup
            self._meta.learn(doc)
            looked_up = self._looked_up and event.get("operationType") == "update"
            if not looked_up and self._old(event):
                self._set(doc["_id"], None)  # as it was then: read it as it is
                return
            outbox = doc.get(F_OUTBOX)
            self._set(doc["_id"], list(outbox) if isinstance(outbox, list) else [])
            return
        dkey = event.get("documentKey")
        if not isinstance(dkey, Mapping) or "_id" not in dkey:
            raise NoDocumentKey(str(event.get("operationType")))
        key = dkey["_id"]
        desc = event.get("updateDescription")
        if not isinstance(desc, Mapping):
            self._set(key, None)
            return
        fields = desc.get("updatedFields")
        fields = fields if isinstance(fields, Mapping) else {}
        removed = [r for r in desc.get("removedFields") or () if isinstance(r, str)]
        if F_TYPE in fields or F_PARTITION in fields or F_TYPE in removed \
                or F_PARTITION in removed:
            self._meta.changed(key, fields, removed)
        if self._old(event):
            if any(k == F_OUTBOX or k.startswith(_PREFIX) for k in fields) \
                    or F_OUTBOX in removed:
                self._set(key, None)
            return
        truncated = any(isinstance(t, Mapping) and t.get("field") == F_OUTBOX
                        for t in desc.get("truncatedArrays") or ())
        if F_OUTBOX in removed:
            self._set(key, [])
        whole = fields.get(F_OUTBOX)
        if isinstance(whole, list):
            self._set(key, list(whole))
            return
        appended: list[tuple[int, Any]] = []
        for name, value in fields.items():
            if not name.startswith(_PREFIX):
                continue
            index = name[len(_PREFIX):]
            if not index.isdigit():  # a deeper path (outbox.3.x) or no index
                self._set(key, None)
                return
            appended.append((int(index), value))
        if truncated:
            self._set(key, None)
            return
        if not appended:
            return  # the outbox did not change
        appended.sort(key=lambda a: a[0])
        first = appended[0][0]
        if any(i != first + n for n, (i, _) in enumerate(appended)):
            self._set(key, None)
            return
        known = self._prefix.get(key)
        if first == 0:
            self._set(key, [v for _, v in appended])
        elif key in self._prefix and known is not None and len(known) == first:
            self._set(key, known + [v for _, v in appended])
        else:
            self._set(key, None)

    def _set(self, key: Any, prefix: list[Any] | None) -> None:
        self._prefix.pop(key, None)  # order of the last event
        self._prefix[key] = prefix

    def resolve(self) -> tuple[list[Mapping[str, Any]], list[Any]]:
        """The views of the documents (a non-empty outbox, in its partitions) and the ids to
        read, each in order of its last event."""
        views: list[Mapping[str, Any]] = []
        reads: list[Any] = []
        parts = self._parts
        meta = self._meta
        for key, prefix in self._prefix.items():
            if parts is not None and not self._may_hold(key, parts):
                continue
            if prefix is None:
                reads.append(key)
                continue
            if not prefix:
                continue
            view = meta.view(key, prefix)
            if view is None:
                reads.append(key)
            elif selected(view, parts):
                views.append(view)
        return views, reads

    def _may_hold(self, key: Any, parts: frozenset[int]) -> bool:
        """False when the document surely belongs to a partition not held."""
        known = self._meta.partition(key)
        if known is not None:
            return bool(known in parts)
        if 0 in parts or not isinstance(key, str):
            return True
        return partition_of(key) in parts
