"""The text pieces of ``aggbox dispatch-status`` (pure): partition ranges, ages, pending
counts and aligned columns; :func:`dispatcher.status.report.format_status` puts them together."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

__all__ = ["columns", "compress_ranges", "format_age", "pending_text"]


def compress_ranges(numbers: Iterable[int]) -> str:
    """``[0, 1, 2, 3, 7, 9, 10]`` → ``"0-3, 7, 9-10"`` (sorted, duplicates ignored);
    ``""`` for none."""
    parts: list[str] = []
    values = sorted(set(numbers))
    i = 0
    while i < len(values):
        j = i
        while j + 1 < len(values) and values[j + 1] == values[j] + 1:
            j += 1
        parts.append(str(values[i]) if i == j else f"{values[i]}-{values[j]}")
        i = j + 1
    return ", ".join(parts)


def format_age(seconds: float | None) -> str:
    """``3.2s``, ``4m05s``, ``2h07m``, ``3d04h``; ``-`` for none."""
    if seconds is None:
        return "-"
    if seconds < 60:
        return f"{seconds:.1f}s"
    s = int(seconds)
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


def pending_text(entries: int, documents: int) -> str:
    return (f"{entries} entr{'y' if entries == 1 else 'ies'} in {documents} "
            f"doc{'' if documents == 1 else 's'}")


def columns(rows: Sequence[Sequence[str]]) -> list[str]:
    widths = [max(len(r[c]) for r in rows) for c in range(len(rows[0]))]
    return ["  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip()
            for r in rows]
