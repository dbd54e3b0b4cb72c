"""One chunk's aggregates of one collection through the batch fold (docs/design.md "The
batch fold"): :class:`NativePass` is :class:`~aggregates.store.write_pass.CollectionPass`
with documents read as BSON and slices folded by the native core, whose writes are sent as
built. A slice the core gives back — and every slice of an aggregate with parked messages
— is folded by the definition from the same document, exactly as the plain pass does.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

import bson

from aggregates.core.bulk import WriteError
from aggregates.dedup.archive import InboxArchive
from aggregates.fold.document import Snapshot
from aggregates.store.chunks import Work
from aggregates.store.nativefold import NATIVE, RAW_OPTIONS, available
from aggregates.store.write_pass import CollectionPass, Pending

__all__ = ["NativePass"]

_UNREAD: Final = object()


class NativePass(CollectionPass):
    """A :class:`CollectionPass` whose slices the native core folds where it can."""

    def __init__(self, *args: Any, spec: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.spec = spec
        #: The documents as read (None: missing), until a native write changes them.
        self.raw: dict[str, bytes | None] = {}
        self._raw_coll = self.coll.with_options(codec_options=RAW_OPTIONS)
        stamp = self.ctx.run
        self._native = available()
        self._fold_ctx = NATIVE.FoldCtx(
            spec, self.now, self.ctx.settings.max_document_bytes,
            (stamp.run, stamp.attempt) if stamp is not None else None,
            self.coll.codec_options, self.ctx.store_now)

    # -- reading ----------------------------------------------------------------------
    def _read(self, ids: list[str]) -> dict[str, Any]:
        found = {d["_id"]: bytes(d.raw) for d in self._raw_coll.find({"_id": {"$in": ids}})}
        out: dict[str, Any] = {}
        sv = self.spec_state_version
        for i in ids:
            raw = found.get(i)
            self.raw[i] = raw
            snap = (NATIVE.NativeSnap.missing(i) if raw is None
                    else NATIVE.NativeSnap.read(i, raw, sv))
            out[i] = snap if snap is not None else self._decoded(i, raw)
        return out

    @property
    def spec_state_version(self) -> int:
        return self.works[0].atype.state_version

    def _decoded(self, aggregate_id: str, raw: bytes | None) -> Snapshot:
        """The definition's snapshot of a document read as BSON."""
        doc = None if raw is None else bson.decode(raw, codec_options=self.coll.codec_options)
        return self._snapshot(aggregate_id, doc)

    def _to_definition(self, w: Work) -> None:
        """Hand ``w``'s aggregate to the definition: its snapshot from the document as read
        (read again if a native write changed it since), asked about in the archive."""
        aid = w.aggregate_id
        raw = self.raw.get(aid, _UNREAD)
        if raw is _UNREAD:
            doc = self.coll.find_one({"_id": aid})
            self.snaps[aid] = self._snapshot(aid, doc)
        else:
            self.snaps[aid] = self._decoded(aid, raw)  # type: ignore[arg-type]
        self._lookup([w])

    def _lookup(self, works: Sequence[Work]) -> None:
        for w in works:  # parked messages are the definition's
            if w.parked and not isinstance(self.snaps[w.aggregate_id], Snapshot):
                self._to_definition(w)
        if self.archive is None:
            return
        pairs: list[tuple[str, str]] = []
        for w in works:
            snap = self.snaps[w.aggregate_id]
            if isinstance(snap, Snapshot):
                pairs.extend(self._pairs(w, snap))
            elif snap.exists:  # a missing document never archived an id
                pairs.extend((w.aggregate_id, m) for m in snap.lookup_ids(
                    self.spec, w.messages, w.pos, len(w.messages)))
        found, tags = self.archive.lookup_tagged(pairs) if pairs else ({}, {})
        for w in works:
            snap = self.snaps[w.aggregate_id]
            if isinstance(snap, Snapshot):
                snap.dedup.looked_up(found.get(w.aggregate_id, {}), tags.get(w.aggregate_id))
            elif snap.exists:
                snap.looked_up(found.get(w.aggregate_id, {}), tags.get(w.aggregate_id))

    # -- folding and writing ----------------------------------------------------------
    def _fold(self, w: Work, n: int) -> Any:
        snap = self.snaps[w.aggregate_id]
        if not isinstance(snap, Snapshot):
            if self._native:
                res = self._fold_ctx.fold(snap, w.messages, w.pos, w.pos + n, w.conflicts + 1)
                if res is not None:
                    self.result.stats.native_slices += 1
                    if res.op is None:
                        res.settle()
                    return res
            self._to_definition(w)
        return super()._fold(w, n)

    def _op(self, p: Pending) -> Any:
        res = p.result
        if type(res) is _NATIVE_FOLD:
            return res.op
        return super()._op(p)

    def _write(self, pending: list[Pending]) -> list[WriteError]:
        archive = self.archive
        if archive is not None:
            # The native folds' evicted ids come as the archive's documents, built in the
            # core; the definition's as entries. Both are stored before the round's writes.
            docs = [d for p in pending if type(p.result) is _NATIVE_FOLD
                    for d in p.result.archive]
            if docs:
                assert isinstance(archive, InboxArchive)
                archive.insert_documents(docs)
        return super()._write(pending)

    def _evicted(self, p: Pending) -> Sequence[Any]:
        if type(p.result) is _NATIVE_FOLD:
            return ()  # stored by _write
        return super()._evicted(p)

    def _written(self, p: Pending) -> None:
        res = p.result
        self.raw.pop(p.work.aggregate_id, None)  # the document is not as read any more
        if type(res) is _NATIVE_FOLD:
            res.settle()
            self._settle(p.work, res, p.size)
            return
        super()._written(p)


_NATIVE_FOLD: Final = NATIVE.NativeFold if NATIVE is not None else None
