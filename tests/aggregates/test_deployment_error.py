"""A handler (or upcaster) that cannot import a module is the deployment's fault, never the
message's (issue 32, docs/design.md "Deployment errors"): the fold raises
:class:`DeploymentError` — in the harness, in a Scenario and in the real writer alike —
and nothing is applied or dead-lettered. Other exceptions stay ``handler_error``."""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any

import pytest

from aggregates import AggregateType, DeploymentError, Message, Registry
from aggregates.testing import AggregateHarness, Scenario, memory_database, message

MISSING = "aggbox_test_missing_helpers"


@dataclass(frozen=True)
class Counter:
    n: int = 0


counters = AggregateType("Counter", state=Counter, collection="counters")


@counters.handles("Add")
def add(state: Counter, msg: Message) -> Counter:
    return Counter(state.n + 1)


@counters.handles("NeedsHelper")
def needs_helper(state: Counter, msg: Message) -> Counter:
    importlib.import_module(MISSING)
    return Counter(state.n + 1)


@counters.handles("FromImport")
def from_import(state: Counter, msg: Message) -> Counter:
    from json import no_such_name  # type: ignore[attr-defined]  # noqa: F401

    return state


@counters.handles("Broken")
def broken(state: Counter, msg: Message) -> Counter:
    raise NameError("name 'helpers' is not defined")


@counters.upcaster("Upcast", from_version=1)
def upcast_v1(payload: dict[str, Any]) -> dict[str, Any]:
    importlib.import_module(MISSING)
    return payload


@counters.handles("Upcast")
def upcast(state: Counter, msg: Message) -> Counter:
    return state


def msg(mtype: str, mid: str, **kw: Any) -> Message:
    return message(mtype, {}, to=counters, id="c-1", message_id=mid, **kw)


def test_the_harness_raises_instead_of_dead_lettering() -> None:
    h = AggregateHarness(counters, aggregate_id="c-1")
    h.given(msg("Add", "a-1"))
    with pytest.raises(DeploymentError) as caught:
        h.when(msg("NeedsHelper", "n-1"))
    text = str(caught.value)
    assert caught.value.module == MISSING and f"cannot import module '{MISSING}'" in text
    assert "--py-files" in text and "pip install" in text and "\n" not in text
    assert h.dead_letters == [] and h.state == Counter(1)
    with pytest.raises(DeploymentError, match="cannot import module 'json'"):
        h.when(msg("FromImport", "f-1"))
    with pytest.raises(DeploymentError, match="the upcaster of Counter for 'Upcast'"):
        h.when(msg("Upcast", "u-1", schema_version=1))
    # Anything else a handler raises is still the message's: dead-lettered handler_error.
    step = h.when(msg("Broken", "b-1"))
    assert (step.outcome, step.reason) == ("dead_lettered", "handler_error")
    assert step.detail == "NameError: name 'helpers' is not defined"


@pytest.mark.parametrize("store", ["memory", "mongomock"])
def test_a_scenario_raises_and_writes_nothing(store: str) -> None:
    db = memory_database() if store == "mongomock" else None
    sc = Scenario(Registry([counters]), with_store=db).given(msg("Add", "a-1"))
    with pytest.raises(DeploymentError, match=MISSING):
        sc.when(msg("NeedsHelper", "n-1"))
    assert sc.state(counters, "c-1") == Counter(1)
    if db is not None:
        assert db.aggbox_dead_letters.count_documents({}) == 0
