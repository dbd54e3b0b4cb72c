"""CPU cost of ``check_fault_tolerance`` (issue 43): the whole check — the undisturbed run,
the sweeps, the random runs — on the bank of ``tests/aggregates/planted_domain.py``, timed
with ``time.process_time()`` (this process's CPU; the check runs in it, ``hash_seeds`` is
off), and optionally the time each planted bug takes to be found.

Flows (``bank_flow(accounts, transfers, payout=True)``: accounts opened, then transfers
among them, every third a payout through the ``Pay`` effect):

- ``docs``: 50 accounts, 470 transfers — docs/testing.md's example, 1,304 steps;
- ``big``: 500 accounts, 1,875 transfers — 5,500 steps.

``--smoke``: the smallest setting (12 accounts, 30 transfers, 2 random runs), to show the
script works. ``--plants``: also the CPU until each of issue 43's planted bugs is reported
(the ledger's third timer firing and transfer #431, the query that looks up the wrong
key). ``--max-steps N`` is passed to the check (a tree before issue 43 needs it for the
docs flow, whose one ``when()`` takes more than its default of 1,000 steps); ``--examples N``
sets ``max_examples``. Each figure is the best of ``--repeat`` runs (default 1).

Printed: one line per flow (steps, CPU seconds, the report's line); with ``--json`` the last
line is one JSON object of the figures.

Usage: python bench/faultcheck.py [--flows docs,big] [--smoke] [--plants] [--repeat 1]
       [--max-steps N] [--examples N] [--json]
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from aggregates.testing import FaultToleranceError, Scenario, check_fault_tolerance
from tests.aggregates import planted_domain as pd

FLOWS = {"smoke": (12, 30), "docs": (50, 470), "big": (500, 1875)}


def steps_of(accounts: int, transfers: int, options: dict[str, Any]) -> int:
    sc = Scenario(pd.bank(), effects=pd.pay_effects(), **options)
    pd.bank_flow(sc, accounts=accounts, transfers=transfers, payout=True)
    return len(sc.timeline)


def cpu(fn: Callable[[], object], repeat: int) -> tuple[float, str]:
    """The least CPU seconds of ``repeat`` calls of ``fn``, and what the last one said."""
    best, said = float("inf"), ""
    for _ in range(repeat):
        start = time.process_time()
        try:
            said = str(fn())
        except FaultToleranceError as exc:
            said = "FAILED: " + str(exc).splitlines()[0]
        best = min(best, time.process_time() - start)
    return best, said


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--flows", default="docs,big")
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--plants", action="store_true")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--max-steps", type=int, default=None)
    ap.add_argument("--examples", type=int, default=None)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    options: dict[str, Any] = {}
    if args.max_steps is not None:
        options["max_steps"] = args.max_steps
    check: dict[str, Any] = dict(options)
    if args.examples is not None or args.smoke:
        check["max_examples"] = 2 if args.smoke else args.examples
    names = ["smoke"] if args.smoke else [n for n in args.flows.split(",") if n]
    figures: dict[str, Any] = {}
    for name in names:
        accounts, transfers = FLOWS[name]
        flow = functools.partial(pd.bank_flow, accounts=accounts, transfers=transfers,
                                 payout=True)
        seconds, said = cpu(functools.partial(check_fault_tolerance, flow, pd.bank(),
                                              effects=pd.pay_effects(), **check), args.repeat)
        steps = steps_of(accounts, transfers, options)
        figures[name] = {"accounts": accounts, "transfers": transfers, "steps": steps,
                         "cpu_s": round(seconds, 2), "result": said}
        print(f"{name}: {accounts} accounts, {transfers} transfers, {steps} steps: "
              f"{seconds:.2f} CPU-s — {said}", flush=True)
    if args.plants and not args.smoke:
        plants: dict[str, Callable[[], object]] = {
            "timer's 3rd firing": functools.partial(
                check_fault_tolerance, pd.quarter_flow, pd.ledger("quarter_fee"), **check),
            "transfer #431 of 450": functools.partial(
                check_fault_tolerance, pd.ledger_flow, pd.ledger("priority"), **check),
            "wrong-key query": functools.partial(
                check_fault_tolerance, pd.payout_flow, pd.bank(),
                effects=pd.pay_effects("wrong_key_query"), **check),
        }
        for label, run in plants.items():
            seconds, said = cpu(run, args.repeat)
            figures[label] = {"cpu_s": round(seconds, 2), "result": said[:200]}
            print(f"{label}: {seconds:.2f} CPU-s — {said[:200]}", flush=True)
    if args.json:
        print(json.dumps(figures))


if __name__ == "__main__":
    main()
