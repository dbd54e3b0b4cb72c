"""``aggbox demo``: the command line. Heavy imports (pyspark, pymongo) happen in :func:`run`."""

from __future__ import annotations

import argparse
import random
from pathlib import Path
from typing import Any

__all__ = ["register", "run"]

_DESCRIPTION = """\
The Customers & Orders scenario end to end, with nothing to set up.

Customers have credit limits. A PlaceOrder makes an Order pending, sends OrderCreated
to its Customer and sets a 30-minute credit deadline (a timer); the Customer reserves
credit and answers CreditReserved or CreditLimitExceeded; the Order becomes approved or
rejected and cancels its deadline (domain: aggbox/examples/orders/domain.py).

The demo generates JSON Lines input (duplicates, reordering, a few bad rows), runs the
Spark pipeline, the dispatcher (--once, JSON Lines publisher) and the pipeline again on
the dispatcher's output (plus redelivered copies) until no outbox entry is pending. Then
it checks every order status, every customer's reserved credit and every aggregate's
pending timers against an in-memory oracle, and the six invariants of docs/design.md
"Invariants", and prints a table per round and PASS/FAIL per check.

MongoDB: AGGBOX_MONGODB_URI when set, else a local server started for the run (mongod on
PATH, else mongo-java-server). Each run uses a fresh database, dropped at the end.
"""

_EPILOG = """\
examples:
  aggbox demo                                   200 customers, 2000 orders
  aggbox demo --customers 20 --orders 200 --seed 7
  aggbox demo --workdir demo-run --keep         keep the files and the database

exit codes: 0 every check passed, 1 a check failed (or an error)
"""


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be ≥ 1, got {value}")
    return value


def _count(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be ≥ 0, got {value}")
    return value


def _rate(text: str) -> float:
    value = float(text)
    if not 0.0 <= value <= 10.0:
        raise argparse.ArgumentTypeError(f"must be between 0 and 10, got {value}")
    return value


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "demo", help="run the Customers & Orders scenario end to end; PASS/FAIL per invariant",
        description=_DESCRIPTION, epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--customers", type=_positive, default=200, metavar="N",
                   help="customers (default: 200)")
    p.add_argument("--orders", type=_count, default=2000, metavar="N",
                   help="orders (default: 2000)")
    p.add_argument("--duplicate-rate", type=_rate, default=0.2, metavar="RATE",
                   help="extra copies of messages, as a fraction of the distinct ones: of the "
                        "generated input and of the dispatcher's output fed to the next round "
                        "(default: 0.2)")
    p.add_argument("--reorder", action=argparse.BooleanOptionalAction, default=True,
                   help="shuffle the input lines across files (default: on)")
    p.add_argument("--bad-rows", action=argparse.BooleanOptionalAction, default=True,
                   help="add a truncated JSON line, a PlaceOrder with amount 0, an unknown "
                        "message type and an unknown aggregate type (default: on)")
    p.add_argument("--files", type=_positive, default=4, metavar="N",
                   help="input files (default: 4)")
    p.add_argument("--seed", type=int, default=None, metavar="N",
                   help="random seed of the input (default: a new one, printed)")
    p.add_argument("--workdir", type=Path, default=None, metavar="DIR",
                   help="new or empty directory for the input and the published files "
                        "(default: a temporary directory, removed at the end)")
    p.add_argument("--database", default=None, metavar="NAME",
                   help="MongoDB database (default: aggbox_demo_<random>)")
    p.add_argument("--keep", action="store_true",
                   help="keep the database and the work directory")
    p.add_argument("--max-rounds", type=_positive, default=6, metavar="N",
                   help="pipeline rounds at most (default: 6; the scenario needs 3)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from aggbox.demo.generate import ScenarioSpec
    from aggbox.demo.run import DemoOptions, run_demo

    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1, 1_000_000)
    spec = ScenarioSpec(customers=args.customers, orders=args.orders,
                        duplicate_rate=args.duplicate_rate, reorder=args.reorder,
                        bad_rows=args.bad_rows, files=args.files, seed=seed)
    options = DemoOptions(scenario=spec, workdir=args.workdir, database=args.database,
                          keep=args.keep, max_rounds=args.max_rounds)
    return run_demo(options)
