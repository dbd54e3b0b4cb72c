"""A picture of a flow (issue 44, item 9), through the ``aggbox`` command and the library:

- ``aggbox trace AUDIT ID --svg FILE`` prints the causation chain and writes it as a sequence
  diagram: its lanes are the input and the aggregates of the chain, its arrows one per audit
  row, from the emitter's lane to the handler's, with the row's outcome — read back from the
  SVG's XML and compared with the trace;
- ``aggbox outcomes AUDIT --svg FILE`` counts the audit log by run, outcome and reason, and
  its bar chart has one bar per count;
- a Scenario's timeline as a diagram: an arrow per delivery, publication, effect call and
  reply, a note per fault, lanes in order of appearance.

Before: there was no ``aggbox trace`` command, and the trace and the timeline were text only.
The notebook's diagrams, rendered headless and in Chromium: tests/docs/test_notebook.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from aggbox.examples.orders import customers, orders, registry
from aggregates.testing import Fault, Scenario, message
from aggregates.testing._numbering import numbered_run

AGGBOX = str(Path(sys.executable).with_name("aggbox"))
SVG = "{http://www.w3.org/2000/svg}"


def _scenario() -> Scenario:
    sc = Scenario(registry, faults=[Fault.duplicate("OrderCreated")])
    sc.given(message("CustomerRegistered", {"name": "Ada", "credit_limit": 500}, to=customers,
                     id="c-1"))
    sc.when(message("PlaceOrder", {"customer_id": "c-1", "amount": 120}, to=orders, id="o-1",
                    source=("Checkout", "o-1", 1)),
            message("PlaceOrder", {"customer_id": "c-1", "amount": 900}, to=orders, id="o-2",
                    source=("Checkout", "o-2", 1)))
    return sc


@pytest.fixture
def audit(tmp_path: Path) -> Path:
    """The scenario's outcomes as the pipeline's audit log: Parquet, one ``run_id=…``
    directory per run (the second run a redelivery of the first's input)."""
    import pandas as pd

    # Numbered from 1 whatever ran before in this process: the messages' ids are run-1, ….
    with numbered_run():
        rows = [o.to_dict() for o in _scenario().outcomes]
    frame = pd.DataFrame([{**r, "run_id": "r1"} for r in rows]
                         + [{**rows[1], "outcome": "duplicate", "emitted_ids": [],
                             "run_id": "r2"}])
    frame.to_parquet(tmp_path / "audit", partition_cols=["run_id"])
    return tmp_path / "audit"


def _aggbox(cwd: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.upper().startswith("AGGBOX_")}
    env["AGGBOX_HOME"] = str(cwd / "home")
    return subprocess.run([AGGBOX, *argv], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=600, check=False)  # a hang guard, not a time limit


def _parse(path: Path) -> ET.Element:
    root = ET.parse(path).getroot()
    assert root.tag == f"{SVG}svg"
    return root


def _groups(root: ET.Element, kind: str) -> list[dict[str, str]]:
    return [dict(g.attrib) for g in root.iter(f"{SVG}g") if g.get("class") == kind]


def test_trace_svg_has_a_lane_per_aggregate_and_an_arrow_per_audit_row(
        audit: Path, tmp_path: Path) -> None:
    from aggregates.debug import trace

    done = _aggbox(tmp_path, "trace", str(audit), "run-2", "--svg", "chain.svg")
    assert done.returncode == 0, done.stderr
    assert "run-2 Order/o-1: applied" in done.stdout and "◀ traced" in done.stdout
    assert f"sequence diagram: {tmp_path / 'chain.svg'}" in done.stdout or \
        "sequence diagram: chain.svg" in done.stdout, done.stdout
    root = _parse(tmp_path / "chain.svg")

    # What the diagram must show, from the trace itself: a lane per aggregate of the chain
    # (after the input), and per audit row an arrow from the emitter's aggregate.
    frame = trace(audit, "run-2").frame
    lane_of = {r["message_id"]: f"{r['aggregate_type']}/{r['aggregate_id']}"
               for r in frame.to_dict("records")}
    expected = [(lane_of[r["parent_id"]] if isinstance(r["parent_id"], str) else "input",
                 lane_of[r["message_id"]], r["outcome"]) for r in frame.to_dict("records")]
    lanes = [g["data-lane"] for g in _groups(root, "lane")]
    assert lanes == list(dict.fromkeys(["input", *(lane for _, lane, _ in expected)]))
    assert lanes == ["input", "Order/o-1", "Customer/c-1"]
    arrows = [(g["data-from"], g["data-to"], g["data-outcome"]) for g in _groups(root, "arrow")]
    assert arrows == expected
    assert arrows == [("input", "Order/o-1", "applied"),
                      ("input", "Order/o-1", "duplicate"),  # run r2: the redelivery
                      ("Order/o-1", "Customer/c-1", "applied"),
                      ("Order/o-1", "Customer/c-1", "duplicate"),
                      ("Customer/c-1", "Order/o-1", "applied")]
    # each arrow is drawn between its lanes' lifelines, each lane has its name
    xs = {g.get("data-lane"): float(g.find(f"{SVG}line").get("x1", "nan"))  # type: ignore[union-attr]
          for g in root.iter(f"{SVG}g") if g.get("class") == "lane"}
    for g in (g for g in root.iter(f"{SVG}g") if g.get("class") == "arrow"):
        line = g.find(f"{SVG}line")
        assert line is not None
        assert (float(line.get("x1", "nan")), float(line.get("x2", "nan"))) == \
            (xs[g.get("data-from")], xs[g.get("data-to")])
    names = [t.text for g in root.iter(f"{SVG}g") if g.get("class") == "lane"
             for t in g.iter(f"{SVG}text")]
    assert names == lanes


def test_outcomes_svg_has_a_bar_per_run_outcome_and_reason(audit: Path,
                                                            tmp_path: Path) -> None:
    import pandas as pd

    done = _aggbox(tmp_path, "outcomes", str(audit), "--svg", "bars.svg", "--json")
    assert done.returncode == 0, done.stderr
    frame = pd.read_parquet(audit)
    expected = Counter((str(r["run_id"]), r["outcome"], r["reason"] or "")
                       for r in frame.to_dict("records"))
    printed = {(b["run"], b["outcome"], b["reason"]): b["count"]
               for b in json.loads(done.stdout)["bars"]}
    assert printed == dict(expected)
    bars = {(g["data-run"], g["data-outcome"], g["data-reason"]): int(g["data-count"])
            for g in _groups(_parse(tmp_path / "bars.svg"), "bar")}
    assert bars == dict(expected) == {("r1", "applied", ""): 7, ("r1", "duplicate", ""): 1,
                                      ("r2", "duplicate", ""): 1}


def test_trace_of_an_unknown_id_is_one_line(audit: Path, tmp_path: Path) -> None:
    done = _aggbox(tmp_path, "trace", str(audit), "no-such-id", "--svg", "x.svg")
    assert done.returncode == 1, done
    assert done.stderr.startswith("aggbox trace: error: message id 'no-such-id' is neither in "
                                  "the audit log"), done.stderr
    assert len(done.stderr.splitlines()) == 1 and not (tmp_path / "x.svg").exists()


def test_a_scenario_timeline_as_a_diagram(tmp_path: Path) -> None:
    sc = _scenario()
    diagram = sc.timeline.diagram()
    path = diagram.save(tmp_path / "timeline.svg")
    root = _parse(path)
    lanes = [g["data-lane"] for g in _groups(root, "lane")]
    assert lanes == ["test", "Customer/c-1", "Order/o-1", "Order/o-2"]
    arrows = [(g["data-from"], g["data-to"], g["data-label"], g["data-outcome"])
              for g in _groups(root, "arrow")]
    expected = [("test" if e.kind == "input" else e.sender, e.receiver, e.type, e.outcome)
                for e in sc.timeline if e.kind != "fault"]
    assert arrows == expected
    notes = [g["data-text"] for g in _groups(root, "note")]
    assert notes == [f"{e.type}: {e.note}" for e in sc.timeline if e.kind == "fault"] == \
        ["OrderCreated: delivered twice"]
    html: Any = sc.timeline._repr_html_()  # in a notebook: the diagram, then the table
    assert html.startswith("<svg") and "OrderCreated" in html and "<pre>" in html
