"""Plain-text and HTML rendering of small tables for the notebook helpers (pure).

Everything shown comes from stored documents and payloads, i.e. untrusted input: the HTML
renderer escapes every value."""

from __future__ import annotations

import html
import json
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

Row = Sequence[Any]


def fmt_time(value: Any) -> str:
    """``2026-01-01T00:00:00.123Z`` for datetimes (naive ones are UTC), ``—`` for None."""
    if value is None:
        return "—"
    if isinstance(value, datetime):
        dt = value if value.tzinfo else value.replace(tzinfo=UTC)
        text = dt.astimezone(UTC).isoformat(timespec="milliseconds")
        return text.replace("+00:00", "Z")
    return str(value)


def _json_default(value: Any) -> Any:
    if isinstance(value, datetime):
        return fmt_time(value)
    if isinstance(value, bytes):
        return value.hex()
    if isinstance(value, set | frozenset | tuple):
        return list(value)
    return str(value)


def compact(value: Any, width: int | None = 80) -> str:
    """A one-line rendering (compact JSON for containers), cut to ``width`` characters."""
    if value is None:
        text = "—"
    elif isinstance(value, str):
        text = value
    elif isinstance(value, datetime):
        text = fmt_time(value)
    else:
        text = json.dumps(value, default=_json_default, ensure_ascii=False,
                          separators=(",", ":"))
    text = " ".join(text.split()) if "\n" in text else text
    if width is not None and len(text) > width:
        return text[: max(width - 1, 1)] + "…"
    return text


def text_table(headers: Sequence[str], rows: Sequence[Row], *, indent: str = "  ",
               width: int = 60, max_rows: int | None = None) -> str:
    """Columns padded to their widest cell (cells cut to ``width``)."""
    shown, more = _limit(rows, max_rows)
    cells = [[compact(c, width) for c in r] for r in shown]
    widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(headers)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip()]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
              for r in cells]
    if more:
        lines.append(f"… {more} more")
    return "\n".join(indent + line for line in lines)


def html_table(headers: Sequence[str], rows: Sequence[Row], *, width: int = 120,
               max_rows: int | None = None) -> str:
    shown, more = _limit(rows, max_rows)
    head = "".join(f"<th style='text-align:left'>{html.escape(h)}</th>" for h in headers)
    body = "".join(
        "<tr>" + "".join(f"<td style='text-align:left'><code>{html.escape(compact(c, width))}"
                         "</code></td>" for c in r) + "</tr>"
        for r in shown
    )
    foot = f"<p><i>… {more} more</i></p>" if more else ""
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>{foot}"


def esc(value: Any, width: int | None = None) -> str:
    """An escaped one-line rendering for HTML."""
    return html.escape(compact(value, width))


def _limit(rows: Sequence[Row], max_rows: int | None) -> tuple[Sequence[Row], int]:
    if max_rows is None or len(rows) <= max_rows:
        return rows, 0
    return rows[:max_rows], len(rows) - max_rows
