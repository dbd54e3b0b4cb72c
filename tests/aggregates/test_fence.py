"""The ``fence`` header (aggregates/wire/fence.py): it round-trips whatever the collection is
called, and a malformed value is an error that names the part that is wrong."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from aggregates import AggboxError, Fence, InvalidFence, parse_fence
from aggregates.core.errors import ConfigurationError
from aggregates.core.partitions import PARTITIONS
from aggregates.wire.fence import fence_scope, format_fence
from dispatcher.core.faults import FaultRule, Faults

# What MongoDB allows (docs "Naming Restrictions"), and more: a database name has no
# / \ . space " $ NUL; a collection name anything but $ and NUL — dots, slashes, colons,
# digits and whatever Unicode, which is what could confuse a parser that splits naively.
_HOSTILE = st.sampled_from([*"./:0123456789 \\\"'%\n\t", "/1:2", ".3", ":", "//", "é"])
databases = st.text(st.characters(codec="utf-8",
                                  exclude_characters='/\\. "$\x00'), min_size=1)
collections = st.lists(st.one_of(_HOSTILE, st.text(
    st.characters(codec="utf-8", exclude_characters="$\x00"), max_size=3)),
    min_size=1).map("".join).filter(bool)
fences = st.builds(Fence, databases, collections, st.integers(0, PARTITIONS - 1),
                   st.integers(1, 2**63))


@given(fences)
def test_a_fence_parses_back_to_itself(fence: Fence) -> None:
    value = str(fence)
    assert value == format_fence(fence.database, fence.collection, fence.partition,
                                 fence.epoch)
    assert parse_fence(value) == fence
    assert parse_fence(value.encode()) == fence  # what a Kafka client hands over
    assert value.startswith(fence.scope + "/")
    assert fence_scope(fence.database, fence.collection) == fence.scope


@given(fences, fences)
def test_different_leases_give_different_values(a: Fence, b: Fence) -> None:
    assert (str(a) == str(b)) == (a == b)


@pytest.mark.parametrize(("value", "expected"), [
    ("shop.orders/7:3", Fence("shop", "orders", 7, 3)),
    ("shop.orders.v2/7:3", Fence("shop", "orders.v2", 7, 3)),
    ("shop.a/b:9/7:3", Fence("shop", "a/b:9", 7, 3)),
    ("shop.a/1:2/0:1", Fence("shop", "a/1:2", 0, 1)),
    ("shop../255:1", Fence("shop", ".", 255, 1)),
    ("shop.:/1:1", Fence("shop", ":", 1, 1)),
    ("shop.x/1:18446744073709551616", Fence("shop", "x", 1, 2**64)),
])
def test_hostile_names_parse_from_the_right(value: str, expected: Fence) -> None:
    assert parse_fence(value) == expected
    assert str(expected) == value


@pytest.mark.parametrize(("value", "field"), [
    ("7:3", "fence"),  # the old format: no scope
    ("shop.orders/7", "fence"),
    ("shop.orders:3", "fence"),
    ("shoporders/7:3", "fence"),
    ("", "fence"),
    (b"shop.orders/7:\xff", "fence"),
    (".orders/7:3", "database"),
    ("sh/op.orders/7:3", "database"),
    ("sh$op.orders/7:3", "database"),
    ("shop./7:3", "collection"),
    ("shop.or$ders/7:3", "collection"),
    ("shop.or\x00ders/7:3", "collection"),
    ("shop.orders/:3", "partition"),
    ("shop.orders/07:3", "partition"),
    ("shop.orders/+7:3", "partition"),
    ("shop.orders/-1:3", "partition"),
    ("shop.orders/256:3", "partition"),
    ("shop.orders/٣:3", "partition"),
    ("shop.orders/7:", "epoch"),
    ("shop.orders/7:0", "epoch"),
    ("shop.orders/7:1_0", "epoch"),
    ("shop.orders/7: 3", "epoch"),
    ("shop.orders/7:3\n", "epoch"),
])
def test_a_malformed_value_names_the_field(value: str | bytes, field: str) -> None:
    with pytest.raises(InvalidFence) as info:
        parse_fence(value)
    assert info.value.field == field
    assert isinstance(info.value, AggboxError) and isinstance(info.value, ValueError)
    assert f"field {field!r}" in str(info.value)
    assert "<database>.<collection>/<partition>:<epoch>" in str(info.value)


def test_not_text_is_refused() -> None:
    with pytest.raises(InvalidFence) as info:
        parse_fence(7)  # type: ignore[arg-type]
    assert info.value.field == "fence"


def test_a_value_that_would_not_parse_back_is_never_formatted() -> None:
    with pytest.raises(InvalidFence, match="'database'"):
        format_fence("a.b", "c", 1, 1)
    with pytest.raises(InvalidFence, match="'collection'"):
        format_fence("a", "c$", 1, 1)
    with pytest.raises(InvalidFence, match="'partition'"):
        format_fence("a", "c", PARTITIONS, 1)
    with pytest.raises(InvalidFence, match="'epoch'"):
        format_fence("a", "c", 1, 0)


def test_a_long_value_is_shortened_in_the_message() -> None:
    with pytest.raises(InvalidFence) as info:
        parse_fence("x" * 1000)
    assert len(str(info.value)) < 400


# -- the fault action that produces late copies (dispatcher/core/faults.py) ----------------------

def test_pause_takes_its_duration() -> None:
    faults = Faults.parse("before_publish:pause=2.5@3, after_publish:kill")
    assert faults.rules == [FaultRule("before_publish", "pause", 3, 2.5),
                            FaultRule("after_publish", "kill", 1)]


@pytest.mark.parametrize("rule", ["before_publish:pause", "before_publish:pause=0",
                                  "before_publish:pause=x", "before_publish:pause=inf",
                                  "before_publish:kill=3"])
def test_bad_pause_rules_are_refused(rule: str) -> None:
    with pytest.raises(ConfigurationError, match="pause=SECONDS"):
        Faults.parse(rule)


def test_pause_stops_the_process(monkeypatch: pytest.MonkeyPatch) -> None:
    slept: list[float] = []
    monkeypatch.setattr("dispatcher.core.faults.time.sleep", slept.append)
    faults = Faults.parse("before_publish:pause=4@2")
    faults.hit("before_publish")
    assert slept == []
    faults.hit("before_publish")
    assert slept == [4.0]
