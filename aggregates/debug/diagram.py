"""A message flow as a picture: a sequence (swimlane) diagram in SVG, pure Python (issue 44,
item 9). One vertical lane per participant — the test or the input, each aggregate
(``Type/id``), the effects, the events — and one horizontal arrow per message, top to bottom
in order, labelled with its type and its outcome, coloured by outcome.

- :func:`trace_diagram` draws a :class:`~aggregates.debug.trace.Trace` (the causation chain
  read from the audit log): an arrow from the aggregate that emitted a message (the input for
  the first) to the aggregate that handled it, one per audit row.
- :func:`timeline_diagram` draws a Scenario's :class:`~aggregates.testing.Timeline`: its
  deliveries, publications, effect calls and replies as arrows, injected faults as notes.

A :class:`SequenceDiagram` shows itself in a notebook (``_repr_svg_``, ``_repr_html_``) and
writes a file (:meth:`SequenceDiagram.save`; ``aggbox trace … --svg FILE``). Lanes, arrows and
notes carry ``data-*`` attributes (``data-lane``; ``data-from``, ``data-to``, ``data-label``,
``data-outcome``), so that a test or a tool reads the drawing back.
"""

from __future__ import annotations

import os
import re
from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from html import escape
from pathlib import Path
from typing import Any, Protocol

__all__ = ["NOWHERE", "OUTCOME_COLOURS", "Arrow", "Note", "SequenceDiagram", "SvgFigure", "Traced",
           "timeline_diagram", "trace_diagram", "write_svg"]

#: Arrow colours by outcome (an effect's answers too); anything else is drawn grey.
OUTCOME_COLOURS = {
    "applied": "#2e7d32", "ok": "#2e7d32", "published": "#1565c0", "recorded": "#1565c0",
    "duplicate": "#757575", "dead_lettered": "#c62828", "permanent": "#c62828",
    "parked": "#ef6c00", "retryable": "#ef6c00", "timeout": "#ef6c00",
    "answer lost": "#ef6c00",
}
_GREY = "#9e9e9e"
#: The lane of a message that reached no aggregate.
NOWHERE = "(not processed)"

_CHAR_W, _ROW_H, _TOP, _HEAD_H, _MARGIN = 7.0, 34, 20, 30, 20


@dataclass(frozen=True, slots=True)
class Arrow:
    """One message: from lane ``source`` to lane ``target`` (the same lane: a message to
    itself, drawn as a loop), labelled ``label``; ``outcome`` colours it (None: not
    processed, dashed), ``reason`` follows it; ``title`` is the tooltip (the message id)."""

    source: str
    target: str
    label: str
    outcome: str | None = None
    reason: str | None = None
    title: str = ""

    @property
    def text(self) -> str:
        said = self.outcome or "not processed"
        return f"{self.label} · {said}" + (f" ({self.reason})" if self.reason else "")

    @property
    def colour(self) -> str:
        return OUTCOME_COLOURS.get(self.outcome or "", _GREY)


@dataclass(frozen=True, slots=True)
class Note:
    """A line of text across the lanes between two arrows (an injected fault)."""

    text: str
    lane: str


class SvgFigure(ABC):
    """A figure that renders itself as SVG (:meth:`svg`): shown as such in a notebook,
    written to a file by :meth:`save`."""

    @abstractmethod
    def svg(self) -> str:
        """The figure as an SVG document."""

    def _repr_svg_(self) -> str:
        return self.svg()

    def _repr_html_(self) -> str:
        return self.svg()

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write :meth:`svg` to ``path``; the path."""
        return write_svg(self.svg(), path)


@dataclass(frozen=True)
class SequenceDiagram(SvgFigure):
    """Lanes (left to right) and rows (arrows and notes, top to bottom). ``svg`` renders it."""

    title: str
    lanes: tuple[str, ...]
    rows: tuple[Arrow | Note, ...] = field(default=())

    @property
    def arrows(self) -> list[Arrow]:
        return [r for r in self.rows if isinstance(r, Arrow)]

    def svg(self) -> str:
        """The diagram as a standalone SVG document (UTF-8 text)."""
        width_of = {lane: max(120.0, _CHAR_W * len(lane) + 24) for lane in self.lanes}
        longest = max((len(a.text) for a in self.arrows), default=0)
        gap = max(60.0, _CHAR_W * longest * 0.6)
        xs: dict[str, float] = {}
        x = float(_MARGIN)
        for lane in self.lanes:
            xs[lane] = x + width_of[lane] / 2
            x += width_of[lane] + gap
        width = x + _MARGIN  # a gap to the right of the last lane: a loop's label
        title_h = 24 if self.title else 0
        top = _TOP + title_h
        height = top + _HEAD_H + _ROW_H * (len(self.rows) + 1) + _MARGIN
        out = [f'<svg xmlns="http://www.w3.org/2000/svg" class="aggbox-sequence" '
               f'width="{width:.0f}" height="{height:.0f}" '
               f'viewBox="0 0 {width:.0f} {height:.0f}" font-family="sans-serif" '
               f'font-size="12">',
               "<defs>" + "".join(_marker(c) for c in dict.fromkeys(
                   a.colour for a in self.arrows)) + "</defs>",
               '<rect width="100%" height="100%" fill="white"/>']
        if self.title:
            out.append(f'<text class="title" x="{_MARGIN}" y="{_TOP + 4}" font-size="14" '
                       f'font-weight="bold">{escape(self.title)}</text>')
        bottom = height - _MARGIN
        for lane in self.lanes:
            cx, w = xs[lane], width_of[lane]
            out.append(
                f'<g class="lane" data-lane="{escape(lane)}">'
                f'<rect x="{cx - w / 2:.1f}" y="{top}" width="{w:.1f}" height="{_HEAD_H - 6}" '
                f'rx="4" fill="#eceff1" stroke="#455a64"/>'
                f'<text x="{cx:.1f}" y="{top + 16}" text-anchor="middle">{escape(lane)}</text>'
                f'<line x1="{cx:.1f}" y1="{top + _HEAD_H - 6}" x2="{cx:.1f}" y2="{bottom}" '
                f'stroke="#b0bec5" stroke-dasharray="4 3"/></g>')
        for i, row in enumerate(self.rows):
            y = top + _HEAD_H + _ROW_H * (i + 1)
            out.append(_note(row, xs, y, width) if isinstance(row, Note)
                       else _arrow(row, xs, y))
        out.append("</svg>")
        return "\n".join(out) + "\n"


def write_svg(svg: str, path: str | os.PathLike[str]) -> Path:
    target = Path(path)
    target.write_text(svg, encoding="utf-8")
    return target


def _marker(colour: str) -> str:
    """An arrowhead of ``colour`` (one per colour: ``context-stroke`` is not drawn
    everywhere)."""
    return (f'<marker id="head{colour[1:]}" viewBox="0 0 10 10" refX="10" refY="5" '
            f'markerWidth="8" markerHeight="8" orient="auto"><path d="M0,0 L10,5 L0,10 z" '
            f'fill="{colour}"/></marker>')


def _arrow(a: Arrow, xs: dict[str, float], y: float) -> str:
    colour = a.colour
    dash = ' stroke-dasharray="6 4"' if a.outcome is None else ""
    head = f'marker-end="url(#head{colour[1:]})"'
    x1, x2 = xs[a.source], xs[a.target]
    attrs = (f'class="arrow" data-from="{escape(a.source)}" data-to="{escape(a.target)}" '
             f'data-label="{escape(a.label)}" data-outcome="{escape(a.outcome or "")}" '
             f'data-reason="{escape(a.reason or "")}"')
    tip = f"<title>{escape(a.title)}</title>" if a.title else ""
    text = escape(a.text)
    if x1 == x2:  # to itself: a loop on the right of its lane
        path = (f'<path d="M{x1:.1f},{y - 10} h28 v14 h-26" fill="none" stroke="{colour}" '
                f'stroke-width="1.6"{dash} {head}/>')
        label = f'<text x="{x1 + 34:.1f}" y="{y}" fill="{colour}">{text}</text>'
        return f"<g {attrs}>{tip}{path}{label}</g>"
    line = (f'<line x1="{x1:.1f}" y1="{y}" x2="{x2:.1f}" y2="{y}" stroke="{colour}" '
            f'stroke-width="1.6"{dash} {head}/>')
    label = (f'<text x="{(x1 + x2) / 2:.1f}" y="{y - 6}" text-anchor="middle" '
             f'fill="{colour}">{text}</text>')
    return f"<g {attrs}>{tip}{line}{label}</g>"


def _note(n: Note, xs: dict[str, float], y: float, width: float) -> str:
    cx = xs.get(n.lane, width / 2)
    return (f'<g class="note" data-lane="{escape(n.lane)}" data-text="{escape(n.text)}">'
            f'<text x="{cx:.1f}" y="{y - 4}" text-anchor="middle" fill="#6a1b9a" '
            f'font-style="italic">⚡ {escape(n.text)}</text></g>')


def _lanes(first: Sequence[str], rows: Iterable[Arrow | Note]) -> tuple[str, ...]:
    """The lanes in order of first appearance, ``first`` before all."""
    seen = dict.fromkeys(first)
    for r in rows:
        for lane in ((r.source, r.target) if isinstance(r, Arrow) else (r.lane,)):
            seen.setdefault(lane)
    return tuple(seen)


# -- from a trace -------------------------------------------------------------------------------
class Traced(Protocol):
    """What :func:`trace_diagram` reads of a :class:`~aggregates.debug.trace.Trace` (which
    imports this module: no import back)."""

    @property
    def message_id(self) -> str: ...

    @property
    def frame(self) -> Any: ...


def trace_diagram(t: Traced) -> SequenceDiagram:
    """The causation chain of ``t``: for each audit row of each message in it (causes, the
    traced message, its effects, in :attr:`Trace.frame` order), an arrow from the lane of the
    aggregate that emitted it (``input`` for the first) to the lane of the aggregate that
    handled it (:data:`NOWHERE` for a message not in the log), labelled with its type (else
    its id, a long one cut to 8 characters; the tooltip has it whole) and coloured by its
    outcome."""
    records = t.frame.to_dict("records")
    lane_of: dict[str, str] = {}
    for r in records:
        if _text(r.get("aggregate_type")):
            lane_of.setdefault(str(r["message_id"]),
                               f"{r['aggregate_type']}/{r.get('aggregate_id')}")
    rows: list[Arrow | Note] = []
    for r in records:
        mid, parent = str(r["message_id"]), r.get("parent_id")
        # pandas holds a missing parent as NaN: only a string names one
        source = lane_of.get(parent, NOWHERE) if isinstance(parent, str) and parent else "input"
        # the pipeline's audit log names the type message_type; outcomes have none
        mtype = _text(r.get("type")) or _text(r.get("message_type"))
        outcome, reason = _text(r.get("outcome")), _text(r.get("reason"))
        label = mtype or (mid if len(mid) <= 16 else mid[:8] + "…")
        if str(r.get("from_parked")) == "True":  # a bool, or numpy's
            reason = ", ".join(filter(None, [reason, "released from parking"]))
        rows.append(Arrow(source, lane_of.get(mid, NOWHERE), label, outcome, reason or None,
                          title=mid))
    return SequenceDiagram(f"trace of {t.message_id}", _lanes(["input"], rows), tuple(rows))


def _text(value: Any) -> str | None:
    """A frame's cell as text: None for a missing value (None, NaN)."""
    return value if isinstance(value, str) and value else None


# -- from a Scenario's timeline -----------------------------------------------------------------
_TIMER_KEY = re.compile(r"^(?P<lane>\S+) \((?P<key>'[^']*'|\"[^\"]*\")\)$")


def _participant(who: str | None, *, test: str = "test") -> str:
    """A timeline's sender or receiver as a lane: ``Type/id`` (a timer's sender names its
    key: ``Booking/b-1 ('payment')`` is the lane ``Booking/b-1``), ``test``, ``effect``,
    ``events`` (published events: ``recorded``, ``N listener(s)``), ``listener of X``."""
    if who is None:
        return test
    m = _TIMER_KEY.match(who)
    if m:
        return m["lane"]
    if who == "recorded" or who.endswith("listener(s)"):
        return "events"
    return who


def timeline_diagram(timeline: Iterable[Any], title: str = "scenario") -> SequenceDiagram:
    """A Scenario's timeline (:class:`~aggregates.testing.Timeline`, or its exchanges): an
    arrow per input, message, event, effect call and reply — from its sender to its
    receiver, labelled with its type, coloured by its outcome; a timer is labelled with its
    key; a fault is a note on the lane it disturbs."""
    rows: list[Arrow | Note] = []
    for e in timeline:
        source, target = _participant(e.sender), _participant(e.receiver, test=NOWHERE)
        if e.kind == "fault":
            rows.append(Note(f"{e.type}: {e.note or e.outcome}",
                             target if e.receiver else source))
            continue
        label = e.type
        m = _TIMER_KEY.match(e.sender or "")
        if m:
            label += f" ⏰ {m['key']}"
        if e.kind == "input":
            source = "test"
        rows.append(Arrow(source, target, label, e.outcome, e.reason,
                          title=f"{e.step}: {e.message_id}"))
    return SequenceDiagram(title, _lanes(["test"], rows), tuple(rows))
