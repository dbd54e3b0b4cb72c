"""The number and type corpus (issue 40): hostile and unusual values a team's handler may put
into state, a dict emit, a typed emit, a timer or an effect's payload, each with what
aggbox does with it — the one rule of docs/design.md "JSON values" (outbox payloads) and of
the state codec's table (state, BSON).

Every test that pushes values through a place (the fold, the writer, the dispatcher's
publishers and formats) takes them from here, so a new value is tried everywhere at once.

``emit`` is the value's published JSON form (what ``json.loads`` of the record gives back
for it), or :data:`REFUSED` (the emit is dead-lettered ``invalid_emit`` naming the field —
never stored, never published). ``state`` is what an untyped (dict) state holds after a
store round trip (``from_bson(bson.decode(bson.encode(to_bson(x))))``), or :data:`REFUSED`
(the message is dead-lettered ``invalid_state``). ``NAN`` stands for "a float NaN" (NaN is
never equal to itself).
"""

from __future__ import annotations

import dataclasses
import decimal
import enum
import math
import uuid
from collections.abc import Callable
from datetime import UTC, date, datetime, timedelta, timezone
from typing import Any, Final

import bson
import numpy as np
from bson.binary import Binary
from bson.decimal128 import Decimal128
from bson.int64 import Int64

__all__ = ["CORPUS", "NAN", "REFUSED", "CorpusValue", "by_name", "same"]


class _Refused:
    def __repr__(self) -> str:
        return "REFUSED"


class _NaN:
    def __repr__(self) -> str:
        return "NAN"


REFUSED: Final = _Refused()
NAN: Final = _NaN()


class Colour(enum.Enum):
    RED = "red"


class Level(enum.IntEnum):
    HIGH = 3


class MyInt(int):
    pass


class MyFloat(float):
    pass


class MyStr(str):
    pass


class Custom:
    """A class aggbox knows nothing of."""

    def __repr__(self) -> str:
        return "Custom()"


@dataclasses.dataclass(frozen=True)
class CorpusValue:
    name: str
    make: Callable[[], Any]
    #: the published JSON form in an emit's payload, or REFUSED
    emit: Any
    #: what a dict state holds after a store round trip, or REFUSED
    state: Any


_AWARE = datetime(2026, 1, 2, 3, 4, 5, 123000, tzinfo=UTC)
_PLUS2 = datetime(2026, 1, 2, 5, 4, 5, 123000, tzinfo=timezone(timedelta(hours=2)))
_NAIVE = datetime(2026, 1, 2, 3, 4, 5)
_UUID = uuid.UUID("12345678-1234-5678-1234-567812345678")

CORPUS: Final[tuple[CorpusValue, ...]] = (
    CorpusValue("nan", lambda: float("nan"), REFUSED, NAN),
    CorpusValue("inf", lambda: float("inf"), REFUSED, math.inf),
    CorpusValue("-inf", lambda: float("-inf"), REFUSED, -math.inf),
    CorpusValue("-0.0", lambda: -0.0, -0.0, -0.0),
    CorpusValue("1e400", lambda: float("1e400"), REFUSED, math.inf),
    CorpusValue("1e-400", lambda: float("1e-400"), 0.0, 0.0),
    CorpusValue("5e-324", lambda: 5e-324, 5e-324, 5e-324),
    CorpusValue("2**63-1", lambda: 2**63 - 1, 2**63 - 1, 2**63 - 1),
    CorpusValue("-2**63", lambda: -(2**63), -(2**63), -(2**63)),
    CorpusValue("2**63", lambda: 2**63, REFUSED, REFUSED),
    CorpusValue("2**70", lambda: 2**70, REFUSED, REFUSED),
    CorpusValue("-2**70", lambda: -(2**70), REFUSED, REFUSED),
    CorpusValue("numpy.float64", lambda: np.float64(1.5), 1.5, 1.5),
    CorpusValue("numpy.float64 nan", lambda: np.float64("nan"), REFUSED, NAN),
    CorpusValue("numpy.float64 inf", lambda: np.float64("inf"), REFUSED, math.inf),
    CorpusValue("numpy.float32", lambda: np.float32(0.5), 0.5, 0.5),
    CorpusValue("numpy.int64", lambda: np.int64(7), 7, 7),
    CorpusValue("numpy.uint64 max", lambda: np.uint64(2**64 - 1), REFUSED, REFUSED),
    CorpusValue("numpy.bool_", lambda: np.bool_(True), True, True),
    CorpusValue("numpy array", lambda: np.array([[1, 2], [3, 4]]), [[1, 2], [3, 4]],
                [[1, 2], [3, 4]]),
    CorpusValue("numpy array nan", lambda: np.array([1.0, float("nan")]), REFUSED,
                [1.0, NAN]),
    CorpusValue("Decimal", lambda: decimal.Decimal("1.10"), "1.10", decimal.Decimal("1.10")),
    CorpusValue("Decimal NaN", lambda: decimal.Decimal("NaN"), "NaN",
                decimal.Decimal("NaN")),
    CorpusValue("Decimal128", lambda: Decimal128("2.50"), "2.50", decimal.Decimal("2.50")),
    CorpusValue("datetime aware", lambda: _AWARE, "2026-01-02T03:04:05.123000Z", _AWARE),
    CorpusValue("datetime +02:00", lambda: _PLUS2, "2026-01-02T05:04:05.123000+02:00",
                _PLUS2.astimezone(UTC)),
    CorpusValue("datetime naive", lambda: _NAIVE, "2026-01-02T03:04:05", REFUSED),
    CorpusValue("datetime µs", lambda: datetime(2026, 1, 2, microsecond=5, tzinfo=UTC),
                "2026-01-02T00:00:00.000005Z", REFUSED),
    CorpusValue("date", lambda: date(2026, 1, 2), "2026-01-02",
                datetime(2026, 1, 2, tzinfo=UTC)),
    CorpusValue("timedelta", lambda: timedelta(seconds=90), "PT1M30S", REFUSED),
    CorpusValue("uuid.UUID", lambda: _UUID, str(_UUID), _UUID),
    CorpusValue("bytes", lambda: b"\x00\xff", REFUSED, b"\x00\xff"),
    CorpusValue("bool", lambda: True, True, True),
    CorpusValue("IntEnum", lambda: Level.HIGH, 3, 3),
    CorpusValue("Enum", lambda: Colour.RED, "red", "red"),
    CorpusValue("int subclass", lambda: MyInt(5), 5, 5),
    CorpusValue("bson.Int64", lambda: Int64(9), 9, 9),
    CorpusValue("float subclass", lambda: MyFloat(2.5), 2.5, 2.5),
    CorpusValue("float subclass nan", lambda: MyFloat("nan"), REFUSED, NAN),
    CorpusValue("str subclass", lambda: MyStr("s"), "s", "s"),
    CorpusValue("lone surrogate", lambda: "a\ud800b", REFUSED, REFUSED),
    CorpusValue("set", lambda: {3, 1, 2}, [1, 2, 3], [1, 2, 3]),
    CorpusValue("frozenset of str", lambda: frozenset({"b", "a"}), ["a", "b"], ["a", "b"]),
    CorpusValue("tuple", lambda: (1, "x"), [1, "x"], [1, "x"]),
    CorpusValue("custom class", lambda: Custom(), REFUSED, REFUSED),
    CorpusValue("complex", lambda: 1 + 2j, REFUSED, REFUSED),
    CorpusValue("Binary uuid", lambda: Binary.from_uuid(_UUID), REFUSED, _UUID),
)


def by_name(name: str) -> CorpusValue:
    for value in CORPUS:
        if value.name == name:
            return value
    raise KeyError(name)


def same(expected: Any, got: Any) -> bool:
    """``got`` equals ``expected`` by value and type family: NAN matches a float NaN, -0.0
    only -0.0, floats are not ints (``1.0`` vs ``1``), containers item by item."""
    if expected is NAN:
        return isinstance(got, float) and math.isnan(got)
    if isinstance(expected, float):
        return (type(got) is float and (got == expected or (math.isnan(got) and
                                                            math.isnan(expected)))
                and math.copysign(1, got) == math.copysign(1, expected))
    if isinstance(expected, bool) or isinstance(got, bool):
        return type(got) is bool and got == expected
    if isinstance(expected, int):  # bson.Int64 (how int64 values decode) is an int
        return isinstance(got, int) and got == expected
    if isinstance(expected, list):
        return (type(got) is list and len(got) == len(expected)
                and all(same(e, g) for e, g in zip(expected, got, strict=True)))
    if isinstance(expected, dict):
        return (type(got) is dict and got.keys() == expected.keys()
                and all(same(expected[k], got[k]) for k in expected))
    if isinstance(expected, decimal.Decimal) and expected.is_nan():
        return type(got) is decimal.Decimal and got.is_nan()
    return type(got) is type(expected) and bool(got == expected)


def state_round_trip(value: Any) -> Any:
    """What an untyped state's field holds after the store: dumped by the codec's BSON step,
    encoded and decoded, loaded back (raises what the codec raises for a refused value)."""
    from aggregates.codec.bson import from_bson, to_bson

    stored = bson.decode(bson.encode({"v": to_bson(value)}))["v"]
    return from_bson(stored)
