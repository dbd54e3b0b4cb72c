"""Run stamps (pure): which attempt of which run recorded what in a dedup record, so that a
retried attempt of the same run counts the messages an earlier attempt of it applied as
``applied`` (reason ``earlier_attempt``), once, instead of ``duplicate`` (docs/design.md
"Counts that survive retries").

A writer given a :class:`RunStamp` (the Spark pipeline: the run id — with the micro-batch
id in a stream — and the task attempt) stamps the documents it writes with::

    _run: {id: <run>, w: [{a: <attempt>, v: <first _v it wrote>,
                           hw: [[<hw key>, <mark before it>], ...],    # high-water only
                           x: [<claim key>, ...]}, ...]}              # rarely present

one segment per attempt of that run, in write order, and the inbox entries it adds with a
fourth element: the ``_v`` of the write that stored them. A write without a stamp, or of
another run, replaces ``_run`` (sets it to null, or to its own): the segments always
describe the newest writes of the run named in ``id``.

A message a strategy finds already recorded is *the run's own* when ``_run.id`` is the
writer's run and (inbox) its entry was written at or after the first segment's ``v``, or
(high-water) its ``seq`` is above the mark a segment found for its source. The segment
tells which attempt wrote it. ``x`` lists what an attempt recorded without applying it
(the messages of timers a handler removed while they may be firing, docs/design.md
"Timers"): never claimed. Each claim is made once per writer (the writer keeps its claims
across chunks), so a second copy of the message in the input stays a ``duplicate``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from aggregates.dedup.core import DedupChanges
from aggregates.dedup.runstate import F_RUN, RunStamp, RunState, read_run

if TYPE_CHECKING:
    from aggregates.dedup.core import DedupRecord, DedupStrategy
    from aggregates.message.envelope import Message

__all__ = ["F_RUN", "RunStamp", "RunState", "earlier_attempt", "read_run", "stamped_changes"]

def earlier_attempt(strategy: DedupStrategy, rec: DedupRecord, msg: Message) -> str | None:
    """For a message ``strategy`` found already recorded: when an earlier attempt of this
    run applied it and it is not claimed yet, the claim is made and the outcome's detail
    (naming that attempt) returned; ``None``: a duplicate."""
    run = rec.run
    if run is None or not run.own:
        return None
    found = strategy.written_by(rec, msg)
    if found is None:
        return None
    key, label = found
    assert run.stamp is not None  # run.own
    if label == run.stamp.attempt:  # this attempt's own write: it was counted then
        return None
    if key in run.claimed or any(key in (seg.get("x") or ()) for seg in run.segments):
        return None
    run.claimed.add(key)
    return (f"written by {label}, an earlier attempt of this run whose outcome was lost; "
            "counted here, once")


def unapplied(strategy: DedupStrategy, rec: DedupRecord, msg: Message) -> None:
    """Note that ``msg`` was recorded without being applied (a timer that may be firing)."""
    run = rec.run
    if run is not None and run.stamp is not None:
        key = strategy.claim_key(msg)
        if key is not None:
            run.unapplied.append(key)


def stamped_changes(strategy: DedupStrategy, rec: DedupRecord, version: int) -> DedupChanges:
    """The strategy's :meth:`~aggregates.dedup.DedupStrategy.changes` for a write that will
    have ``_v`` = ``version``, plus the run stamp (``_run``) when the write records
    anything; ``rec.run`` becomes what is stored after it."""
    run = rec.run
    if run is not None:
        run.write_version = version
    ch = strategy.changes(rec)
    if run is None or not ch:
        return ch
    if run.stamp is None:
        if run.stored_id is None:
            return ch
        run.stored_id, run.segments = None, []
        return DedupChanges({**ch.set, F_RUN: None}, ch.push, ch.archive)
    segments = [dict(s) for s in run.segments] if run.own else []
    if not segments or segments[-1]["a"] != run.stamp.attempt:
        segments.append({"a": run.stamp.attempt, "v": version})
    seg = segments[-1]
    if run.before:
        marks = [list(p) for p in seg.get("hw") or ()]
        known = {p[0] for p in marks}
        marks.extend([k, b] for k, b in run.before.items() if k not in known)
        seg["hw"] = marks
    if run.unapplied:
        seg["x"] = [*(seg.get("x") or ()), *run.unapplied]
    run.stored_id, run.segments = run.stamp.run, segments
    run.before, run.unapplied = {}, []
    return DedupChanges({**ch.set, F_RUN: {"id": run.stamp.run, "w": segments}}, ch.push,
                        ch.archive)
