"""The demo's verdict: the store, the outcome logs and the published records against the
oracle (:mod:`.against_oracle`: order statuses, reserved credit, pending timers, dead
letters, outcome counts, nothing left in an outbox or parked) and against the six
invariants of docs/design.md "Invariants" (:mod:`.invariants`). Every check returns
PASS/FAIL with a detail line; a FAIL names the first few offenders."""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

from aggbox.demo.checks.against_oracle import (
    check_customers,
    check_dead_letters,
    check_nothing_pending,
    check_order_insensitive,
    check_orders,
    check_round_counts,
    check_timers,
)
from aggbox.demo.checks.base import Check, Evidence
from aggbox.demo.checks.invariants import (
    check_invariant_1,
    check_invariant_2,
    check_invariant_3,
    check_invariant_4,
    check_invariant_5,
    check_invariant_6,
)

__all__ = [
    "CHECKS",
    "Check",
    "Evidence",
    "check_customers",
    "check_dead_letters",
    "check_invariant_1",
    "check_invariant_2",
    "check_invariant_3",
    "check_invariant_4",
    "check_invariant_5",
    "check_invariant_6",
    "check_nothing_pending",
    "check_order_insensitive",
    "check_orders",
    "check_round_counts",
    "check_timers",
    "run_checks",
]

CHECKS: Final[tuple[Callable[[Evidence], Check], ...]] = (
    check_order_insensitive,
    check_orders,
    check_customers,
    check_timers,
    check_dead_letters,
    check_round_counts,
    check_invariant_1,
    check_invariant_2,
    check_invariant_3,
    check_invariant_4,
    check_invariant_5,
    check_invariant_6,
    check_nothing_pending,
)


def run_checks(ev: Evidence) -> list[Check]:
    """Every check, in table order."""
    return [fn(ev) for fn in CHECKS]
