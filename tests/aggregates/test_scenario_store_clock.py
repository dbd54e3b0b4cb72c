"""``Scenario(with_store=...)`` with its fixed clock agrees with the in-memory scenario
(issue 33, item 3): the inbox archive's TTL field (``x``, compared by the store with its own
clock) is placed on the store's clock, not on the scenario's fixed 2026-01-01 — otherwise
the store deletes archive entries as soon as they are written and a redelivery of an
archived id is applied a second time."""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from aggregates import AggregateType, Inbox, Message, Registry
from aggregates.dedup.archive import archive_collection
from aggregates.testing import Scenario, memory_database, message


@dataclass(frozen=True)
class Counter:
    total: int = 0
    adds: int = 0


# A small inbox window: every Add after the second moves an older id to the archive.
counters = AggregateType("Counter", state=Counter, collection="counters",
                         dedup=Inbox(window=2))


@counters.handles("Add")
def add(state: Counter, msg: Message) -> Counter:
    return replace(state, total=state.total + int(msg.payload["n"]), adds=state.adds + 1)


registry = Registry([counters])


@pytest.fixture(params=["mongomock", pytest.param("server", marks=pytest.mark.mongo)])
def store(request: pytest.FixtureRequest) -> Any:
    """The store backends at hand: the in-memory database, the suite's local server."""
    if request.param == "mongomock":
        return memory_database()
    return request.getfixturevalue("db")


def adds(n: int) -> list[Message]:
    return [message("Add", {"n": i + 1}, to=counters, id="c-1", message_id=f"add-{i}",
                    occurred_at=datetime(2026, 1, 1, tzinfo=UTC) + timedelta(seconds=i))
            for i in range(n)]


def flow(sc: Scenario) -> list[str]:
    """Ten adds; redeliver the archived ones at once, then after 8 days (beyond the
    7-day dedup horizon) of scenario time; the redeliveries' outcomes."""
    sc.when(*adds(10))
    seen: list[str] = []
    for i in range(3):
        sc.redeliver(f"add-{i}")
        seen.append(sc.outcomes[-1].outcome)
    sc.advance(timedelta(days=8))
    for i in range(3):
        sc.redeliver(f"add-{i}")
        seen.append(sc.outcomes[-1].outcome)
    return seen


def test_store_mode_with_the_fixed_clock_gives_the_in_memory_result(store: Any) -> None:
    memory = Scenario(registry)
    expected = flow(memory)
    assert expected == ["duplicate"] * 6
    assert memory.state(counters, "c-1") == Counter(total=55, adds=10)

    sc = Scenario(registry, with_store=store)  # the default clock: 2026-01-01, fixed
    assert flow(sc) == expected
    assert sc.state(counters, "c-1") == Counter(total=55, adds=10)
    assert sc.states() == memory.states()
    # The archive still holds the evicted ids, and their expiry is on the store's clock.
    archived = list(store[archive_collection("counters")].find())
    assert sorted(d["m"] for d in archived) == [f"add-{i}" for i in range(8)]
    wall = datetime.now(UTC)
    for d in archived:
        x = d["x"] if d["x"].tzinfo else d["x"].replace(tzinfo=UTC)
        assert wall + timedelta(days=7) - timedelta(minutes=5) < x
