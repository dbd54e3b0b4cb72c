"""``notebooks/debugging.ipynb`` runs top to bottom against the session's MongoDB server, tells
the story it claims, cleans up after itself, and is committed with the outputs of a run.

Its pictures (issue 44, item 9): the trace and the Scenario timeline as sequence diagrams and
the outcomes by reason per run as a bar chart, SVG in the cells' HTML output — their lanes,
arrows and bars read back from the SVG's XML and compared with what the notebook's text says
— and the same outputs in headless Chromium, whose screenshot shows the arrows' and bars'
colours (Chromium is required, not skipped: .ci/run checks for it)."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest
from pymongo import MongoClient

from tests.docs.notebook import code_cells, execute, output_text, read_notebook
from tests.docs.screenshot import CHROMIUM_HINT, chromium, pixels, screenshot

pytestmark = pytest.mark.mongo


#: Warnings a run on a loaded machine may add to a cell's stderr (a dispatcher's lease round
#: slower than a quarter of its TTL): what the machine did, not what the notebook shows.
_LOAD_WARNINGS = ("the store answers slowly",)


def _load_warning_only(out: Any) -> bool:
    lines = [line for line in str(out.get("text", "")).splitlines() if line.strip()]
    return bool(lines) and all(any(w in line for w in _LOAD_WARNINGS) for line in lines)


def _kinds(cell: Any) -> list[tuple[str, ...]]:
    """What a cell showed, by kind: stream name, or result/display with its MIME types."""
    kinds: list[tuple[str, ...]] = []
    for out in cell.get("outputs", []):
        if out.output_type == "stream" and out.name == "stderr" and _load_warning_only(out):
            continue
        if out.output_type == "stream":
            # The kernel may split one print's text into several stream messages (timing):
            # consecutive outputs of the same stream count as one.
            if not kinds or kinds[-1] != ("stream", out.name):
                kinds.append(("stream", out.name))
        else:
            kinds.append((out.output_type, *sorted(out.get("data", {}))))
    return kinds


def _notebook_databases(client: MongoClient[dict[str, Any]]) -> set[str]:
    return {n for n in client.list_database_names() if n.startswith("debugging_")}


def test_the_notebook_runs_and_shows_the_failures_and_their_fixes(
        mongo_uri: str, mongo_client: MongoClient[dict[str, Any]], tmp_path: Path) -> None:
    before = _notebook_databases(mongo_client)
    nb = execute(workdir=tmp_path)  # raises CellExecutionError naming the failing cell
    cells = code_cells(nb)
    text = "\n".join(output_text(c) for c in cells)

    # The poison message is dead-lettered with the handler's error ...
    assert "handler_error" in text
    assert "ValueError: order amount must be positive, got -40" in text
    # ... the fixed handler rejects the order, and the replay settles the dead letter.
    assert "status='rejected'" in text
    assert "ok: True | status: {'Order/o-2/place-o2': 'replayed'}" in text
    # The reused message id is dead-lettered and changes nothing.
    assert "duplicate_with_different_payload" in text
    assert "credit limit still 500" in text
    # The trace follows the chain across runs and shows the poison message's history.
    assert "place-o1 Order/o-1: applied, emitted 1   ◀ traced" in text
    assert "place-o2 Order/o-2: dead_lettered (handler_error) → applied" in text
    # The same flow as a unit test: a scenario's timeline, a duplicate recognised.
    assert "message OrderCreated             Order/o-1 → Customer/c-1             duplicate" in text
    assert "Order(customer_id='c-1', amount=900, status='rejected')" in text
    # load_aggregate renders as HTML in Jupyter.
    assert any("text/html" in out.get("data", {}) and "aggregate <code>Customer/c-1" in
               out.data["text/html"] for c in cells for out in c.outputs
               if out.output_type == "execute_result")
    # The last cell dropped the notebook's database.
    assert _notebook_databases(mongo_client) == before

    # The committed notebook holds the outputs of a complete run of the current cells
    # (regenerate with `python -m tests.docs.notebook --write`).
    committed = code_cells(read_notebook())
    assert [c.source for c in committed] == [c.source for c in cells]
    assert [c.execution_count for c in committed] == list(range(1, len(committed) + 1))
    assert [_kinds(c) for c in committed] == [_kinds(c) for c in cells]
    assert all(c.outputs for c in committed[:-1]), "commit the notebook with its outputs"
    assert not [o for c in committed for o in c.outputs if o.output_type == "error"]

    _check_pictures(cells, tmp_path)


SVG = "{http://www.w3.org/2000/svg}"


def _svg_of(cells: list[Any], source: str) -> str:
    """The SVG the cell whose source is ``source`` showed (its execute_result's SVG and HTML
    are the same drawing)."""
    (cell,) = [c for c in cells if c.source == source]
    (out,) = [o for o in cell.outputs if o.output_type == "execute_result"]
    assert out.data["text/html"] == out.data["image/svg+xml"]
    return str(out.data["image/svg+xml"])


def _groups(svg: str, kind: str) -> list[dict[str, str]]:
    root = ET.fromstring(svg)
    return [dict(g.attrib) for g in root.iter(f"{SVG}g") if g.get("class") == kind]


def _check_pictures(cells: list[Any], tmp_path: Path) -> None:
    chain = _svg_of(cells, "t.diagram()")
    # the trace printed as text: place-o1 Order/o-1 → Customer/c-1 (applied) → Order/o-1
    assert [g["data-lane"] for g in _groups(chain, "lane")] == [
        "input", "Order/o-1", "Customer/c-1"]
    assert [(g["data-from"], g["data-to"], g["data-outcome"])
            for g in _groups(chain, "arrow")] == [
        ("input", "Order/o-1", "applied"), ("Order/o-1", "Customer/c-1", "applied"),
        ("Customer/c-1", "Order/o-1", "applied")]
    bars = _svg_of(cells, "from aggregates.debug import outcome_chart\n\n"
                          "outcome_chart(audit_dir)")
    counted = {(g["data-run"], g["data-outcome"], g["data-reason"]): int(g["data-count"])
               for g in _groups(bars, "bar")}
    assert counted[("run-1", "dead_lettered", "handler_error")] == 1  # the poison message
    assert ("run-5", "dead_lettered", "duplicate_with_different_payload") in counted
    timeline = _svg_of(cells, "sc.timeline.diagram()")
    assert [g["data-lane"] for g in _groups(timeline, "lane")] == [
        "test", "Customer/c-1", "Order/o-1", "Order/o-2"]
    assert [g["data-text"] for g in _groups(timeline, "note")] == [
        "OrderCreated: delivered twice"]
    assert ("Order/o-1", "Customer/c-1", "duplicate") in [
        (g["data-from"], g["data-to"], g["data-outcome"]) for g in _groups(timeline, "arrow")]

    # As a person sees them: the three drawings in Chromium.
    assert chromium() is not None, CHROMIUM_HINT
    page = tmp_path / "pictures.html"
    page.write_text('<html><body style="margin:0;background:white">'
                    + "".join(f"<div>{svg}</div>" for svg in (chain, bars, timeline))
                    + "</body></html>", encoding="utf-8")
    shown = pixels(screenshot(page, tmp_path / "pictures.png", width=1100, height=1100))
    green, red, lane = (46, 125, 50), (198, 40, 40), (236, 239, 241)  # applied, dead, lane box
    assert shown[green] > 2000 and shown[red] > 1000 and shown[lane] > 5000, \
        shown.most_common(8)
