"""Outcomes by reason per run, as a bar chart in SVG, pure Python (issue 44, item 9): from the
outcome audit log the pipeline writes (``aggbox run --outcomes``; one ``run_id=…`` directory
per run), one group of horizontal bars per run — a bar per outcome and reason, as long as its
count, coloured by outcome.

    chart = outcome_chart("s3://bucket/aggbox/audit/")
    chart            # in a notebook: the chart
    chart.save("outcomes.svg")

Bars carry ``data-run``, ``data-outcome``, ``data-reason`` and ``data-count`` attributes.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from html import escape
from typing import TYPE_CHECKING, Any

from aggregates.debug.diagram import OUTCOME_COLOURS, SvgFigure
from aggregates.message.outcomes import OUTCOME_KINDS, Outcome

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["Bar", "OutcomeChart", "outcome_chart"]

_ROW_H, _BAR_W, _LABEL_W, _MARGIN = 20, 360.0, 300.0, 20


@dataclass(frozen=True, slots=True)
class Bar:
    """How many outcomes of one run had this outcome and reason (``""``: none)."""

    run: str
    outcome: str
    reason: str
    count: int


@dataclass(frozen=True)
class OutcomeChart(SvgFigure):
    """The bars, run by run; ``svg`` renders them."""

    title: str
    bars: tuple[Bar, ...]

    def svg(self) -> str:
        runs = list(dict.fromkeys(b.run for b in self.bars))
        most = max((b.count for b in self.bars), default=1) or 1
        rows = len(self.bars) + len(runs)
        width = _MARGIN * 2 + _LABEL_W + _BAR_W + 80
        height = _MARGIN * 2 + 24 + rows * _ROW_H
        out = [f'<svg xmlns="http://www.w3.org/2000/svg" class="aggbox-outcomes" '
               f'width="{width:.0f}" height="{height:.0f}" '
               f'viewBox="0 0 {width:.0f} {height:.0f}" font-family="sans-serif" '
               f'font-size="12">',
               '<rect width="100%" height="100%" fill="white"/>',
               f'<text class="title" x="{_MARGIN}" y="{_MARGIN + 4}" font-size="14" '
               f'font-weight="bold">{escape(self.title)}</text>']
        y = _MARGIN + 24
        for run in runs:
            y += _ROW_H
            out.append(f'<text class="run" x="{_MARGIN}" y="{y - 4}" font-weight="bold">'
                       f'run {escape(run)}</text>')
            for b in (b for b in self.bars if b.run == run):
                y += _ROW_H
                length = max(1.0, _BAR_W * b.count / most)
                colour = OUTCOME_COLOURS.get(b.outcome, "#9e9e9e")
                name = b.outcome + (f" / {b.reason}" if b.reason else "")
                x0 = _MARGIN + _LABEL_W
                out.append(
                    f'<g class="bar" data-run="{escape(run)}" data-outcome="{escape(b.outcome)}"'
                    f' data-reason="{escape(b.reason)}" data-count="{b.count}">'
                    f'<text x="{x0 - 8:.1f}" y="{y - 5}" text-anchor="end">{escape(name)}</text>'
                    f'<rect x="{x0:.1f}" y="{y - _ROW_H + 4}" width="{length:.1f}" '
                    f'height="{_ROW_H - 6}" fill="{colour}"/>'
                    f'<text x="{x0 + length + 6:.1f}" y="{y - 5}">{b.count:,}</text></g>')
        out.append("</svg>")
        return "\n".join(out) + "\n"


def outcome_chart(audit: pd.DataFrame | str | os.PathLike[str]
                  | Iterable[Outcome | Mapping[str, Any]],
                  *, title: str = "outcomes by reason per run") -> OutcomeChart:
    """Count the audit log's rows by run (``run_id``; a log without one is one run, ``all``),
    outcome and reason: ``audit`` as :func:`~aggregates.debug.trace.trace` takes it (Parquet
    path, DataFrame, outcomes). Runs in the log's order; within a run, outcomes in their
    usual order, reasons by count. Needs pandas."""
    from aggregates.debug._deps import require_pandas
    from aggregates.debug.trace import _load

    df = _load(require_pandas("outcome_chart()"), audit)
    runs = [str(r) for r in df["run_id"]] if "run_id" in df.columns else ["all"] * len(df)
    reasons = [str(r) if isinstance(r, str) and r else "" for r in
               (df["reason"] if "reason" in df.columns else [""] * len(df))]
    counts = Counter(zip(runs, [str(o) for o in df["outcome"]], reasons, strict=True))
    order: dict[str, int] = {k: i for i, k in enumerate(OUTCOME_KINDS)}
    run_order = {r: i for i, r in enumerate(dict.fromkeys(runs))}
    bars = sorted((Bar(run, outcome, reason, n) for (run, outcome, reason), n in counts.items()),
                  key=lambda b: (run_order[b.run], order.get(b.outcome, len(order)),
                                 -b.count, b.reason))
    return OutcomeChart(title, tuple(bars))
