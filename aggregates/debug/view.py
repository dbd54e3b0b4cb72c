"""Load one aggregate with everything aggbox keeps about it, for people to look at.

    view = load_aggregate(db, registry, "Customer", "c-1")
    view                 # rich HTML in Jupyter, readable text elsewhere
    view.state           # the domain state object (via the aggregate type's codec)
    view.inbox[0]        # newest processed message
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from pymongo.database import Database

from aggregates.core.keys import hw_label
from aggregates.core.settings import AggboxSettings
from aggregates.debug.render import esc, fmt_time, html_table, text_table
from aggregates.dedup import RecordArchive
from aggregates.domain.aggregate import AggregateType, Registry
from aggregates.fold.document import (
    F_ARCHIVE_FLOOR,
    F_BLOCKED,
    F_HW,
    F_INBOX,
    F_LAYOUT_VERSION,
    F_OUTBOX,
    F_SEQ,
    F_STATE,
    F_STATE_VERSION,
    F_TIMERS,
    F_VERSION,
    LAYOUT_VERSION,
    Snapshot,
    layout_error,
    snapshot_from_document,
)
from aggregates.store.parking import ParkedStore


@dataclass(frozen=True, slots=True)
class InboxEntry:
    """One processed message remembered by the inbox dedup strategy."""

    message_id: str
    occurred_at: datetime | None
    payload_hash: str | None


@dataclass(frozen=True)
class AggregateView:
    """A read-only picture of one aggregate document and its parked messages.

    ``document`` is the stored document (``None`` when the aggregate does not exist yet);
    ``parked`` the entries of the parked collection for this aggregate, oldest first."""

    atype: AggregateType[Any] = field(repr=False)
    aggregate_id: str
    document: Mapping[str, Any] | None = field(repr=False)
    parked: list[dict[str, Any]] = field(default_factory=list, repr=False)
    #: Rows shown per table by ``str()`` and the HTML rendering.
    max_rows: int = field(default=20, repr=False)
    #: The aggregate collection's inbox archive (set by :func:`load_aggregate`).
    archive: RecordArchive | None = field(default=None, repr=False, compare=False)

    # -- what is stored ---------------------------------------------------------------
    @property
    def aggregate_type(self) -> str:
        return self.atype.name

    @property
    def collection(self) -> str:
        return self.atype.collection

    @property
    def exists(self) -> bool:
        return self.document is not None

    @property
    def version(self) -> int:
        """``_v``: +1 on every write by the writer (0 when the aggregate does not exist)."""
        return int(self._doc.get(F_VERSION, 0))

    @property
    def state_document(self) -> dict[str, Any]:
        """The stored ``state`` sub-document, as is."""
        return dict(self._doc.get(F_STATE) or {})

    @property
    def state(self) -> Any:
        """The domain state object, loaded with the aggregate type's codec (the initial
        state when the aggregate does not exist yet)."""
        return self.atype.load_state(self._doc.get(F_STATE),
                                     self._doc.get(F_STATE_VERSION, 1))

    @property
    def inbox(self) -> list[InboxEntry]:
        """Processed message ids remembered for dedup, **newest first**."""
        out = []
        for e in reversed(self._doc.get(F_INBOX) or []):
            at = e[1] if len(e) > 1 else None
            out.append(InboxEntry(str(e[0]), _aware(at), str(e[2]) if len(e) > 2 and e[2]
                                  else None))
        return out

    @property
    def inbox_floor(self) -> datetime | None:
        """The newest ``occurred_at`` ever moved from the inbox to the inbox archive
        (``None``: none yet). Older messages that are not in the inbox are looked up in the
        archive."""
        return _aware(self._doc.get(F_ARCHIVE_FLOOR))

    def archived(self, message_ids: Sequence[str]) -> dict[str, str | None]:
        """Which of ``message_ids`` this aggregate's inbox archive holds (id → payload
        hash); ``{}`` without an archive (not an inbox aggregate, or not loaded from MongoDB)."""
        if self.archive is None or not message_ids:
            return {}
        found = self.archive.lookup([(self.aggregate_id, m) for m in message_ids])
        return found.get(self.aggregate_id, {})

    @property
    def high_water(self) -> dict[str, int]:
        """Highest applied sequence per source, keyed ``"<source type>/<source id>"``
        (:func:`aggregates.core.keys.hw_label`: a ``/`` inside the type or id shows as ``%2F``)."""
        return {hw_label(str(k)): int(v) for k, v in (self._doc.get(F_HW) or {}).items()}

    @property
    def seq(self) -> int:
        """``_seq``: how many messages this aggregate has emitted so far."""
        return int(self._doc.get(F_SEQ, 0))

    @property
    def outbox(self) -> list[dict[str, Any]]:
        """Emitted entries the dispatcher has not published yet, in emission order."""
        return [dict(e) for e in self._doc.get(F_OUTBOX) or []]

    @property
    def timers(self) -> list[dict[str, Any]]:
        """Pending timers (``Schedule``), earliest due first: the dispatcher publishes each
        when it is due (docs/concepts.md "Timers")."""
        return sorted((dict(t) for t in self._doc.get(F_TIMERS) or []),
                      key=lambda t: (str(_aware(t.get("due"))), str(t.get("id"))))

    @property
    def blocked(self) -> dict[str, Any] | None:
        """``_blocked``: set when a handler failed and the type parks on handler errors;
        release it with ``aggbox parked release``."""
        value = self._doc.get(F_BLOCKED)
        return dict(value) if value else None

    def snapshot(self) -> Snapshot:
        """The writer's view of this document: a starting point for :func:`replay`."""
        return snapshot_from_document(self.document, self.aggregate_id)

    @property
    def _doc(self) -> Mapping[str, Any]:
        return self.document or {}

    # -- rendering --------------------------------------------------------------------
    def _title(self) -> str:
        return f"{self.aggregate_type}/{self.aggregate_id}"

    def _facts(self) -> list[tuple[str, str]]:
        facts = [
            ("collection", self.collection),
            ("dedup", repr(self.atype.dedup)),
            ("version (_v)", str(self.version)),
            ("emitted (_seq)", str(self.seq)),
        ]
        if not self.exists:
            facts.insert(0, ("stored", "no document yet (the aggregate does not exist)"))
        if self.atype.dedup.name == "inbox":
            facts.append(("inbox archive floor", fmt_time(self.inbox_floor)))
        unreadable = layout_error(self._doc.get(F_LAYOUT_VERSION, LAYOUT_VERSION))
        if unreadable is not None:
            facts.append(("layout (_lv)", f"UNKNOWN: {unreadable}"))
        blocked = self.blocked
        facts.append(("blocked", "no" if blocked is None else
                      f"YES by message {blocked.get('message_id')!r} at "
                      f"{fmt_time(blocked.get('at'))}: {blocked.get('error')} — release with "
                      f"`aggbox parked release --aggregate {self._title()}`"))
        return facts

    def _tables(self) -> list[tuple[str, list[str], list[list[Any]]]]:
        state = self.state_document
        inbox = self.inbox
        outbox = self.outbox
        hw = self.high_water
        return [
            (f"state ({type(self.state).__name__})", ["field", "value"],
             [[k, v] for k, v in state.items()]),
            (f"inbox: {len(inbox)} remembered, newest first", ["message_id", "occurred_at",
                                                               "payload_hash"],
             [[e.message_id, e.occurred_at, e.payload_hash] for e in inbox]),
            (f"high-water marks: {len(hw)} sources", ["source", "seq"],
             [[k, v] for k, v in sorted(hw.items())]),
            (f"outbox: {len(outbox)} pending", ["id", "type", "target", "topic", "seq",
                                                "created_at", "payload"],
             [[e.get("id"), e.get("type"), _target(e), e.get("topic"),
               (e.get("source") or {}).get("seq"), e.get("created_at"), e.get("payload")]
              for e in outbox]),
            (f"timers: {len(self.timers)} pending, earliest due first",
             ["key", "due", "type", "target", "id", "scheduled_at"],
             [[t.get("timer"), t.get("due"), t.get("type"), _target(t), t.get("id"),
               t.get("scheduled_at")] for t in self.timers]),
            (f"parked: {len(self.parked)} messages", ["message_id", "type", "reason", "detail",
                                                      "parked_at", "attempts"],
             [[p.get("message_id"), (p.get("message") or {}).get("type"), p.get("reason"),
               p.get("detail"), p.get("parked_at"), p.get("attempts")] for p in self.parked]),
        ]

    def render_text(self, *, max_rows: int | None = None) -> str:
        limit = self.max_rows if max_rows is None else max_rows
        lines = [f"aggregate {self._title()}"]
        width = max(len(k) for k, _ in self._facts())
        lines += [f"  {k.ljust(width)}  {v}" for k, v in self._facts()]
        for title, headers, rows in self._tables():
            lines.append(f"{title}:")
            if rows:
                lines.append(text_table(headers, rows, max_rows=limit))
            else:
                lines.append("  (none)")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.render_text()

    def __repr__(self) -> str:
        return self.render_text()

    def _repr_html_(self) -> str:
        facts = "".join(f"<tr><th style='text-align:left'>{esc(k)}</th>"
                        f"<td style='text-align:left'>{esc(v)}</td></tr>"
                        for k, v in self._facts())
        parts = [f"<div><h3>aggregate <code>{esc(self._title())}</code></h3>",
                 f"<table>{facts}</table>"]
        for title, headers, rows in self._tables():
            parts.append(f"<h4>{esc(title)}</h4>")
            parts.append(html_table(headers, rows, max_rows=self.max_rows) if rows
                         else "<p><i>(none)</i></p>")
        parts.append("</div>")
        return "".join(parts)


def _target(entry: Mapping[str, Any]) -> str | None:
    t = entry.get("target")
    return f"{t.get('type')}/{t.get('id')}" if isinstance(t, Mapping) else None


def _aware(value: Any) -> datetime | None:
    if isinstance(value, datetime):
        return value if value.tzinfo else value.replace(tzinfo=UTC)
    return None


def load_aggregate(
    db: Database[Any],
    registry: Registry,
    aggregate_type: str,
    aggregate_id: str,
    *,
    settings: AggboxSettings | None = None,
) -> AggregateView:
    """Read one aggregate document and its parked messages (two reads, nothing written).

    A missing document gives a view with ``exists == False`` (its parked messages, if any,
    are still shown). ``settings`` names the parked collection (default: loaded from the
    environment / config file)."""
    atype = registry.get(aggregate_type)
    s = settings or AggboxSettings.load()
    doc = db[atype.collection].find_one({"_id": aggregate_id})
    parked = ParkedStore(db, collection=s.parked_collection).for_aggregate(atype.name,
                                                                           aggregate_id)
    archive = atype.dedup.archive(db, atype.collection)
    return AggregateView(atype, aggregate_id, doc, parked, archive=archive)


__all__ = ["AggregateView", "InboxEntry", "load_aggregate"]
