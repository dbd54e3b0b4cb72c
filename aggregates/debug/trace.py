"""Follow one message through the outcome audit log: what caused it, what it caused.

The Spark pipeline writes one audit row per outcome (Parquet; columns ``message_id``,
``aggregate_type``, ``aggregate_id``, ``outcome``, ``reason``, ``detail``, ``emitted_ids``,
``attempt``, ``from_parked``, possibly run/batch ids). Emitted message ids are deterministic
(:func:`aggregates.core.ids.emitted_message_id`) and an emitted id is the ``message_id`` of the
input message it becomes downstream, so ``emitted_ids`` link the rows into causation chains.

    t = trace("s3://bucket/aggbox/audit/", "place-42")
    print(t)       # the tree
    t.frame        # one row per audit row (or per message not seen yet), with ``depth``
"""

from __future__ import annotations

import html
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from aggregates.core.errors import AggboxError
from aggregates.debug._deps import make_frame, require_pandas
from aggregates.debug.render import compact
from aggregates.message.outcomes import Outcome

if TYPE_CHECKING:
    import pandas as pd

    from aggregates.debug.diagram import SequenceDiagram

#: Columns every audit log must have.
REQUIRED_COLUMNS = ("message_id", "outcome", "emitted_ids")
#: Columns shown in the trace (when present), after ``depth``, ``relation``, ``parent_id``.
AUDIT_COLUMNS = ("message_id", "type", "aggregate_type", "aggregate_id", "outcome", "reason",
                 "detail", "emitted_ids", "attempt", "from_parked")

NOT_SEEN = "not in the audit log (not processed yet, or consumed outside the pipeline)"


@dataclass(frozen=True)
class Trace:
    """The causation chain of one message. ``frame`` has one row per audit row of each
    message in the chain (a message without any has one row with ``outcome`` None), with
    ``depth`` (< 0: causes, 0: the traced message, > 0: effects), ``relation`` and
    ``parent_id`` (the message whose handling emitted it). ``str(trace)`` is a text tree."""

    message_id: str
    frame: pd.DataFrame = field(repr=False)
    tree: str = field(repr=False)

    @property
    def causes(self) -> list[str]:
        """Message ids that led to this one, the original input first."""
        rows = self.frame[self.frame["depth"] < 0].sort_values("depth", kind="stable")
        return list(dict.fromkeys(rows["message_id"]))

    @property
    def effects(self) -> list[str]:
        """Message ids this one caused, directly or further downstream (depth first)."""
        return list(dict.fromkeys(self.frame[self.frame["depth"] > 0]["message_id"]))

    def __str__(self) -> str:
        return self.tree

    def __repr__(self) -> str:
        return self.tree

    def diagram(self) -> SequenceDiagram:
        """The chain as a sequence diagram (:func:`aggregates.debug.diagram.trace_diagram`):
        shows itself in a notebook, ``.save(path)`` writes the SVG."""
        from aggregates.debug.diagram import trace_diagram

        return trace_diagram(self)

    def _repr_html_(self) -> str:
        table: str = self.frame.to_html(index=False, escape=True)
        return f"{self.diagram().svg()}<pre>{html.escape(self.tree)}</pre>{table}"


def trace(
    audit: pd.DataFrame | str | os.PathLike[str] | Iterable[Outcome | Mapping[str, Any]],
    message_id: str,
    *,
    max_depth: int = 100,
) -> Trace:
    """Trace ``message_id`` through ``audit``: a path to Parquet file(s) or a directory of
    them (read with pandas/pyarrow), a pandas DataFrame, or outcomes (:class:`Outcome` or
    dicts, e.g. from :meth:`StoreWriter.process`). Walks back through the messages whose
    ``emitted_ids`` contain it, and forward through its ``emitted_ids``, recursively (at
    most ``max_depth`` levels each way; cycles are cut). Needs pandas."""
    df = _load(require_pandas("trace()"), audit)
    missing = [c for c in REQUIRED_COLUMNS if c not in df.columns]
    if missing:
        raise AggboxError(f"the audit log lacks column(s) {missing}; it needs "
                          f"{list(REQUIRED_COLUMNS)} (as written by the aggbox Spark pipeline)")
    df = df.reset_index(drop=True)
    emitted = [_ids(v) for v in df["emitted_ids"]]
    rows_of, parent_of, children_of = _links(df, emitted)
    if message_id not in rows_of and message_id not in parent_of:
        raise AggboxError(f"message id {message_id!r} is neither in the audit log "
                          f"({len(df)} rows) nor emitted by any message in it; check the id "
                          "and that the log covers the run that processed it")
    nodes = _walk(message_id, parent_of, children_of, max_depth)
    extra = [c for c in df.columns if c not in AUDIT_COLUMNS]
    columns = ["depth", "relation", "parent_id",
               *[c for c in AUDIT_COLUMNS if c in df.columns or c in REQUIRED_COLUMNS], *extra]
    records = _records(df, emitted, rows_of, nodes)
    frame = make_frame("trace()", records, columns)
    return Trace(message_id, frame, _tree(nodes, records, message_id))


#: A traced message: (message id, depth — negative for causes, parent id).
_Node = tuple[str, int, "str | None"]


def _links(df: Any, emitted: list[list[str]]
           ) -> tuple[dict[str, list[int]], dict[str, str], dict[str, list[str]]]:
    """The audit rows of each message id, each emitted id's emitter, each emitter's ids."""
    rows_of: dict[str, list[int]] = {}
    for pos, mid in enumerate(df["message_id"]):
        rows_of.setdefault(str(mid), []).append(pos)
    parent_of: dict[str, str] = {}
    children_of: dict[str, list[str]] = {}
    for pos, ids in enumerate(emitted):
        emitter = str(df.at[pos, "message_id"])
        kids = children_of.setdefault(emitter, [])
        for e in ids:
            parent_of.setdefault(e, emitter)
            if e not in kids:
                kids.append(e)
    return rows_of, parent_of, children_of


def _walk(message_id: str, parent_of: dict[str, str], children_of: dict[str, list[str]],
          max_depth: int) -> list[_Node]:
    """The single chain of causes (original input first), the traced message, then its
    effects depth first in emission order; at most ``max_depth`` levels each way, cycles
    cut."""
    causes: list[str] = []
    seen = {message_id}
    cur = message_id
    while cur in parent_of and len(causes) < max_depth:
        cur = parent_of[cur]
        if cur in seen:
            break
        seen.add(cur)
        causes.append(cur)
    causes.reverse()
    nodes: list[_Node] = [(mid, d - len(causes), causes[d - 1] if d else None)
                          for d, mid in enumerate(causes)]
    nodes.append((message_id, 0, causes[-1] if causes else None))

    def forward(mid: str, depth: int) -> None:
        if depth >= max_depth:
            return
        for kid in children_of.get(mid, []):
            if kid in seen:
                continue
            seen.add(kid)
            nodes.append((kid, depth + 1, mid))
            forward(kid, depth + 1)

    forward(message_id, 0)
    return nodes


def _records(df: Any, emitted: list[list[str]], rows_of: dict[str, list[int]],
             nodes: list[_Node]) -> list[dict[str, Any]]:
    records: list[dict[str, Any]] = []
    for mid, depth, parent in nodes:
        relation = "cause" if depth < 0 else "traced" if depth == 0 else "effect"
        base = {"depth": depth, "relation": relation, "parent_id": parent}
        positions = rows_of.get(mid)
        if not positions:
            records.append({**base, "message_id": mid, "outcome": None, "emitted_ids": []})
            continue
        for pos in positions:
            row = {c: _plain(df.at[pos, c]) for c in df.columns}
            row["emitted_ids"] = emitted[pos]
            records.append({**base, **row})
    return records


def _load(pd: Any, audit: Any) -> Any:
    if isinstance(audit, pd.DataFrame):
        return audit
    if isinstance(audit, str | os.PathLike):
        try:
            return pd.read_parquet(audit)
        except (FileNotFoundError, OSError) as exc:
            raise AggboxError(f"cannot read the audit log at {os.fspath(audit)!r}: {exc}; "
                              "pass a Parquet file or directory, or a DataFrame") from None
    rows = [a.to_dict() if isinstance(a, Outcome) else dict(a) for a in audit]
    return pd.DataFrame(rows)


def _ids(value: Any) -> list[str]:
    """``emitted_ids`` as a list of strings (Parquet lists arrive as numpy arrays)."""
    if isinstance(value, str):
        return [value] if value else []
    try:
        return [str(v) for v in value]
    except TypeError:  # None, NaN, pd.NA: nothing emitted
        return []


def _plain(value: Any) -> Any:
    """numpy scalars → Python values; NaN/NA → None."""
    item = getattr(value, "item", None)
    if callable(item) and getattr(value, "ndim", 1) == 0:
        value = item()
    try:
        if value != value:  # NaN
            return None
    except (TypeError, ValueError):
        pass
    if type(value).__name__ in ("NAType", "NaTType"):
        return None
    return value


def _label(mid: str, rows: Sequence[Mapping[str, Any]]) -> str:
    first = rows[0]
    where = (f"{first.get('aggregate_type')}/{first.get('aggregate_id')}"
             if first.get("aggregate_type") else "")
    mtype = first.get("type")
    if first.get("outcome") is None:
        verdict = NOT_SEEN
    else:
        parts = []
        for r in rows:
            text = str(r.get("outcome"))
            if r.get("reason"):
                text += f" ({r['reason']})"
            if r.get("from_parked"):
                text += " [released from parking]"
            parts.append(text)
        verdict = " → ".join(parts)
        n = len(rows[-1].get("emitted_ids") or [])
        if n:
            verdict += f", emitted {n}"
    head = " ".join(p for p in (mid, f"[{mtype}]" if mtype else "", where) if p)
    return f"{head}: {verdict}"


def _tree(nodes: list[tuple[str, int, str | None]], records: list[dict[str, Any]],
          traced: str) -> str:
    by_id: dict[str, list[dict[str, Any]]] = {}
    for r in records:
        by_id.setdefault(str(r["message_id"]), []).append(r)
    kids: dict[str | None, list[str]] = {}
    for mid, _depth, parent in nodes:
        kids.setdefault(parent, []).append(mid)
    lines: list[str] = []

    def walk(mid: str, prefix: str, tail: bool, root: bool) -> None:
        mark = "   ◀ traced" if mid == traced else ""
        branch = "" if root else ("└─ " if tail else "├─ ")
        lines.append(f"{prefix}{branch}{compact(_label(mid, by_id[mid]), None)}{mark}")
        sub = kids.get(mid, [])
        ext = prefix if root else prefix + ("   " if tail else "│  ")
        for i, kid in enumerate(sub):
            walk(kid, ext, i == len(sub) - 1, False)

    root = nodes[0][0]
    walk(root, "", True, True)
    return "\n".join(lines)


__all__ = ["AUDIT_COLUMNS", "REQUIRED_COLUMNS", "Trace", "trace"]
