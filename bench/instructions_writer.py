"""The writer's components as loops of their own, for bench/instructions.py (callgrind).

Input: bench/writer.py's messages (``aggbox.examples.orders``: per aggregate one
``CustomerRegistered`` and ``per - 1`` ``OrderCreated``, each of those emitting one
``CreditReserved`` — an outbox entry), every aggregate new. The set-up builds
the inputs of every component for ``n_max`` messages; a loop covers messages
[start, stop) (whole aggregates).
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

PER = 5
NOW = datetime(2026, 1, 2, tzinfo=UTC)
#: Component → what its loop does, per message (or per aggregate of ``PER`` messages).
COMPONENTS = {
    "parse": "JSON line → Message: the executor's parse (spark.executor.parse_rows; "
             "native when the core is in use, AGGBOX_PURE=1: Python's)",
    "handlers": "the domain's handler functions alone (typed payloads parsed in set-up)",
    "dedup": "the Inbox strategy: payload hash, decide and record per message, changes",
    "outbox_ids": "emitted_message_id, one per message",
    "fold": "fold() of each aggregate's messages (handlers, dedup and ids included)",
    "update": "build_update of each folded aggregate (an InsertOne: all are new)",
    "bson": "bson.encode of each update's document",
    "pymongo": "bulk_write_unordered of the updates, 500 per bulk (client side)",
    "writer": "StoreWriter.process, pipeline_depth=1: read, fold, write, outcomes",
    "executor": "the mapInArrow function over the Arrow batch: parse, writer, outcome batch",
}


def message_dicts(n_aggs: int, per: int) -> list[dict[str, Any]]:
    """The messages of bench/writer.py as dicts (``Message.from_dict``'s input)."""
    out: list[dict[str, Any]] = []
    for a in range(n_aggs):
        cid = f"c{a}"
        out.append({
            "message_id": f"reg-{a}", "type": "CustomerRegistered", "aggregate_type": "Customer",
            "aggregate_id": cid, "payload": {"name": f"Customer {a}", "credit_limit": 1000},
            "occurred_at": "2026-01-01T00:00:00Z"})
        for k in range(per - 1):
            out.append({
                "message_id": f"o-{a}-{k}", "type": "OrderCreated", "aggregate_type": "Customer",
                "aggregate_id": cid, "payload": {"order_id": f"o-{a}-{k}", "amount": 100 + k},
                "occurred_at": f"2026-01-01T00:00:{k + 1:02d}Z"})
    return out


DERIVED = {
    "writer_own": "writer − handlers: the writer's instructions, handlers excluded",
    "executor_own": "executor − handlers: the executor's Python per message (issue 41)",
    "fold_rest": "fold − handlers − dedup − outbox_ids: the fold's own steps",
}


def derived(per_msg: dict[str, int]) -> dict[str, int]:
    out: dict[str, int] = {}
    if "writer" in per_msg and "handlers" in per_msg:
        out["writer_own"] = per_msg["writer"] - per_msg["handlers"]
    if "executor" in per_msg and "handlers" in per_msg:
        out["executor_own"] = per_msg["executor"] - per_msg["handlers"]
    if all(k in per_msg for k in ("fold", "handlers", "dedup", "outbox_ids")):
        out["fold_rest"] = (per_msg["fold"] - per_msg["handlers"] - per_msg["dedup"]
                            - per_msg["outbox_ids"])
    return out


def _client(uri: str | None) -> Any:
    from pymongo import MongoClient

    if not uri:
        raise SystemExit("components pymongo and writer need a server (AGGBOX_BENCH_URI)")
    # One heartbeat an hour, polled: none falls inside one run and not the other.
    return MongoClient(uri, tz_aware=True, heartbeatFrequencyMS=3_600_000,
                       serverMonitoringMode="poll")


def _database(client: Any) -> Any:
    """A database of this process (the repetitions run at once), dropped first; the name's
    length is the same in every process."""
    import os

    db = client[f"bench_instr_{os.getpid() % 10**7:07d}"]
    client.drop_database(db.name)
    return db


def setup(n_max: int, uri: str | None, components: list[str]) -> dict[str, Any]:
    """The inputs of ``components`` for ``n_max`` messages."""
    import pyarrow as pa

    from aggbox.examples.orders import customers, registry
    from aggregates import AggboxSettings, Message, StoreWriter
    from aggregates.fold import fold
    from aggregates.fold.document import snapshot_from_document
    from aggregates.store.writer import build_update

    dicts = message_dicts(n_max // PER, PER)
    lines = [json.dumps(d, separators=(",", ":")) for d in dicts]
    nothing = pa.array([None] * len(lines), pa.string())
    ctx: dict[str, Any] = {
        "atype": customers, "max_payload": AggboxSettings().max_payload_bytes,
        "batch": pa.RecordBatch.from_pydict({"_raw": pa.array(lines, pa.string()),
                                             "_reason": nothing, "_detail": nothing})}
    messages = [Message.from_dict(d) for d in dicts]
    ctx["messages"] = messages
    groups = [(snapshot_from_document(None, messages[i].aggregate_id), messages[i:i + PER])
              for i in range(0, len(messages), PER)]
    ctx["groups"] = groups
    ctx["calls"] = _handler_calls(customers, messages)
    ctx["folded"] = [(snap, fold(customers, snap, msgs, now=NOW)) for snap, msgs in groups]
    ctx["ops"] = [build_update(customers, snap, res.changes) for snap, res in ctx["folded"]]
    if {"pymongo", "writer", "executor"} & set(components):
        ctx["client"] = client = _client(uri)
        ctx["db"] = db = _database(client)
        ctx["coll"] = db[customers.collection + "_raw"]
        ctx["writer"] = StoreWriter(db, registry, settings=AggboxSettings(
            database=db.name, pipeline_depth=1))
        ctx["writer"].ensure_indexes()
        import spark.executor
        from spark.executor import WriterTask

        # The executor's task as the pipeline ships it (counts on the last row); its own
        # database, so its aggregates are new as the writer's are; the quiet client above.
        assert uri is not None
        spark.executor._clients[uri] = client
        ctx["task"] = WriterTask(uri, "aggbox.examples.orders",
                                 {"database": db.name + "x", "pipeline_depth": 1},
                                 stats=True)
    return ctx


def teardown(ctx: dict[str, Any]) -> None:
    if "client" in ctx:
        ctx["client"].drop_database(ctx["db"].name)
        ctx["client"].drop_database(ctx["db"].name + "x")
        ctx["client"].close()


def _handler_calls(atype: Any, messages: list[Any]) -> list[tuple[Any, tuple[Any, ...]]]:
    """(function, arguments) of each message's handler, as the fold calls it: a typed
    handler's payload parsed here (aggbox's work, not the handler's)."""
    state0 = atype.load_state(None)
    calls: list[tuple[Any, tuple[Any, ...]]] = []
    state = state0
    for m in messages:  # OrderCreated runs on the state its CustomerRegistered made
        h = atype.handler_for(m.type)
        if hasattr(h, "fn") and hasattr(h, "parse"):  # a TypedHandler
            calls.append((h.fn, (state, h.parse(m), m)))
        else:
            calls.append((h, (state0, m)))
            state = h(state0, m)
    return calls


def run(ctx: dict[str, Any], component: str, start: int, stop: int) -> None:
    """``component``'s loop over messages [start, stop) (whole aggregates)."""
    atype, g0, g1 = ctx["atype"], start // PER, stop // PER
    if component == "parse":  # spark.executor._Partition.parse, dead letters aside
        from spark.executor import parse_rows
        from spark.records import Rows

        messages, failed = parse_rows(Rows(ctx["batch"].slice(start, stop - start)),
                                      ctx["max_payload"])
        assert len(messages) == stop - start, len(failed)
    elif component == "handlers":
        for fn, args in ctx["calls"][start:stop]:
            fn(*args)
    elif component == "dedup":
        from aggregates.core.ids import payload_hash

        strategy = atype.dedup
        for snap, msgs in ctx["groups"][g0:g1]:
            rec = snap.dedup.copy()
            for m in msgs:
                ph = payload_hash(m.payload) if strategy.uses_payload_hash else ""
                strategy.decide(rec, m, ph, NOW)
                strategy.record(rec, m, ph)
            strategy.changes(rec)
    elif component == "outbox_ids":
        from aggregates.core.ids import emitted_message_id

        for m in ctx["messages"][start:stop]:
            emitted_message_id("Customer", m.aggregate_id, m.message_id, 0)
    elif component == "fold":
        from aggregates.fold import fold

        for snap, msgs in ctx["groups"][g0:g1]:
            fold(atype, snap, msgs, now=NOW)
    elif component == "update":
        from aggregates.store.writer import build_update

        for snap, res in ctx["folded"][g0:g1]:
            build_update(atype, snap, res.changes)
    elif component == "bson":
        import bson

        for op in ctx["ops"][g0:g1]:
            bson.encode(op._doc)
    elif component == "pymongo":
        from aggregates.core.bulk import bulk_write_unordered

        ops = ctx["ops"][g0:g1]
        for i in range(0, len(ops), 500):
            bulk_write_unordered(ctx["coll"], ops[i:i + 500])
    elif component == "executor":
        from spark.executor import write_partition

        out = write_partition(ctx["task"], iter([ctx["batch"].slice(start, stop - start)]))
        assert sum(b.num_rows for b in out) == stop - start
    elif component == "writer":
        outcomes = ctx["writer"].process(ctx["messages"][start:stop])
        assert len(outcomes) == stop - start, len(outcomes)
    else:
        raise SystemExit(f"unknown component {component!r}: {', '.join(COMPONENTS)}")
