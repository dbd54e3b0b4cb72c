"""What the inbox archive costs (docs/design.md "Dedup"), one run, same data.

The same messages (``--aggregates`` × ``--per``, in slices of ``--slice`` so a hot aggregate
is written several times) go through the store writer twice per configuration — first
delivery, then a full redelivery (all duplicates):

- ``wide``: ``Inbox(window ≥ per)``: nothing ever leaves the inbox (no archive traffic);
- ``narrow``: ``Inbox(window=2)``: nearly every id is archived, and every redelivery below
  the archive floor is answered by the archive (one batched query per chunk).

Prints per phase the wall time, the Python CPU time of this process, messages/s, server
operations per message (aggregate writes + archive upserts + archive look-up queries, counted
by the writer's own statistics and a command listener), and the ratios
``narrow_vs_wide_first`` / ``narrow_vs_wide_redelivery`` (messages/s; 1.0 = free). Last line
of output is JSON. Usage: python bench/inbox.py [--aggregates 2000] [--per 20] [--slice 5]
"""

from __future__ import annotations

import argparse
import json
import resource
import time
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

from pymongo import MongoClient, monitoring

from aggbox.servers import start_local_mongodb
from aggregates import AggboxSettings, AggregateType, Inbox, Message, Registry, StoreWriter


class _Ops(monitoring.CommandListener):
    def __init__(self) -> None:
        self.counts: dict[str, int] = {}

    def started(self, event: monitoring.CommandStartedEvent) -> None:
        coll = event.command.get(event.command_name)
        key = f"{event.command_name}:{'archive' if 'inbox_archive' in str(coll) else 'other'}"
        self.counts[key] = self.counts.get(key, 0) + 1

    def succeeded(self, event: monitoring.CommandSucceededEvent) -> None:
        return None

    def failed(self, event: monitoring.CommandFailedEvent) -> None:
        return None


def _registry(window: int) -> Registry:
    tally = AggregateType("Tally", state=dict, collection="tallies",
                          dedup=Inbox(window=window))

    @tally.handles("Add")
    def add(state: dict[str, Any], msg: Message) -> dict[str, Any]:
        return {"n": int(state.get("n", 0)) + int(msg.payload["n"])}

    return Registry([tally])


def _messages(n_aggs: int, per: int) -> list[Message]:
    now = datetime.now(UTC)
    out = []
    for a in range(n_aggs):
        for i in range(per):
            # Producers' clocks disagree: occurred_at is not monotonic per aggregate.
            at = now - timedelta(seconds=(i * 7919 + a) % 3600)
            out.append(Message.from_dict({
                "message_id": f"m-{a}-{i}", "type": "Add", "aggregate_type": "Tally",
                "aggregate_id": f"t{a}", "payload": {"n": 1}, "occurred_at": at}))
    return out


def _phase(w: StoreWriter, msgs: list[Message], ops: _Ops) -> dict[str, Any]:
    ops.counts.clear()
    cpu0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    outcomes = w.process(msgs)
    wall = time.perf_counter() - t0
    cpu1 = resource.getrusage(resource.RUSAGE_SELF)
    cpu = (cpu1.ru_utime - cpu0.ru_utime) + (cpu1.ru_stime - cpu0.ru_stime)
    kinds: dict[str, int] = {}
    for o in outcomes:
        kinds[o.outcome] = kinds.get(o.outcome, 0) + 1
    server_ops = sum(v for k, v in ops.counts.items()
                     if k.split(":")[0] in ("find", "update", "insert"))
    return {"wall_s": round(wall, 3), "python_cpu_s": round(cpu, 3),
            "msgs_per_s": round(len(msgs) / wall), "outcomes": kinds,
            "server_commands_per_msg": round(server_ops / len(msgs), 4),
            "archive_commands": sum(v for k, v in ops.counts.items() if k.endswith("archive"))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--aggregates", type=int, default=2000)
    ap.add_argument("--per", type=int, default=20, help="messages per aggregate")
    ap.add_argument("--slice", type=int, default=5, help="messages of one aggregate per write")
    args = ap.parse_args()
    msgs = _messages(args.aggregates, args.per)
    ops = _Ops()
    result: dict[str, Any] = {"aggregates": args.aggregates, "per": args.per,
                              "slice": args.slice}
    with start_local_mongodb() as server:
        client: MongoClient[dict[str, Any]] = MongoClient(server.uri, event_listeners=[ops])
        for name, window in (("wide", args.per + 1), ("narrow", 2)):
            db = client[f"bench_inbox_{uuid.uuid4().hex[:8]}"]
            w = StoreWriter(db, _registry(window),
                            settings=AggboxSettings(slice_messages=args.slice))
            w.ensure_indexes()
            result[f"{name}_first"] = _phase(w, msgs, ops)
            result[f"{name}_redelivery"] = _phase(w, msgs, ops)
            result[f"{name}_archived_ids"] = db.tallies_inbox_archive.count_documents({})
            client.drop_database(db.name)
            print(name, json.dumps({k: v for k, v in result.items() if k.startswith(name)}))
        client.close()
    for phase in ("first", "redelivery"):
        result[f"narrow_vs_wide_{phase}"] = round(
            result[f"narrow_{phase}"]["msgs_per_s"] / result[f"wide_{phase}"]["msgs_per_s"], 3)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
