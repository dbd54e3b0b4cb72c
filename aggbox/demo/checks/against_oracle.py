"""Checks against the oracle: order statuses, reserved credit, pending timers, dead
letters, outcome counts per round, and that nothing is left in the outbox or parked (timers
that are not due yet are pending by design: the timers check compares them)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping
from datetime import datetime, timedelta
from typing import Any

from aggbox.demo.checks.base import SHOW, Check, Evidence, fmt, plural, state_of, verdict
from aggbox.demo.oracle import Key, PendingTimer, bson_plain
from aggbox.demo.oracle_rounds import expected_round_counts
from aggregates.core.ids import raw_message_id
from aggregates.domain.timers import stored_due, timer_message_id
from aggregates.fold.document import F_TIMERS

__all__ = [
    "check_customers",
    "check_dead_letters",
    "check_nothing_pending",
    "check_order_insensitive",
    "check_orders",
    "check_round_counts",
    "check_timers",
]


def _field_check(ev: Evidence, name: str, atype: str, fieldname: str,
                 summary: Callable[[dict[str, dict[str, Any]]], str]) -> Check:
    expected = {aid: s for (t, aid), s in ev.expected.states.items() if t == atype}
    stored = ev.store.of_type(atype)
    problems: list[str] = []
    for aid in sorted(expected.keys() | stored.keys()):
        want = expected.get(aid)
        doc = stored.get(aid)
        if want is None:
            problems.append(f"{aid}: unexpected document")
        elif doc is None:
            problems.append(f"{aid}: missing (expected {fieldname} {want.get(fieldname)!r})")
        elif state_of(doc).get(fieldname) != want.get(fieldname):
            problems.append(f"{aid}: {fieldname} {state_of(doc).get(fieldname)!r}, expected "
                            f"{want.get(fieldname)!r}")
    return verdict(name, problems, summary(expected), total=len(expected))


# -- the checks -----------------------------------------------------------------------------


def check_order_insensitive(ev: Evidence) -> Check:
    bad = [f"{t}/{i}" for t, i in ev.expected.order_sensitive]
    return verdict("Oracle: input is order-insensitive", bad,
                   "folding each aggregate's messages in opposite orders gives the same "
                   "result")


def check_orders(ev: Evidence) -> Check:
    def summary(expected: dict[str, dict[str, Any]]) -> str:
        by = Counter(str(s.get("status")) for s in expected.values())
        parts = ", ".join(f"{fmt(n)} {k}" for k, n in sorted(by.items()))
        return f"{fmt(len(expected))} orders: {parts}"

    return _field_check(ev, "Every order status = oracle", "Order", "status", summary)


def check_customers(ev: Evidence) -> Check:
    def summary(expected: dict[str, dict[str, Any]]) -> str:
        reserved = sum(int(s.get("reserved") or 0) for s in expected.values())
        return f"{fmt(len(expected))} customers, {fmt(reserved)} reserved in total"

    check = _field_check(ev, "Every customer's reserved credit = oracle", "Customer",
                         "reserved", summary)
    over = [f"{aid}: reserved {s.get('reserved')} > limit {s.get('credit_limit')}"
            for aid, d in sorted(ev.store.of_type("Customer").items())
            for s in [state_of(d)]
            if int(s.get("reserved") or 0) > int(s.get("credit_limit") or 0)]
    if over:
        return Check(check.name, False, f"over the credit limit: {'; '.join(over[:SHOW])}")
    return check if not check.passed else Check(check.name, True,
                                                 check.detail + "; none over its limit")


def check_timers(ev: Evidence) -> Check:
    """Every aggregate's pending timers (its document's ``timers``) are the oracle's: the
    same keys, and per key the same message (type, target, payload) scheduled by the same
    message; each is due as scheduled (``due - scheduled_at`` is the ``Schedule``'s
    ``after``, or ``due`` its ``at``) and its id is ``timer_message_id`` of its stored
    fields."""
    problems: list[str] = []
    keys = {k for k, d in ev.store.documents.items() if d.get(F_TIMERS)} | set(ev.expected.timers)
    for key in sorted(keys):
        doc = ev.store.documents.get(key) or {}
        stored = [bson_plain(dict(t)) for t in doc.get(F_TIMERS) or []]
        got = {str(t.get("timer")): t for t in stored}
        want = ev.expected.timers.get(key, {})
        where = f"{key[0]}/{key[1]}"
        if len(got) != len(stored):
            problems.append(f"{where}: {len(stored)} timers for {len(got)} keys")
        problems += [f"{where}: timer {k!r} missing" for k in sorted(want.keys() - got.keys())]
        problems += [f"{where}: unexpected timer {k!r} ({got[k].get('type')})"
                     for k in sorted(got.keys() - want.keys())]
        for k in sorted(want.keys() & got.keys()):
            problems += [f"{where}: timer {k!r}: {p}"
                         for p in _timer_problems(key, got[k], want[k])]
    scheduled = sum(ev.expected.scheduled.values())
    pending = [t for timers in ev.expected.timers.values() for t in timers.values()]
    ok = (f"{fmt(scheduled)} scheduled, {fmt(scheduled - len(pending))} cancelled or "
          f"replaced, {fmt(len(pending))} pending = oracle")
    if pending:
        afters = sorted({str(t.after) for t in pending if t.after is not None})
        ok += (f"; each due {' / '.join(afters) or 'at its time'} after scheduling, ids "
               "recomputed")
    return verdict("Pending timers = oracle", problems, ok)


def _timer_problems(key: Key, stored: dict[str, Any], want: PendingTimer) -> list[str]:
    target = stored.get("target") or {}
    out = [f"{name} {got!r}, expected {exp!r}" for name, got, exp in (
        ("type", stored.get("type"), want.type),
        ("target", (target.get("type"), target.get("id")), want.target),
        ("payload", stored.get("payload"), want.payload),
        ("causation_id", stored.get("causation_id"), want.causation_id),
    ) if got != exp]
    due, at = stored.get("due"), stored.get("scheduled_at")
    if not (isinstance(due, datetime) and isinstance(at, datetime)):
        return [*out, f"due {due!r}, scheduled_at {at!r}: not times"]
    # Both are BSON dates (whole milliseconds): a delay of whole milliseconds is exact.
    if want.after is not None and abs(due - at - want.after) >= timedelta(milliseconds=1):
        out.append(f"due {due - at} after scheduling, expected {want.after}")
    if want.at is not None and due != stored_due(want.at):  # rounded up to the ms
        out.append(f"due {due}, expected {stored_due(want.at)}")
    tid = timer_message_id(key[0], key[1], str(stored.get("timer")), due,
                           str(stored.get("causation_id")))
    if stored.get("id") != tid:
        out.append(f"id {stored.get('id')}, recomputed {tid}")
    return out


def _letter_key(doc: Mapping[str, Any]) -> str:
    if doc.get("message_id"):
        return str(doc["message_id"])
    return raw_message_id(str(doc.get("raw") or ""))


def check_dead_letters(ev: Evidence) -> Check:
    stored = {_letter_key(d): str(d.get("reason")) for d in ev.store.dead_letters}
    want = ev.expected.dead
    problems = [f"{k}: {stored.get(k, 'missing')}, expected {r}"
                for k, r in sorted(want.items()) if stored.get(k) != r]
    problems += [f"{k}: unexpected dead letter ({r})" for k, r in sorted(stored.items())
                 if k not in want]
    by = Counter(want.values())
    ok = f"{fmt(len(want))} as expected: " + ", ".join(f"{r} ×{n}" for r, n in sorted(by.items()))
    return verdict("Dead letters = oracle", problems, ok)


def check_round_counts(ev: Evidence) -> Check:
    seen: set[str] = set()
    problems: list[str] = []
    for r in ev.run.rounds:
        want = expected_round_counts(r.lines, ev.registry, ev.expected, seen=seen).as_dict()
        got = {k: r.counts.get(k, 0) for k in want if k != "input"}
        for k, v in got.items():
            if v != want[k]:
                problems.append(f"round {r.number}: {k} {v}, expected {want[k]}")
    if ev.run.rounds and len(ev.run.rounds) < len(ev.expected.generations):
        problems.append(f"{len(ev.run.rounds)} rounds ran, the cascade needs "
                        f"{len(ev.expected.generations)}")
    return verdict("Outcome counts per round = oracle", problems,
                   f"{plural(len(ev.run.rounds), 'round')}; applied per round: "
                   + " / ".join(fmt(r.counts.get("applied", 0)) for r in ev.run.rounds))


def check_nothing_pending(ev: Evidence) -> Check:
    """The run settled, and nothing waits in an outbox or in the parked collection. Pending
    timers are no outbox entries: they wait for their due time (:func:`check_timers`)."""
    problems: list[str] = []
    if not ev.run.settled:
        problems.append("stopped by --max-rounds while messages were still flowing")
    if ev.store.parked:
        reasons = Counter(str(p.get("reason")) for p in ev.store.parked)
        problems.append(f"{fmt(len(ev.store.parked))} parked message(s): {dict(reasons)}")
    if ev.store.pending_outbox:
        problems.append(f"{fmt(ev.store.pending_outbox)} outbox entries pending")
    timers = ev.store.pending_timers
    return verdict("Nothing pending (no parked message, no outbox entry)", problems,
                   f"settled after {plural(len(ev.run.rounds), 'round')}"
                   + (f"; {plural(timers, 'timer')} not due yet (not outbox entries)"
                      if timers else ""))
