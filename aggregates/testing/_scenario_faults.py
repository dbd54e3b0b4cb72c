"""Faults as input to a :class:`~aggregates.testing.scenario.Scenario` (pure): what at-least-once
delivery and crashes do to a flow, at the points where they happen.

Delivery faults (any message delivered to an aggregate):

- ``duplicate`` — the broker hands the message over twice in a row;
- ``redeliver`` — a copy comes again later, after everything queued now;
- ``reorder`` — the message arrives after the next queued one, if that one is for another
  aggregate (there is no order across aggregates; per aggregate the order is kept);
- ``lost_write`` — the handler runs but the write is lost (a crash before it): the message
  is handled again;
- ``replay`` — the whole step again: the message is delivered again and the entries it
  emitted are published again (a crash after publishing, before the outbox was pulled);
- ``late`` — a copy comes again after the rest of the flow (a broker redelivering long
  after: the aggregate has moved on);
- ``swap`` — the message and the next one queued for the same aggregate from another sender
  change places (no order is promised between two senders).

A timer firing is a delivery of its own kind of point (``timer``); an effect's reply is one
too (``reply``: applied by the effect runner itself, so it cannot be reordered or swapped,
and a replay of it is a duplicate).

Effect faults (one call of an effect):

- ``effect_fails`` — the call times out before reaching the resource: it is made again;
- ``effect_lost`` — the call is made but its answer is lost: the query function is asked,
  if there is one, else the call is made again (at-least-once).

:class:`Fault` names one fault for a scenario (``Fault.duplicate("OrderCreated")``);
:class:`RandomFaults` draws them point by point (for your own property tests);
:func:`check_fault_tolerance` plans its faults over the whole flow instead
(:mod:`aggregates.testing._scenario_plan`).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Final, Literal, Protocol, TypeAlias

from aggregates.core.errors import ConfigurationError

__all__ = ["DELIVERY_FAULTS", "EFFECT_FAULTS", "REPLY_FAULTS", "Fault", "FaultKind",
           "FaultPoint", "FaultSource", "RandomFaults", "ScriptedFaults", "kinds_at"]

FaultKind: TypeAlias = Literal["duplicate", "redeliver", "reorder", "lost_write", "replay",
                               "late", "swap", "effect_fails", "effect_lost"]
#: Where a fault can happen: delivering a message (``timer``: a timer firing; ``reply``: an
#: effect's result), or calling an effect.
FaultPoint: TypeAlias = Literal["deliver", "timer", "reply", "effect"]

DELIVERY_FAULTS: Final[tuple[FaultKind, ...]] = ("duplicate", "redeliver", "reorder",
                                                 "lost_write", "replay", "late", "swap")
EFFECT_FAULTS: Final[tuple[FaultKind, ...]] = ("effect_fails", "effect_lost")
#: The kinds that can happen at an effect's reply (the runner applies it itself).
REPLY_FAULTS: Final[tuple[FaultKind, ...]] = ("duplicate", "redeliver", "lost_write", "late")


def kinds_at(point: FaultPoint) -> tuple[FaultKind, ...]:
    """The fault kinds that can happen at a point of this kind."""
    return (EFFECT_FAULTS if point == "effect" else REPLY_FAULTS if point == "reply"
            else DELIVERY_FAULTS)


@dataclass(frozen=True, slots=True)
class Fault:
    """One fault to inject: ``kind``, at the next ``times`` matching points — messages (or
    effect calls) of message type ``type`` (``None``: any)."""

    kind: FaultKind
    type: str | None = None
    times: int = 1

    def __post_init__(self) -> None:
        if self.kind not in DELIVERY_FAULTS + EFFECT_FAULTS:
            raise ConfigurationError(f"unknown fault {self.kind!r}; use one of "
                                     f"{', '.join(DELIVERY_FAULTS + EFFECT_FAULTS)}")
        if self.times < 1:
            raise ConfigurationError(f"Fault.{self.kind}(times={self.times}): times must be ≥ 1")

    @property
    def point(self) -> FaultPoint:
        return "effect" if self.kind in EFFECT_FAULTS else "deliver"

    def fits(self, point: FaultPoint, message_type: str) -> bool:
        """Whether this fault can happen at that point (a delivery fault at any delivery:
        an input, a message, a timer firing or, where it applies, a reply)."""
        return self.kind in kinds_at(point) and self.type in (None, message_type)

    @staticmethod
    def duplicate(type: str | None = None, *, times: int = 1) -> Fault:
        return Fault("duplicate", type, times)

    @staticmethod
    def redeliver(type: str | None = None, *, times: int = 1) -> Fault:
        return Fault("redeliver", type, times)

    @staticmethod
    def reorder(type: str | None = None, *, times: int = 1) -> Fault:
        return Fault("reorder", type, times)

    @staticmethod
    def lost_write(type: str | None = None, *, times: int = 1) -> Fault:
        return Fault("lost_write", type, times)

    @staticmethod
    def replay(type: str | None = None, *, times: int = 1) -> Fault:
        return Fault("replay", type, times)

    @staticmethod
    def late(type: str | None = None, *, times: int = 1) -> Fault:
        """A copy comes again after the rest of the flow: :meth:`Scenario.deliver_late`."""
        return Fault("late", type, times)

    @staticmethod
    def swap(type: str | None = None, *, times: int = 1) -> Fault:
        return Fault("swap", type, times)

    @staticmethod
    def effect_fails(type: str | None = None, *, times: int = 1) -> Fault:
        """The effect's next ``times`` calls time out (then it answers as it would)."""
        return Fault("effect_fails", type, times)

    @staticmethod
    def effect_lost(type: str | None = None, *, times: int = 1) -> Fault:
        return Fault("effect_lost", type, times)


class FaultSource(Protocol):
    """Decides, at each point, whether a fault happens there (``None``: no fault)."""

    def pick(self, point: FaultPoint, message_type: str) -> FaultKind | None: ...


class ScriptedFaults:
    """The faults a test named, each used at its next ``times`` matching points."""

    def __init__(self, faults: Sequence[Fault] = ()) -> None:
        self._left: list[tuple[Fault, int]] = [(f, f.times) for f in faults]

    def add(self, *faults: Fault) -> None:
        self._left.extend((f, f.times) for f in faults)

    def pick(self, point: FaultPoint, message_type: str) -> FaultKind | None:
        for i, (fault, left) in enumerate(self._left):
            if fault.fits(point, message_type):
                if left <= 1:
                    del self._left[i]
                else:
                    self._left[i] = (fault, left - 1)
                return fault.kind
        return None

    @property
    def unused(self) -> list[Fault]:
        """Faults whose point never came (a test may assert this is empty)."""
        return [f for f, _ in self._left]


class RandomFaults:
    """Faults drawn by ``choose`` (given the candidates, ``None`` first, it returns one of
    them: with hypothesis, ``lambda c: data.draw(sampled_from(c))``), at most ``budget`` of
    them, of the ``kinds`` allowed; :attr:`injected` lists what was drawn."""

    def __init__(self, choose: Callable[[list[FaultKind | None]], FaultKind | None], *,
                 kinds: Collection[FaultKind] = DELIVERY_FAULTS + EFFECT_FAULTS,
                 budget: int = 5) -> None:
        self.choose = choose
        self.kinds = tuple(k for k in DELIVERY_FAULTS + EFFECT_FAULTS if k in kinds)
        self.budget = budget
        self.injected: list[tuple[FaultKind, str]] = []

    def pick(self, point: FaultPoint, message_type: str) -> FaultKind | None:
        if len(self.injected) >= self.budget:
            return None
        allowed = kinds_at(point)
        options: list[FaultKind | None] = [None, *(k for k in self.kinds if k in allowed)]
        if len(options) == 1:
            return None
        kind = self.choose(options)
        if kind is not None:
            self.injected.append((kind, message_type))
        return kind
