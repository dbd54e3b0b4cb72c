"""Golden file of what aggbox derives for a fixed input: emitted message ids, outbox entries,
inbox payload hashes, high-water keys and the stored documents (issue 13: "emitted message
ids for the same input are byte-identical to today's").

Emitted ids are a published contract (docs/design.md "Outbox ids"): a change of the id
scheme is a breaking change and needs a versioned scheme. Hot-path work (cheaper hashing,
id derivation, update building) must leave every figure here unchanged.

The input is fixed: both aggregate types of :mod:`aggbox.examples.orders` (plus a
test-local type emitting several entries per message, some with topic, key, headers,
schema version and target); aggregate, message and source ids containing ``/``, ``$``,
``.``, ``%`` and non-ASCII text; a redelivery, a reused id with another payload, a credit
limit exceeded, a handler error, and emitted entries fed back as input the way the
dispatcher publishes them. The clock is fixed. Three runs:

- ``harness``: every message through :class:`aggregates.testing.AggregateHarness`, one per
  aggregate (the fold, in memory);
- ``writer``: the same input through :class:`aggregates.StoreWriter` on the in-memory
  database (``pipeline_depth=1``), then the stored documents and outcomes;
- ``writer_small_inbox``: the Customers' input through the writer with an inbox window of
  2, so ids and payload hashes also go through the inbox archive (its documents too).

The golden file is ``tests/aggregates/golden/emitted_ids.json``. It was generated once from
the code of 2026-11-23, before the hot-path work of issue 13. Regenerate it ONLY for an
intended, versioned change of the id scheme or of the document layout, and say so in the
change:

    .venv/bin/python tests/aggregates/test_golden_ids.py --update-golden
"""

from __future__ import annotations

import copy
import json
import sys
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, cast

from aggbox.examples.orders import customers, orders
from aggregates import (
    AggboxSettings,
    AggregateType,
    Emit,
    Handled,
    Inbox,
    Message,
    Registry,
    StoreWriter,
)
from aggregates.testing import AggregateHarness, memory_database


@dataclass(frozen=True)
class Fan:
    spread: int = 0


#: A test-local type that emits several entries per message (the example's handlers emit
#: at most one, so index ≥ 1 of the id derivation would go unchecked), with and without
#: topic, key, headers, schema version and target.
fans = AggregateType("Fan", state=Fan, collection="fans")


@fans.handles("Spread")
def spread(state: Fan, msg: Message) -> Handled[Fan]:
    k = int(msg.payload["k"])
    emits = [Emit("Spread.Out", {"i": i, "note": "ü/$.%"}, to=("Order", f"o/{i}"),
                  topic="fan.out", key=f"k/{i}", headers={"h.1": "v$"}, schema_version=2)
             if i % 2 else Emit("Plain", {"i": i, "at": msg.payload.get("at")})
             for i in range(k)]
    return replace(state, spread=state.spread + k), emits


REGISTRY = Registry([customers, orders, fans])
GOLDEN = Path(__file__).parent / "golden" / "emitted_ids.json"
NOW = datetime(2026, 11, 23, 8, 0, 0, 123000, tzinfo=UTC)
T0 = datetime(2026, 11, 1, tzinfo=UTC)

#: Customer ids (and their registration message ids): '/', '$', '.', '%', non-ASCII.
CUSTOMERS = ["c-1", "c/2", "c$3", "c.4", "c%5", "ç-ünï-漢字-😀", "a/b.c$d%e"]
#: Message ids of the OrderCreated messages per customer: same shapes.
ORDER_MSG_IDS = ["oc/1", "oc$2", "oc.3", "oc-ü-4"]
#: Source ids of the PlaceOrder messages (the Orders use high-water dedup: per source).
SOURCES = ["web", "shop/eu", "app$2", "pos.7", "kiosk-ß"]


def _env(message_id: str, type: str, atype: str, aid: str, payload: dict[str, Any],
         at: datetime, *, source: tuple[str, str, int] | None = None,
         correlation_id: str | None = None) -> Message:
    return Message.from_dict({
        "message_id": message_id, "type": type, "aggregate_type": atype,
        "aggregate_id": aid, "payload": payload, "occurred_at": at,
        "source": None if source is None else
        {"type": source[0], "id": source[1], "seq": source[2]},
        "correlation_id": correlation_id,
    })


def customer_input() -> list[Message]:
    msgs: list[Message] = []
    tick = iter(range(1, 10_000))
    for i, cid in enumerate(CUSTOMERS):
        msgs.append(_env(f"reg/{cid}", "CustomerRegistered", "Customer", cid,
                         {"name": f"Kunde {cid}", "credit_limit": 250 + 50 * i},
                         T0 + timedelta(seconds=next(tick))))
        for k, mid in enumerate(ORDER_MSG_IDS):
            msgs.append(_env(f"{mid}@{cid}", "OrderCreated", "Customer", cid,
                             {"order_id": f"o/{cid}/{k}", "amount": 60 + 40 * k},
                             T0 + timedelta(seconds=next(tick)),
                             correlation_id=f"corr.{k}" if k % 2 else None))
    # A redelivery (same id, same payload): duplicate. A reused id, other payload: dead
    # letter with both payload hashes in its detail.
    first = msgs[1]
    msgs.append(first)
    msgs.append(_env(first.message_id, "OrderCreated", "Customer", first.aggregate_id,
                     {"order_id": "o/other", "amount": 1},
                     T0 + timedelta(seconds=next(tick))))
    return msgs


def fan_input() -> list[Message]:
    return [_env(f"spread/{i}.$", "Spread", "Fan", f"fan/{i}", {"k": k, "at": f"t{i}"},
                 T0 + timedelta(hours=i + 1))
            for i, k in enumerate([3, 1, 4, 0, 2])]


def order_input() -> list[Message]:
    msgs: list[Message] = []
    for i, src in enumerate(SOURCES):
        oid = f"ord/{i}.{src}"
        msgs.append(_env(f"place-{i}$/{src}", "PlaceOrder", "Order", oid,
                         {"customer_id": CUSTOMERS[i % len(CUSTOMERS)], "amount": 10 + i},
                         T0 + timedelta(minutes=i + 1), source=("Shop", src, i + 1),
                         correlation_id=f"checkout/{i}"))
    # An amount ≤ 0: the handler raises (handler_error, dead-lettered).
    msgs.append(_env("place-bad", "PlaceOrder", "Order", "ord/bad",
                     {"customer_id": "c-1", "amount": 0}, T0 + timedelta(minutes=30),
                     source=("Shop", "web", 99)))
    return msgs


def as_input(outbox: list[dict[str, Any]]) -> list[Message]:
    """Emitted entries as the dispatcher publishes them (an envelope with the entry's id,
    target, source and correlation id), fed back as input."""
    out: list[Message] = []
    for e in outbox:
        target = e.get("target")
        if not target:
            continue
        src = e["source"]
        out.append(_env(e["id"], e["type"], target["type"], target["id"], e["payload"],
                        e["created_at"], source=(src["type"], src["id"], src["seq"]),
                        correlation_id=e["correlation_id"]))
    return out


def _plain(value: Any) -> Any:
    """JSON-safe, deterministic: datetimes as ISO text (UTC), tuples as lists."""
    if isinstance(value, datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=UTC)
        return value.astimezone(UTC).isoformat()
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


# -- the harness run ---------------------------------------------------------------------


def run_harness() -> dict[str, Any]:
    harnesses: dict[tuple[str, str], AggregateHarness[Any]] = {}
    steps: list[dict[str, Any]] = []

    def feed(msgs: list[Message]) -> list[dict[str, Any]]:
        emitted: list[dict[str, Any]] = []
        for m in msgs:
            atype = REGISTRY.get(m.aggregate_type)
            h = harnesses.get((atype.name, m.aggregate_id))
            if h is None:
                h = harnesses[(atype.name, m.aggregate_id)] = AggregateHarness(
                    atype, aggregate_id=m.aggregate_id, now=NOW)
            step = h.when(m)
            emitted.extend(step.emitted)
            steps.append({"aggregate": [atype.name, m.aggregate_id],
                          "message_id": m.message_id, "outcome": step.outcome,
                          "reason": step.reason,
                          "emitted_ids": [e["id"] for e in step.emitted]})
        return emitted

    # Fans spread (several emits each, not fed back); Orders placed (emitting OrderCreated
    # to Customers); Customers registered and sent orders directly; then the placed
    # orders' OrderCreated delivered to the Customers, and every Customer reply
    # (CreditReserved / CreditLimitExceeded) delivered to the Orders.
    feed(fan_input())
    placed = feed(order_input())
    replies = feed(customer_input())
    replies += feed(as_input(placed))
    feed(as_input(replies))
    aggregates: list[dict[str, Any]] = []
    for (tname, aid), h in sorted(harnesses.items()):
        snap = h.snapshot
        aggregates.append({
            "aggregate": [tname, aid], "version": snap.version, "seq": snap.seq,
            "state": snap.state, "inbox": snap.dedup.inbox, "hw": snap.dedup.hw,
            "outbox": h.outbox,
            "dead_letters": [[d.message.message_id if d.message else None, d.reason]
                             for d in h.dead_letters],
        })
    return cast(dict[str, Any], _plain({"steps": steps, "aggregates": aggregates}))


# -- the store writer run ----------------------------------------------------------------


def run_writer() -> dict[str, Any]:
    db = memory_database("aggbox_golden")
    writer = StoreWriter(db, REGISTRY, settings=AggboxSettings(pipeline_depth=1),
                         clock=lambda: NOW)
    writer.ensure_indexes()

    def pending(atype: Any) -> list[dict[str, Any]]:
        # The dispatcher publishes in outbox order per aggregate (aggregates here by id).
        docs = sorted(db[atype.collection].find(), key=lambda d: d["_id"])
        return [e for d in docs for e in d.get("outbox") or []]

    # The same sequence as the harness run (see run_harness).
    outcomes = writer.process(fan_input())
    outcomes += writer.process(order_input())
    outcomes += writer.process(customer_input())
    outcomes += writer.process(as_input(pending(orders)))
    outcomes += writer.process(as_input(pending(customers)))
    documents = {atype.name: sorted(db[atype.collection].find(), key=lambda d: d["_id"])
                 for atype in REGISTRY}
    return cast(dict[str, Any], _plain({
        "outcomes": [[o.aggregate_type, o.aggregate_id, o.message_id, o.outcome, o.reason,
                      list(o.emitted_ids)] for o in outcomes],
        "documents": documents,
    }))


def run_writer_small_inbox() -> dict[str, Any]:
    """The Customers' input through the writer with an inbox window of 2, so most ids (and
    their payload hashes) move to the inbox archive: the archive's documents too."""
    small = copy.copy(customers)
    small.dedup = Inbox(window=2)
    settings = AggboxSettings(pipeline_depth=1)
    db = memory_database("aggbox_golden_small")
    writer = StoreWriter(db, Registry([small, orders]), settings=settings, clock=lambda: NOW)
    writer.ensure_indexes()
    # One message per write: each write evicts what the window no longer holds.
    outcomes = [o for m in customer_input() for o in writer.process([m])]
    side = {settings.dead_letter_collection, settings.parked_collection}
    collections = {name: sorted(db[name].find(), key=lambda d: str(d["_id"]))
                   for name in sorted(db.list_collection_names()) if name not in side}
    return cast(dict[str, Any], _plain({
        "outcomes": [[o.aggregate_type, o.aggregate_id, o.message_id, o.outcome, o.reason,
                      list(o.emitted_ids)] for o in outcomes],
        "collections": collections,
    }))


def current() -> dict[str, Any]:
    return {"harness": run_harness(), "writer": run_writer(),
            "writer_small_inbox": run_writer_small_inbox()}


def render(data: dict[str, Any]) -> str:
    return json.dumps(data, sort_keys=True, ensure_ascii=False, indent=1) + "\n"


def test_emitted_ids_match_the_golden_file() -> None:
    got = current()
    golden = json.loads(GOLDEN.read_text(encoding="utf-8"))
    # Structural comparison first (pytest shows where), then byte for byte.
    assert got == golden, (f"output differs from {GOLDEN.name}; ids are a published contract "
                           "(see this module's docstring)")
    assert render(got) == GOLDEN.read_text(encoding="utf-8")


def test_the_input_covers_what_the_golden_file_is_for() -> None:
    """The fixed input really exercises emits, both dedup strategies, a duplicate, a reused
    id, a handler error, the inbox archive and special characters (a guard against a
    silently thin golden)."""
    data = json.loads(GOLDEN.read_text(encoding="utf-8"))
    steps = data["harness"]["steps"]
    outcomes = {s["outcome"] for s in steps}
    assert {"applied", "duplicate", "dead_lettered"} <= outcomes
    emitted = [i for s in steps for i in s["emitted_ids"]]
    assert len(emitted) >= 30 and len(set(emitted)) == len(emitted)
    assert any(s["aggregate"][0] == "Order" and s["message_id"] in emitted for s in steps)
    ids = " ".join(s["message_id"] + s["aggregate"][1] for s in steps)
    for ch in "/$.%ü😀":
        assert ch in ids
    assert all(len(e[2]) == 12 for a in data["harness"]["aggregates"] for e in a["inbox"])
    archived = [d for name, docs in data["writer_small_inbox"]["collections"].items()
                if "archive" in name for d in docs]
    assert len(archived) >= 10


if __name__ == "__main__":
    if sys.argv[1:] != ["--update-golden"]:
        sys.exit(f"usage: python {sys.argv[0]} --update-golden  (see the module docstring)")
    GOLDEN.parent.mkdir(parents=True, exist_ok=True)
    GOLDEN.write_text(render(current()), encoding="utf-8")
    print(f"wrote {GOLDEN}")
