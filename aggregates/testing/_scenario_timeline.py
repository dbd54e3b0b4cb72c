"""What a :class:`~aggregates.testing.scenario.Scenario` records (pure data): one :class:`Exchange`
per delivery, publication, effect call and injected fault, in order, and the
:class:`Timeline` that prints them as a table (readable in a failing assertion or a
notebook). Also finds the loop when a flow does not settle (:func:`find_cycle`)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, TypeAlias, overload

if TYPE_CHECKING:
    from aggregates.debug.diagram import SequenceDiagram

__all__ = ["Exchange", "ExchangeKind", "Timeline", "find_cycle"]

#: ``input`` (a message the test delivered), ``message`` (an addressed entry delivered to its
#: target), ``event`` (an entry without ``to=``: to listeners), ``effect`` (one call of an
#: effect function or fake), ``reply`` (an effect's result delivered to the emitter),
#: ``fault`` (an injected fault, before what it disturbs).
ExchangeKind: TypeAlias = Literal["input", "message", "event", "effect", "reply", "fault"]

#: The least widths of the table's type and route columns; a longer type or route (a timer's
#: sender names its key: ``Booking/b-1 ('payment')``) widens its column for every line.
TYPE_WIDTH, ROUTE_WIDTH = 24, 36


@dataclass(frozen=True, slots=True)
class Exchange:
    """One line of the timeline. ``sender``/``receiver`` are ``"Type/id"`` (``None`` for
    the test's own input); ``outcome`` is the delivery's outcome (``applied``,
    ``duplicate``, ``dead_lettered``, ``parked``), an effect call's answer (``ok``,
    ``retryable``, ``permanent``, ``timeout``, ``answer lost`` — the call was made, its
    answer lost on the way back — and ``query``, ``recorded``) or the fault's kind."""

    step: int
    kind: ExchangeKind
    type: str
    message_id: str
    sender: str | None = None
    receiver: str | None = None
    outcome: str | None = None
    reason: str | None = None
    detail: str | None = None
    emitted: tuple[str, ...] = ()
    note: str = ""

    @property
    def route(self) -> str:
        """``sender → receiver`` as the table shows it."""
        return f"{self.sender or 'test'} → {self.receiver or '-'}"

    def line(self, type_width: int = TYPE_WIDTH, route_width: int = ROUTE_WIDTH) -> str:
        """The exchange as a line of a table whose type and route columns are that wide."""
        what = self.outcome or ""
        if self.reason:
            what += f" ({self.reason})"
        if self.emitted:
            what += f", emitted {', '.join(self.emitted)}"
        if self.note:
            what += f"  [{self.note}]"
        return (f"{self.step:>4}  {self.kind:<7} {self.type:<{type_width}} "
                f"{self.route:<{route_width}} {what}").rstrip()

    def __str__(self) -> str:
        return self.line()


class Timeline(Sequence[Exchange]):
    """The exchanges of a scenario, in order. ``str()`` is a table, one line per exchange;
    :meth:`types` the message types of some kinds, for short assertions."""

    def __init__(self, exchanges: Sequence[Exchange] = ()) -> None:
        self._items = list(exchanges)

    @overload
    def __getitem__(self, index: int) -> Exchange: ...

    @overload
    def __getitem__(self, index: slice) -> Timeline: ...

    def __getitem__(self, index: int | slice) -> Exchange | Timeline:
        if isinstance(index, slice):
            return Timeline(self._items[index])
        return self._items[index]

    def __len__(self) -> int:
        return len(self._items)

    def __iter__(self) -> Iterator[Exchange]:
        return iter(self._items)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Timeline) and self._items == other._items

    __hash__ = None  # type: ignore[assignment]

    def append(self, exchange: Exchange) -> None:
        self._items.append(exchange)

    def types(self, *kinds: ExchangeKind) -> list[str]:
        """The message types, in order, of the exchanges of these kinds (default: what was
        delivered to aggregates — ``input``, ``message``, ``reply``)."""
        want = kinds or ("input", "message", "reply")
        return [e.type for e in self._items if e.kind in want]

    def of(self, type: str) -> Timeline:
        """The exchanges of one message type."""
        return Timeline([e for e in self._items if e.type == type])

    def __str__(self) -> str:
        if not self._items:
            return "(no exchanges)"
        types = max(TYPE_WIDTH, *(len(e.type) for e in self._items))
        routes = max(ROUTE_WIDTH, *(len(e.route) for e in self._items))
        head = f"{'step':>4}  {'kind':<7} {'type':<{types}} {'from → to':<{routes}} outcome"
        return "\n".join([head, *(e.line(types, routes) for e in self._items)])

    def __repr__(self) -> str:
        return f"Timeline({len(self._items)} exchanges)\n{self}"

    def diagram(self, title: str = "scenario") -> SequenceDiagram:
        """The exchanges as a sequence diagram in SVG
        (:func:`aggregates.debug.diagram.timeline_diagram`): shows itself in a notebook,
        ``.save(path)`` writes it."""
        from aggregates.debug.diagram import timeline_diagram

        return timeline_diagram(self._items, title)

    def _repr_html_(self) -> str:
        """In a notebook: the diagram, then the table."""
        from html import escape

        return f"{self.diagram().svg()}<pre>{escape(str(self))}</pre>"


def find_cycle(exchanges: Sequence[Exchange], *, longest: int = 32) -> list[Exchange] | None:
    """The shortest repeating run of messages between aggregates at the end of
    ``exchanges`` (by sender type, message type and receiver type; repeated three times),
    or ``None``: the loop a flow that does not settle is caught in."""
    hops = [e for e in exchanges if e.kind in ("message", "reply", "event")]
    keys = [(_kind_of(e.sender), e.type, _kind_of(e.receiver)) for e in hops]
    for period in range(1, longest + 1):
        if len(keys) < 3 * period:
            break
        tail = keys[-3 * period:]
        if tail[:period] == tail[period:2 * period] == tail[2 * period:]:
            return hops[-period:]
    return None


def _kind_of(who: str | None) -> str:
    return (who or "").split("/", 1)[0]
