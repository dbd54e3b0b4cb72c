"""The invariants of docs/design.md "Invariants", checked on what the run left behind: the
documents, the outcome logs of the pipeline rounds and the records the dispatcher published."""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Mapping
from typing import Any

from aggbox.demo.checks.base import Check, Evidence, fmt, plural, state_of, verdict
from aggbox.demo.oracle import Key, domain_of, fold_messages, plain_state
from aggregates.core.ids import emitted_message_id
from aggregates.core.keys import hw_key
from aggregates.dedup import HighWater, Inbox
from aggregates.domain.timers import TIMER_SOURCE_TYPE, timer_source_id
from aggregates.fold.document import F_HW, F_INBOX, F_SEQ, F_TIMER_SEQ, F_TIMERS

__all__ = [
    "check_invariant_1",
    "check_invariant_2",
    "check_invariant_3",
    "check_invariant_4",
    "check_invariant_5",
    "check_invariant_6",
]


def check_invariant_1(ev: Evidence) -> Check:
    """State, dedup record and outbox changed together: every applied message id is in the
    aggregate's dedup record (and nothing else is but the timers the oracle says were
    withdrawn after they were stored: recorded as handled), ``_seq`` counts what the
    applied messages emitted and ``_tseq`` the timers they scheduled (the oracle's count: a
    timer is no emitted message), and the state is the oracle's."""
    problems: list[str] = []
    keys = set(ev.store.documents) | set(ev.applied) | set(ev.expected.states)
    for key in sorted(keys):
        t, aid = key
        doc = ev.store.documents.get(key)
        rows = ev.applied.get(key, [])
        if doc is None:
            problems.append(f"{t}/{aid}: no document ({len(rows)} applied message(s), "
                            f"oracle state {ev.expected.state_of(t, aid)})")
            continue
        if t not in ev.registry:
            problems.append(f"{t}/{aid}: document of an unknown type")
            continue
        dedup = ev.registry.get(t).dedup
        applied = {o.message_id for o in rows}
        withdrawn = ev.expected.withdrawn.get(key, [])
        if dedup.name == Inbox.name:
            # A withdrawn timer's id depends on the writer's clock (its due time): counted.
            inbox = {str(e[0]) for e in doc.get(F_INBOX) or []}
            if not applied <= inbox or len(inbox - applied) != len(withdrawn):
                problems.append(f"{t}/{aid}: inbox has {len(inbox - applied)} id(s) never "
                                f"applied ({len(withdrawn)} withdrawn timer(s) expected) and "
                                f"lacks {len(applied - inbox)} applied id(s)")
        elif dedup.name == HighWater.name:
            problems.extend(_hw_problems(ev, key, doc, applied))
        emitted = sum(len(o.emitted_ids) for o in rows)
        scheduled = ev.expected.scheduled.get(key, 0)
        if int(doc.get(F_SEQ, 0)) != emitted or int(doc.get(F_TIMER_SEQ, 0)) != scheduled:
            problems.append(f"{t}/{aid}: _seq {doc.get(F_SEQ, 0)} and _tseq "
                            f"{doc.get(F_TIMER_SEQ, 0)} but applied messages emitted {emitted} "
                            f"and scheduled {scheduled} timer(s)")
        if state_of(doc) != (ev.expected.state_of(t, aid) or {}):
            problems.append(f"{t}/{aid}: state {state_of(doc)} ≠ oracle "
                            f"{ev.expected.state_of(t, aid)}")
    gone = sum(len(w) for w in ev.expected.withdrawn.values())
    return verdict("Invariant 1: state + dedup record + outbox in one write", problems,
                   f"{fmt(len(keys))} aggregates: every applied id recorded"
                   + (f" (and {plural(gone, 'withdrawn timer')})" if gone else "")
                   + ", _seq, _tseq and state consistent")


def _hw_problems(ev: Evidence, key: Key, doc: Mapping[str, Any], applied: set[str]
                 ) -> list[str]:
    t, aid = key
    hw = {str(k): int(v) for k, v in (doc.get(F_HW) or {}).items()}
    highest: dict[str, int] = {}
    out: list[str] = []
    for mid in applied:
        msg = ev.messages.get(mid)
        if msg is None or msg.source is None:
            out.append(f"{t}/{aid}: applied {mid} is not in any round's input")
            continue
        k = hw_key(msg.source.type, msg.source.id)
        highest[k] = max(highest.get(k, 0), msg.source.seq)
    for timer in ev.expected.withdrawn.get(key, []):  # recorded as handled, by its source
        k = hw_key(TIMER_SOURCE_TYPE, timer_source_id(t, aid, timer.key))
        highest[k] = max(highest.get(k, 0), timer.seq)
    if hw != highest:
        out.append(f"{t}/{aid}: hw {hw} ≠ highest applied seq per source {highest}")
    return out


def check_invariant_2(ev: Evidence) -> Check:
    """Nothing lost, nothing resurrected: no pending outbox entries after the last drain
    (pending timers are not outbox entries); the published ids are exactly the emitted
    ones; no id published by two drains (the demo injects no dispatcher crash, so a repeat
    means an entry came back)."""
    emitted = {e for rows in ev.applied.values() for o in rows for e in o.emitted_ids}
    published = {str(p["message_id"]) for p in ev.published}
    problems: list[str] = []
    pending = ev.store.pending_outbox
    if pending:
        problems.append(f"{fmt(pending)} outbox entries still pending")
    lost = sorted(emitted - published)
    if lost:
        problems.append(f"{fmt(len(lost))} emitted but never published (e.g. {lost[0]})")
    unknown = sorted(published - emitted)
    if unknown:
        problems.append(f"{fmt(len(unknown))} published but emitted by no applied message "
                        f"(e.g. {unknown[0]})")
    if emitted != ev.expected.emitted:
        problems.append(f"{fmt(len(emitted ^ ev.expected.emitted))} emitted ids differ from "
                        "the oracle's")
    seen: Counter[str] = Counter()
    for ids in ev.published_by_drain:
        seen.update(ids)
    again = sorted(i for i, n in seen.items() if n > 1)
    if again:
        problems.append(f"{fmt(len(again))} published by more than one drain "
                        f"(e.g. {again[0]})")
    copies = len(ev.published) - len(published)
    return verdict("Invariant 2: outbox drained, nothing lost or resurrected", problems,
                   f"{fmt(len(emitted))} emitted = {fmt(len(published))} published "
                   f"({fmt(copies)} republished), 0 pending")


def check_invariant_3(ev: Evidence) -> Check:
    """Emitted ids are deterministic: recomputed from (emitting aggregate, causing message,
    index) they equal the published ones, and each published message is the oracle's."""
    groups: dict[tuple[str, str, str], dict[str, dict[str, Any]]] = defaultdict(dict)
    problems: list[str] = []
    for p in ev.published:
        src = p.get("source") or {}
        if not src or not p.get("causation_id"):
            problems.append(f"{p.get('message_id')}: no source or causation_id")
            continue
        groups[(str(src["type"]), str(src["id"]), str(p["causation_id"]))][
            str(p["message_id"])] = p
    for (stype, sid, cause), recs in groups.items():
        ordered = sorted(recs.values(), key=lambda r: int(r["source"]["seq"]))
        for index, rec in enumerate(ordered):
            want = emitted_message_id(stype, sid, cause, index)
            if rec["message_id"] != want:
                problems.append(f"{rec['message_id']}: recomputed id is {want}")
    for mid, rec in {str(p["message_id"]): p for p in ev.published}.items():
        exp = ev.expected.messages.get(mid)
        if exp is None:
            problems.append(f"{mid}: not emitted by the oracle")
            continue
        got = (rec.get("type"), rec.get("aggregate_type"), rec.get("aggregate_id"),
               rec.get("payload"), rec.get("causation_id"),
               (rec.get("source") or {}).get("type"), (rec.get("source") or {}).get("id"))
        src = exp.source
        want_t = (exp.type, exp.aggregate_type, exp.aggregate_id, exp.payload, exp.causation_id,
                  src.type if src else None, src.id if src else None)
        if got != want_t:
            problems.append(f"{mid}: published {got[:4]} ≠ oracle {want_t[:4]}")
    n = len({str(p["message_id"]) for p in ev.published})
    return verdict("Invariant 3: emitted ids are deterministic", problems,
                   f"{fmt(n)} published ids recomputed from (aggregate, cause, index); "
                   "content = oracle")


def check_invariant_4(ev: Evidence) -> Check:
    """Per emitting aggregate the published ``source.seq`` are exactly 1.._seq: no gap, no
    repeat (timers do not take numbers of ``_seq``: they count in ``_tseq``). And the
    pending timers' own seqs are distinct numbers within 1.._tseq."""
    seqs: dict[Key, dict[str, int]] = defaultdict(dict)
    problems: list[str] = []
    for p in ev.published:
        src = p.get("source") or {}
        if not src:
            continue
        key = (str(src["type"]), str(src["id"]))
        mid, seq = str(p["message_id"]), int(src["seq"])
        if seqs[key].setdefault(mid, seq) != seq:
            problems.append(f"{mid}: published with seq {seqs[key][mid]} and {seq}")
    emitters = {k for k, d in ev.store.documents.items() if int(d.get(F_SEQ, 0))} | set(seqs)
    for key in sorted(emitters):
        doc = ev.store.documents.get(key) or {}
        n = int(doc.get(F_SEQ, 0))
        got = sorted(seqs.get(key, {}).values())
        if got != list(range(1, n + 1)):
            problems.append(f"{key[0]}/{key[1]}: seqs {_short(got)} published; _seq {n}")
    for key, doc in sorted(ev.store.documents.items()):
        timers = sorted(int((t.get("source") or {}).get("seq", 0))
                        for t in doc.get(F_TIMERS) or [])
        if len(set(timers)) != len(timers) or not set(timers) <= set(
                range(1, int(doc.get(F_TIMER_SEQ, 0)) + 1)):
            problems.append(f"{key[0]}/{key[1]}: pending timer seqs {_short(timers)}; _tseq "
                            f"{doc.get(F_TIMER_SEQ, 0)}")
    return verdict("Invariant 4: source.seq contiguous 1.._seq per emitter", problems,
                   f"{fmt(len(emitters))} emitting aggregates, no gap, no repeat",
                   total=len(emitters))


def _short(seqs: list[int]) -> list[int | str]:
    return list(seqs) if len(seqs) <= 6 else [*seqs[:3], "…", *seqs[-2:]]


def check_invariant_5(ev: Evidence) -> Check:
    """Handlers are deterministic: re-folding each aggregate's applied messages in memory
    gives the stored state, ``_seq``, the emitted ids the outcome log reports and the keys
    of the pending timers."""
    problems: list[str] = []
    order = {mid: (r.number, mid) for r in ev.run.rounds for mid in
             (o.message_id for o in r.outcomes)}
    domain = domain_of(ev.registry)
    for key, rows in sorted(ev.applied.items()):
        t, aid = key
        if t not in domain:
            continue
        msgs = [ev.messages[o.message_id] for o in rows if o.message_id in ev.messages]
        if len(msgs) != len(rows):
            problems.append(f"{t}/{aid}: {len(rows) - len(msgs)} applied message(s) not in "
                            "any round's input")
            continue
        msgs.sort(key=lambda m: order.get(m.message_id, (0, m.message_id)))
        f = fold_messages(domain[t], aid, msgs)
        doc = ev.store.documents.get(key)
        if f.failed:
            problems.append(f"{t}/{aid}: re-fold fails on {sorted(f.failed)[0]}")
        elif plain_state(f.state) != state_of(doc):
            problems.append(f"{t}/{aid}: re-fold gives {plain_state(f.state)}, stored "
                            f"{state_of(doc)}")
        elif sorted(m.message_id for m in f.emitted) != sorted(
                e for o in rows for e in o.emitted_ids):
            problems.append(f"{t}/{aid}: re-fold emits other ids than the outcome log")
        elif doc is not None and int(doc.get(F_SEQ, 0)) != f.seq:
            problems.append(f"{t}/{aid}: re-fold _seq {f.seq}, stored {doc.get(F_SEQ)}")
        elif sorted(f.timers) != _timer_keys(doc):
            problems.append(f"{t}/{aid}: re-fold leaves timers {sorted(f.timers)} pending, "
                            f"stored {_timer_keys(doc)}")
    return verdict("Invariant 5: re-folding applied messages = stored state", problems,
                   f"{fmt(len(ev.applied))} aggregates re-folded in memory",
                   total=len(ev.applied))


def _timer_keys(doc: Mapping[str, Any] | None) -> list[str]:
    return sorted(str(t.get("timer")) for t in (doc or {}).get(F_TIMERS) or [])


def _total(counts: Mapping[str, int]) -> int:
    return sum(counts.get(k, 0) for k in ("applied", "duplicate", "dead_lettered", "parked"))


def check_invariant_6(ev: Evidence) -> Check:
    """Every input record ends in exactly one outcome, per round."""
    problems: list[str] = []
    parts: list[str] = []
    for r in ev.run.rounds:
        rows = [o for o in r.outcomes if not o.from_parked]
        c = r.counts
        if _total(c) != len(r.lines) or len(rows) != len(r.lines):
            problems.append(f"round {r.number}: {fmt(len(r.lines))} in, {fmt(_total(c))} "
                            f"counted, {fmt(len(rows))} outcome rows")
        parts.append(f"{fmt(len(r.lines))} = " + " + ".join(
            fmt(c.get(k, 0)) for k in ("applied", "duplicate", "dead_lettered", "parked")))
    return verdict("Invariant 6: in = applied + duplicate + dead + parked", problems,
                   "per round: " + "; ".join(parts))
