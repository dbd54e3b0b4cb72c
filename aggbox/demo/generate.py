"""The demo's input: customers with credit limits, their orders, duplicates, reordering and a
few deliberately bad rows, as JSON Lines files.

Why the expected result does not depend on processing order
-----------------------------------------------------------
A customer approves an order when ``reserved + amount <= credit_limit``. Which of several
orders still fits generally depends on the order in which the customer sees their
``OrderCreated`` messages — i.e. on timing in Spark and in the dispatcher. The generator
removes that dependence by construction. Per customer it draws

- *normal* orders and sets the credit limit to at least the sum of their amounts (sometimes
  exactly that sum, to exercise the boundary): whatever subset was reserved before, one
  more normal order still fits, so every normal order is approved, in any order;
- *oversized* orders whose amount alone exceeds the credit limit: they never fit (reserved
  credit is never negative), so every oversized order is rejected, in any order.

The final reserved credit is then the sum of the normal orders, and every order's status is
known in advance. :mod:`aggbox.demo.oracle` still computes the expected result by folding
the messages with the domain's handlers (and checks the claim by folding twice, in opposite
orders).

Bad rows, each present exactly once, each ending as a dead letter with a known reason:
a truncated JSON line, a ``PlaceOrder`` with amount 0 (the handler raises), a message type
the ``Order`` aggregate has no handler for, and an unknown aggregate type.
"""

from __future__ import annotations

import json
import math
import random
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Final

from aggbox.demo.errors import DemoError
from aggbox.examples.orders.domain import customers as customer_type
from aggregates.core.reasons import Reason

__all__ = [
    "BadRow",
    "CustomerPlan",
    "OrderPlan",
    "Scenario",
    "ScenarioSpec",
    "envelope_line",
    "generate",
    "write_lines",
]

_EPOCH: Final = datetime(2026, 1, 1, tzinfo=UTC)
#: Amounts of normal orders.
_AMOUNT_MIN: Final = 10
_AMOUNT_MAX: Final = 500
#: Credit left over above the sum of a customer's normal orders (0 = exactly the sum).
_SLACK_MAX: Final = 300
_EXACT_LIMIT_RATE: Final = 0.2


@dataclass(frozen=True, slots=True, kw_only=True)
class ScenarioSpec:
    """How much input, how dirty. ``duplicate_rate`` is the number of extra (redelivered)
    copies as a fraction of the distinct valid messages; copies are exact."""

    customers: int = 200
    orders: int = 2000
    duplicate_rate: float = 0.2
    oversized_rate: float = 0.15
    reorder: bool = True
    bad_rows: bool = True
    files: int = 4
    seed: int = 1

    def check(self) -> None:
        if self.customers < 1:
            raise DemoError(f"--customers {self.customers}: at least 1 customer is needed")
        if self.orders < 0:
            raise DemoError(f"--orders {self.orders}: must be ≥ 0")
        if not 0.0 <= self.duplicate_rate <= 10.0:
            raise DemoError(f"--duplicate-rate {self.duplicate_rate}: use a fraction between "
                            "0 and 10 (0.2 = 20% extra copies)")
        if not 0.0 <= self.oversized_rate <= 1.0:
            raise DemoError(f"oversized_rate {self.oversized_rate}: must be between 0 and 1")
        if self.files < 1:
            raise DemoError(f"--files {self.files}: at least 1 input file is needed")


@dataclass(frozen=True, slots=True)
class CustomerPlan:
    customer_id: str
    name: str
    credit_limit: int


@dataclass(frozen=True, slots=True)
class OrderPlan:
    order_id: str
    customer_id: str
    amount: int
    #: the amount alone exceeds the customer's credit limit
    oversized: bool


@dataclass(frozen=True, slots=True)
class BadRow:
    line: str
    #: the dead-letter reason code it must end with
    reason: str
    description: str


@dataclass(frozen=True, slots=True)
class Scenario:
    """A generated input. ``lines`` is the input in file order: every valid message once,
    ``duplicates`` extra copies and the bad rows."""

    spec: ScenarioSpec
    customers: tuple[CustomerPlan, ...]
    orders: tuple[OrderPlan, ...]
    messages: tuple[dict[str, Any], ...]
    lines: tuple[str, ...]
    duplicates: int
    bad_rows: tuple[BadRow, ...] = field(default=())

    def files(self) -> list[list[str]]:
        """``lines`` cut into ``spec.files`` contiguous parts (fewer if there are few lines)."""
        size = max(1, math.ceil(len(self.lines) / self.spec.files))
        return [list(self.lines[i:i + size]) for i in range(0, len(self.lines), size)]


def envelope_line(envelope: dict[str, Any]) -> str:
    """One JSON Lines record (compact, keys in envelope order)."""
    return json.dumps(envelope, separators=(",", ":"), ensure_ascii=False)


def _at(seconds: int) -> str:
    return (_EPOCH + timedelta(seconds=seconds)).isoformat().replace("+00:00", "Z")


def _ids(prefix: str, n: int) -> list[str]:
    width = max(4, len(str(n)))
    return [f"{prefix}-{i:0{width}d}" for i in range(1, n + 1)]


def generate(spec: ScenarioSpec) -> Scenario:
    """Draw a scenario from ``spec`` (same spec and seed → same scenario)."""
    spec.check()
    rng = random.Random(spec.seed)
    customer_ids = _ids("c", spec.customers)
    order_ids = _ids("o", spec.orders)
    owner = [customer_ids[rng.randrange(spec.customers)] for _ in order_ids]
    _check_inbox_window(Counter(owner))
    oversized = [rng.random() < spec.oversized_rate for _ in order_ids]
    amounts: dict[str, int] = {}
    normal_sum: Counter[str] = Counter()
    for oid, cid, big in zip(order_ids, owner, oversized, strict=True):
        if not big:
            amounts[oid] = rng.randint(_AMOUNT_MIN, _AMOUNT_MAX)
            normal_sum[cid] += amounts[oid]
    plans: list[CustomerPlan] = []
    for n, cid in enumerate(customer_ids, 1):
        if normal_sum[cid]:
            slack = 0 if rng.random() < _EXACT_LIMIT_RATE else rng.randint(1, _SLACK_MAX)
            limit = normal_sum[cid] + slack
        else:
            limit = rng.randint(100, 1000)
        plans.append(CustomerPlan(cid, f"Customer {n}", limit))
    limits = {p.customer_id: p.credit_limit for p in plans}
    orders: list[OrderPlan] = []
    for oid, cid, big in zip(order_ids, owner, oversized, strict=True):
        amount = limits[cid] + rng.randint(1, limits[cid]) if big else amounts[oid]
        orders.append(OrderPlan(oid, cid, amount, big))

    messages = [_registered(p, t) for t, p in enumerate(plans)]
    messages += [_place(o, len(plans) + t) for t, o in enumerate(orders)]
    valid = [envelope_line(m) for m in messages]
    copies = round(spec.duplicate_rate * len(valid))
    extra = [valid[rng.randrange(len(valid))] for _ in range(copies)]
    bad = _bad_rows(plans, orders, valid, len(messages)) if spec.bad_rows else []
    if spec.reorder:
        lines = valid + extra + [b.line for b in bad]
        rng.shuffle(lines)
    else:
        # Natural order; the copies come later (a redelivery), the bad rows in between.
        lines = valid + extra
        for b in bad:
            lines.insert(rng.randint(0, len(lines)), b.line)
    return Scenario(spec=spec, customers=tuple(plans), orders=tuple(orders),
                    messages=tuple(messages), lines=tuple(lines), duplicates=copies,
                    bad_rows=tuple(bad))


def _check_inbox_window(per_customer: Counter[str]) -> None:
    """Every message a customer applies must stay in its inbox for the checks (and so that
    a late redelivery is recognised, not dead-lettered beyond the dedup horizon)."""
    window = getattr(customer_type.dedup, "window", None)  # ids the inbox keeps
    if window is None or not per_customer:
        return
    cid, most = per_customer.most_common(1)[0]
    if most + 1 > window:
        raise DemoError(
            f"customer {cid} would get {most} orders, more than its inbox window of "
            f"{window} messages; use more --customers or fewer --orders"
        )


def _registered(p: CustomerPlan, t: int) -> dict[str, Any]:
    return {
        "message_id": f"{p.customer_id}:registered",
        "type": "CustomerRegistered",
        "aggregate_type": "Customer",
        "aggregate_id": p.customer_id,
        "payload": {"name": p.name, "credit_limit": p.credit_limit},
        "occurred_at": _at(t),
    }


def _place(o: OrderPlan, t: int) -> dict[str, Any]:
    return {
        "message_id": f"{o.order_id}:placed",
        "type": "PlaceOrder",
        "aggregate_type": "Order",
        "aggregate_id": o.order_id,
        "payload": {"customer_id": o.customer_id, "amount": o.amount},
        "occurred_at": _at(t),
        # The checkout numbers its messages per order: the Order's high-water dedup key.
        "source": {"type": "Checkout", "id": o.order_id, "seq": 1},
    }


def _bad_rows(plans: Sequence[CustomerPlan], orders: Sequence[OrderPlan],
              valid: Sequence[str], t: int) -> list[BadRow]:
    victim = valid[-1]  # a PlaceOrder when there are orders, else a registration
    some_order = orders[0].order_id if orders else "o-none"
    zero = {
        "message_id": "o-zero:placed", "type": "PlaceOrder", "aggregate_type": "Order",
        "aggregate_id": "o-zero", "payload": {"customer_id": plans[0].customer_id, "amount": 0},
        "occurred_at": _at(t), "source": {"type": "Checkout", "id": "o-zero", "seq": 1},
    }
    shipped = {
        "message_id": f"{some_order}:shipped", "type": "OrderShipped", "aggregate_type": "Order",
        "aggregate_id": some_order, "payload": {"carrier": "demo"}, "occurred_at": _at(t + 1),
        "source": {"type": "Warehouse", "id": "w-1", "seq": 1},
    }
    invoice = {
        "message_id": "inv-1:issued", "type": "InvoiceIssued", "aggregate_type": "Invoice",
        "aggregate_id": "inv-1", "payload": {"total": 100}, "occurred_at": _at(t + 2),
    }
    return [
        BadRow(victim[: len(victim) // 2], Reason.INVALID_JSON, "a truncated JSON line"),
        BadRow(envelope_line(zero), Reason.HANDLER_ERROR,
               "PlaceOrder with amount 0 (handler raises)"),
        BadRow(envelope_line(shipped), Reason.UNKNOWN_MESSAGE_TYPE,
               "OrderShipped: no handler on Order"),
        BadRow(envelope_line(invoice), Reason.UNKNOWN_AGGREGATE_TYPE,
               "an unknown aggregate type (Invoice)"),
    ]


def write_lines(directory: Path, parts: Sequence[Sequence[str]], *, stem: str = "part"
                ) -> list[Path]:
    """Write ``parts`` as ``<stem>-00.jsonl``, ``<stem>-01.jsonl``, … in ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    paths: list[Path] = []
    for i, part in enumerate(parts):
        path = directory / f"{stem}-{i:02d}.jsonl"
        path.write_text("".join(line + "\n" for line in part), encoding="utf-8")
        paths.append(path)
    return paths
