"""The delivery queue of a :class:`~aggregates.testing.scenario.Scenario` and its errors (pure)."""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from aggregates.core.errors import AggboxError
from aggregates.domain.aggregate import Registry
from aggregates.fold.ordering import delivery_order
from aggregates.message.envelope import Message
from aggregates.testing._scenario_timeline import Exchange, ExchangeKind, Timeline, find_cycle

__all__ = ["Delivery", "FlowDoesNotSettle", "ScenarioError", "batch_order", "check_known",
           "key", "not_settled"]


class ScenarioError(AggboxError):
    """A scenario was used wrongly, or its set-up (``given``) did not apply."""


class FlowDoesNotSettle(ScenarioError):
    """The flow was still exchanging messages after ``max_steps`` steps. ``cycle``: the
    repeating exchanges (a loop between aggregates), if one was found."""

    def __init__(self, message: str, *, cycle: list[Exchange] | None) -> None:
        super().__init__(message)
        self.cycle = cycle


@dataclass(frozen=True, slots=True)
class Delivery:
    """A message on its way to an aggregate: how it came (``kind``), from whom."""

    msg: Message
    kind: ExchangeKind
    sender: str | None
    note: str = ""
    reordered: bool = False


def key(msg: Message) -> tuple[str, str]:
    return (msg.aggregate_type, msg.aggregate_id)


def batch_order(messages: Sequence[Message]) -> list[Message]:
    """``messages`` with each aggregate's own in the pipeline's handling order
    (:func:`aggregates.fold.ordering.delivery_order`), in the slots they took."""
    groups: dict[tuple[str, str], list[Message]] = {}
    for m in messages:
        groups.setdefault(key(m), []).append(m)
    ordered = {k: deque(delivery_order(g)) for k, g in groups.items()}
    return [ordered[key(m)].popleft() for m in messages]


def not_settled(timeline: Timeline, max_steps: int) -> FlowDoesNotSettle:
    """The error of a flow still busy after ``max_steps`` steps, naming its loop."""
    cycle = find_cycle(list(timeline))
    if cycle:
        path = " → ".join([cycle[0].sender or "test",
                           *(f"[{e.type}] {e.receiver}" for e in cycle)])
        what = (f"a loop between aggregates: {path} → … repeats; a handler must stop "
                "answering at some point (check the state before emitting)")
    else:
        what = ("no loop found; if the flow legitimately needs more steps, raise "
                "Scenario(max_steps=...)")
    return FlowDoesNotSettle(f"the flow did not settle within max_steps={max_steps}: {what}"
                             f"\nlast exchanges:\n{timeline[-12:]}", cycle=cycle)


def check_known(registry: Registry, delivered: Sequence[Message], type_name: str,
                aggregate_id: str) -> None:
    """Raise :class:`ScenarioError` unless the aggregate ``type_name``/``aggregate_id`` is
    in ``registry`` and received one of the ``delivered`` messages (a typo in a test's id
    would otherwise read the initial state: ``0 == 100``)."""
    if type_name not in registry:
        raise ScenarioError(f"state(): {type_name} is not in this scenario's registry "
                            f"({', '.join(registry.names)})")
    known = sorted({m.aggregate_id for m in delivered if m.aggregate_type == type_name})
    if aggregate_id not in known:
        shown = ", ".join(repr(i) for i in known[:20]) + (", …" if len(known) > 20 else "")
        raise ScenarioError(f"state(): {type_name} {aggregate_id!r} never received a message "
                            f"in this scenario; check the id — the {type_name} ids it knows "
                            f"({len(known)}): {shown or 'none'}")
