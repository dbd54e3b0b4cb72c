"""Input generation, an independent oracle fold, and comparison with the stored documents."""

from __future__ import annotations

import dataclasses
import json
import random
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from aggregates import Emit, Message, emitted_message_id
from aggregates.fold.ordering import delivery_order
from tests.spark import domain

Envelope = dict[str, Any]
Key = tuple[str, str]

_EPOCH = datetime(2026, 1, 1, tzinfo=UTC)
_STATE = {"Account": domain.Account, "Ledger": domain.Ledger}


def at(seconds: float) -> str:
    return (_EPOCH + timedelta(seconds=seconds)).isoformat().replace("+00:00", "Z")


def make_records(
    *,
    seed: int = 1,
    accounts: int = 40,
    per_account: int = 6,
    ledgers: int = 10,
    per_ledger: int = 8,
    dup_rate: float = 0.1,
    flaky: int = 0,
    prefix: str = "",
) -> list[Envelope]:
    """Valid envelopes in a shuffled input order. Accounts are ordered by ``occurred_at``
    (with some ties, settled by input order), ledgers by ``source.seq`` (their
    ``occurred_at`` is random). Some messages appear twice (exact copies)."""
    rng = random.Random(seed)
    out: list[Envelope] = []
    for a in range(accounts):
        aid = f"{prefix}acc-{a}"
        t = rng.randint(0, 1000)
        out.append(_env(f"{aid}-open", "Opened", "Account", aid, {"owner": f"o{a}"}, at(t)))
        for i in range(per_account - 1):
            t += rng.choice([0, 1, 5])  # 0: a tie on occurred_at
            out.append(_env(f"{aid}-d{i}", "Deposited", "Account", aid,
                            {"amount": rng.randint(1, 100)}, at(t)))
    for f in range(flaky):
        aid = f"{prefix}acc-{f % max(accounts, 1)}"
        out.append(_env(f"{aid}-flaky{f}", "Flaky", "Account", aid, {}, at(5000 + f)))
    for lg in range(ledgers):
        lid = f"{prefix}led-{lg}"
        for s in range(1, per_ledger + 1):
            env = _env(f"{lid}-e{s}", "Entry", "Ledger", lid, {"n": s}, at(rng.randint(0, 9999)))
            env["source"] = {"type": "Feed", "id": f"feed-{lg}", "seq": s}
            out.append(env)
    rng.shuffle(out)
    dups = [dict(e) for e in rng.sample(out, int(len(out) * dup_rate))]
    for d in dups:
        out.insert(rng.randint(0, len(out)), d)
    return out


def _env(mid: str, mtype: str, atype: str, aid: str, payload: dict[str, Any],
         occurred_at: str) -> Envelope:
    return {"message_id": mid, "type": mtype, "aggregate_type": atype, "aggregate_id": aid,
            "payload": payload, "occurred_at": occurred_at}


def write_jsonl(path: Path, envelopes: Iterable[Envelope | str]) -> Path:
    with path.open("w", encoding="utf-8") as fh:
        for e in envelopes:
            fh.write((e if isinstance(e, str) else json.dumps(e)) + "\n")
    return path


def write_parquet(path: Path, envelopes: Sequence[Envelope]) -> Path:
    """aggbox's typed envelope layout: payload as JSON text, occurred_at as a timestamp."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = pa.schema([
        ("message_id", pa.string()), ("type", pa.string()), ("aggregate_type", pa.string()),
        ("aggregate_id", pa.string()), ("payload", pa.string()),
        ("occurred_at", pa.timestamp("us", tz="UTC")),
        ("source", pa.struct([("type", pa.string()), ("id", pa.string()),
                              ("seq", pa.int64())])),
    ])
    rows = [{
        "message_id": e["message_id"], "type": e["type"], "aggregate_type": e["aggregate_type"],
        "aggregate_id": e["aggregate_id"], "payload": json.dumps(e["payload"]),
        "occurred_at": datetime.fromisoformat(e["occurred_at"].replace("Z", "+00:00")),
        "source": e.get("source"),
    } for e in envelopes]
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), path)
    return path


# -- the oracle --------------------------------------------------------------------------


@dataclass
class Expected:
    state: dict[str, Any]
    seq: int = 0
    outbox: list[str] = field(default_factory=list)
    inbox: list[str] = field(default_factory=list)


def oracle(records: Sequence[Envelope]) -> dict[Key, Expected]:
    """Independent of ``aggregates.fold``: group by aggregate, order like the pipeline
    (the specification, :func:`aggregates.fold.ordering.delivery_order`), drop repeated message
    ids (first occurrence wins), then call the handlers directly. ``records`` are valid
    envelopes in input order."""
    groups: dict[Key, list[Envelope]] = defaultdict(list)
    for env in records:
        groups[(env["aggregate_type"], env["aggregate_id"])].append(env)
    out: dict[Key, Expected] = {}
    for (atype, aid), items in groups.items():
        handlers = domain.registry.get(atype)
        state: Any = _STATE[atype]()
        exp = Expected(state={})
        seen: set[str] = set()
        for msg in delivery_order([Message.from_dict(env) for env in items]):
            if msg.message_id in seen:
                continue
            seen.add(msg.message_id)
            result = handlers.handler_for(msg.type)(state, msg)
            state, emits = result if isinstance(result, tuple) else (result, [])
            for i, e in enumerate(emits):
                assert isinstance(e, Emit)
                exp.outbox.append(emitted_message_id(atype, aid, msg.message_id, i))
            exp.seq += len(emits)
            exp.inbox.append(msg.message_id)
        exp.state = dataclasses.asdict(state)
        out[(atype, aid)] = exp
    return out


def stored(db: Any) -> dict[Key, Expected]:
    out: dict[Key, Expected] = {}
    for atype, coll in (("Account", "accounts"), ("Ledger", "ledgers")):
        for d in db[coll].find():
            outbox = d.get("outbox", [])
            seqs = [e["source"]["seq"] for e in outbox]
            assert seqs == list(range(1, len(seqs) + 1)), f"{d['_id']}: outbox seqs {seqs}"
            out[(atype, d["_id"])] = Expected(
                state=dict(d["state"]),
                seq=d.get("_seq", 0),
                outbox=[e["id"] for e in outbox],
                inbox=[e[0] for e in d.get("inbox", [])] if atype == "Account" else [],
            )
    return out


def assert_matches_oracle(db: Any, records: Sequence[Envelope]) -> None:
    expected = oracle(records)
    for (atype, _), exp in expected.items():
        if atype != "Account":
            exp.inbox = []
    got = stored(db)
    assert sorted(got) == sorted(expected)
    wrong = {k: (got[k], expected[k]) for k in expected if got[k] != expected[k]}
    assert not wrong, f"{len(wrong)} aggregates differ from the oracle, e.g. " \
                      f"{next(iter(wrong.items()))}"


def outcome_rows(result: Any) -> list[dict[str, Any]]:
    return [r.asDict() for r in result.outcomes.collect()]
