"""The number and type corpus (tests/corpus.py) pushed through every place a handler puts a
value — an untyped state, a dict emit, typed emits (a pydantic model and a dataclass with an
``Any`` field), a timer's message, an effect entry and an effect's result — in
``AggregateHarness`` and through the store writer (on ``memory_database()`` and on the local
MongoDB server). Each value ends stored as the corpus says (read back from the outbox entry,
the timer or the state) or refused where it enters, the message dead-lettered with the
reason of that place and a detail naming the field: never accepted and lost later (issue 40).

The one rule is docs/design.md "JSON values" (aggregates/core/jsonvalue.py); what each value
becomes is the table of docs/concepts.md "What each value becomes", which
:func:`test_the_docs_table_says_what_the_corpus_says` holds to the corpus."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from aggregates import AggboxSettings, StoreWriter
from aggregates.codec.bson import from_bson
from aggregates.core.errors import HandlerError
from aggregates.core.reasons import Reason
from aggregates.core.samevalue import same_value
from aggregates.testing import AggregateHarness, Scenario, memory_database, message
from tests.aggregates.corpusdomain import effects, probes, registry
from tests.corpus import CORPUS, NAN, REFUSED, CorpusValue, same, state_round_trip

ROOT = Path(__file__).resolve().parents[2]

#: Where a value enters: the message type of its handler, and how a refusal reads.
PLACES = {
    "state": ("State", Reason.INVALID_STATE, r"(Probe|state)\.v\b"),
    "dict emit": ("DictEmit", Reason.INVALID_EMIT, r"emit\[0\]\.payload\.v\b"),
    "typed emit": ("TypedEmit", Reason.INVALID_EMIT, r"emit\[0\]\.payload\.v\b"),
    "typed dataclass emit": ("TypedDataclassEmit", Reason.INVALID_EMIT,
                             r"emit\[0\]\.payload\.v\b"),
    "timer": ("Timer", Reason.INVALID_TIMER, r"emit\[0\]\.payload\.v\b"),
    "effect entry": ("EffectEntry", Reason.INVALID_EMIT, r"emit\[0\]\.payload\.v\b"),
    "effect result": ("CallEffect", Reason.EFFECT_ERROR, r"result\.v\b"),
}

#: Typed emits are what pydantic's JSON mode gives for the values pydantic knows (the
#: typed payload's published form, by design: docs/design.md "JSON values"); the corpus's
#: ``emit`` column is the rule for everything else. pydantic writes a complex number as
#: text and bytes (``bson.Binary`` is bytes) as their UTF-8 text.
TYPED_BY_DESIGN = {
    "complex": "1+2j",
    "Binary uuid": "\x124Vx\x124Vx\x124Vx\x124Vx",
}


def expected(cv: CorpusValue, place: str) -> Any:
    if place == "state":
        return cv.state
    if place.startswith("typed") and cv.name in TYPED_BY_DESIGN:
        return TYPED_BY_DESIGN[cv.name]
    return cv.emit


# -- running one place ---------------------------------------------------------------------
class Result:
    """How a value ended in one place: the outcome and what was stored."""

    def __init__(self, outcome: str, reason: str | None, detail: str | None,
                 stored: Any = REFUSED, leftovers: bool = False) -> None:
        self.outcome, self.reason, self.detail = outcome, reason, detail
        self.stored, self.leftovers = stored, leftovers


def _stored(place: str, state: Any, outbox: list[dict[str, Any]],
            timers: list[dict[str, Any]]) -> tuple[Any, bool]:
    """The value as stored in ``place`` (state, outbox entry or timer) and whether anything
    else is there."""
    if place == "state":
        return state.get("v", REFUSED) if state else REFUSED, bool(outbox or timers)
    if place == "timer":
        return (timers[0]["payload"]["v"] if timers else REFUSED), bool(outbox)
    return (outbox[0]["payload"]["v"] if outbox else REFUSED), bool(timers)


def run_harness(place: str, values: list[CorpusValue]) -> dict[str, Result]:
    out = {}
    for cv in values:
        h = AggregateHarness(probes, aggregate_id=cv.name)
        try:
            step = h.when(message(PLACES[place][0], {"name": cv.name}, to=probes,
                                  id=cv.name))
        except HandlerError as exc:  # the harness's own checks (determinism, round trip)
            out[cv.name] = Result("harness error", None, str(exc))
            continue
        if place == "effect result" and step.outcome == "applied":
            # What the effect function returns (the harness does not call it).
            step = h.effect_result(effects.get("ProbeCall"), result={"v": cv.make()})
            out[cv.name] = _effect_result(step.outcome, step.reason, step.detail,
                                          from_bson(h.snapshot.state))
            continue
        state = from_bson(h.snapshot.state) if h.snapshot.state else None
        stored, leftovers = _stored(place, state, h.outbox, h.timers)
        out[cv.name] = Result(step.outcome, step.reason, step.detail, stored, leftovers)
    return out


def _effect_result(outcome: str, reason: str | None, detail: str | None,
                   state: dict[str, Any]) -> Result:
    """The reply was applied: the aggregate's state holds the result or the failure."""
    if outcome != "applied":
        return Result(outcome, reason, detail)
    if "failure" in state:
        failure = state["failure"]
        return Result("failed", failure.get("reason"), failure.get("error"))
    return Result(outcome, None, None, state["result"].get("v", REFUSED))


def run_store(db: Any, place: str, values: list[CorpusValue]) -> dict[str, Result]:
    if place == "effect result":
        sc = Scenario(registry, effects=effects, with_store=db)
        for cv in values:
            sc.when(message("CallEffect", {"name": cv.name}, to=probes, id=cv.name))
        return {cv.name: _effect_result("applied", None, None, sc.state(probes, cv.name))
                for cv in values}
    w = StoreWriter(db, registry, settings=AggboxSettings(database=db.name))
    w.ensure_indexes()
    msgs = [message(PLACES[place][0], {"name": cv.name}, to=probes, id=cv.name,
                    message_id=f"m-{i}") for i, cv in enumerate(values)]
    outcomes = {o.message_id: o for o in w.process(msgs)}
    docs = {d["_id"]: d for d in db.probes.find()}
    out = {}
    for cv, msg in zip(values, msgs, strict=True):
        o, doc = outcomes[msg.message_id], docs.get(cv.name) or {}
        state = from_bson(doc["state"]) if doc.get("state") else None
        stored, leftovers = _stored(place, state, doc.get("outbox") or [],
                                    doc.get("timers") or [])
        out[cv.name] = Result(o.outcome, o.reason, o.detail, stored, leftovers)
    return out


# -- the verdicts ---------------------------------------------------------------------------
def survives(cv: CorpusValue) -> bool:
    """Whether the value a handler put into a dict state loads back as an equal value (a
    tuple comes back a list, an Enum its value, a date a datetime: docs/concepts.md "State
    types")."""
    return cv.state is REFUSED or same_value(cv.make(), state_round_trip(cv.make()),
                                             strict=False)


def problems(place: str, results: dict[str, Result], *, harness: bool = False) -> list[str]:
    """Every value that did not end as the corpus says, as one line each."""
    _, reason, field = PLACES[place]
    bad = []
    for cv in CORPUS:
        r, want = results[cv.name], expected(cv, place)
        if harness and place == "state" and not survives(cv):
            # AggregateHarness's round-trip check (by design): a state that changes in the
            # store fails the unit test, naming the field — the writer stores it as the
            # corpus says (test_the_corpus_through_the_store_writer).
            if (r.outcome != "harness error" or "does not survive the store's round trip: "
                                                 "state.v" not in (r.detail or "")):
                bad.append(f"{cv.name}: {r.outcome} ({r.detail}), want the round-trip error")
            continue
        if want is REFUSED:
            ok_outcome = "failed" if place == "effect result" else "dead_lettered"
            if (r.outcome, r.reason) != (ok_outcome, reason):
                bad.append(f"{cv.name}: {r.outcome} ({r.reason}: {r.detail}), want {reason}")
            elif not re.search(field, r.detail or ""):
                bad.append(f"{cv.name}: the detail does not name the field: {r.detail}")
            elif r.stored is not REFUSED:
                bad.append(f"{cv.name}: refused, yet stored {r.stored!r}")
            continue
        if r.outcome != "applied":
            bad.append(f"{cv.name}: {r.outcome} ({r.reason}: {r.detail}), want {want!r}")
        elif not same(want, r.stored):
            bad.append(f"{cv.name}: stored {r.stored!r} ({type(r.stored).__name__}), "
                       f"want {want!r}")
        elif r.leftovers:
            bad.append(f"{cv.name}: more was stored than the one value")
        elif place != "state" and not _publishable(r.stored):
            bad.append(f"{cv.name}: stored {r.stored!r}, which is not JSON")
    return bad


def _publishable(value: Any) -> bool:
    """What is published must be JSON: it survives ``json.dumps`` (no NaN) unchanged."""
    try:
        return same(value, json.loads(json.dumps(value, allow_nan=False)))
    except (TypeError, ValueError):
        return False


@pytest.fixture(params=["memory", pytest.param("mongo", marks=pytest.mark.mongo)])
def store_db(request: pytest.FixtureRequest) -> Iterator[Any]:
    if request.param == "memory":
        yield memory_database("aggbox_corpus")
    else:
        yield request.getfixturevalue("db")


@pytest.mark.parametrize("place", list(PLACES))
def test_the_corpus_in_the_harness(place: str) -> None:
    bad = problems(place, run_harness(place, list(CORPUS)), harness=True)
    assert not bad, f"{place} in AggregateHarness:\n" + "\n".join(bad)


@pytest.mark.parametrize("place", list(PLACES))
def test_the_corpus_through_the_store_writer(place: str, store_db: Any) -> None:
    bad = problems(place, run_store(store_db, place, list(CORPUS)))
    assert not bad, f"{place} through the store writer:\n" + "\n".join(bad)


# -- the docs table -------------------------------------------------------------------------
def _cell(value: Any, *, stored_as: Callable[[Any], str]) -> str:
    return "refused" if value is REFUSED else stored_as(value)


def _json_text(value: Any) -> str:
    return f"`{json.dumps(value, ensure_ascii=True)}`"


def _state_text(value: Any) -> str:
    if value is NAN:
        return "`nan`"
    if isinstance(value, list):
        return "`[" + ", ".join(_state_text(v).strip("`") for v in value) + "]`"
    if hasattr(value, "isoformat"):
        return f"`{value.isoformat()}`"
    return f"`{value!r}`"


def doc_rows() -> dict[str, list[str]]:
    """The rows of the table in docs/concepts.md "What each value becomes", by value."""
    text = (ROOT / "docs" / "concepts.md").read_text(encoding="utf-8")
    section = text.split("## What each value becomes", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("| `") and len(cells) == 4:
            rows[cells[0].strip("`")] = cells[1:]
    return rows


def test_the_docs_table_says_what_the_corpus_says() -> None:
    rows = doc_rows()
    assert sorted(rows) == sorted(cv.name for cv in CORPUS), "one row per corpus value"
    wrong = []
    for cv in CORPUS:
        want = [_cell(cv.state, stored_as=_state_text), _cell(cv.emit, stored_as=_json_text),
                _cell(expected(cv, "typed emit"), stored_as=_json_text)]
        if rows[cv.name] != want:
            wrong.append(f"| `{cv.name}` | {' | '.join(want)} |   (docs: {rows[cv.name]})")
    assert not wrong, "docs/concepts.md \"What each value becomes\":\n" + "\n".join(wrong)
