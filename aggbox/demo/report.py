"""The demo's output: what ran, the messages per round, and PASS/FAIL per check."""

from __future__ import annotations

from collections.abc import Sequence

from rich.console import Console
from rich.table import Table
from rich.text import Text

from aggbox.demo.checks import Check
from aggbox.demo.generate import Scenario
from aggbox.demo.model import RunRecord

__all__ = ["checks_table", "print_report", "rounds_table", "scenario_lines"]


def _n(value: int) -> str:
    return f"{value:,}"


def scenario_lines(scenario: Scenario, *, mongo: str, database: str, workdir: str,
                   keep_database: bool, keep_workdir: bool) -> list[str]:
    spec = scenario.spec
    rejected = sum(1 for o in scenario.orders if o.oversized)
    return [
        f"Customers & Orders: {_n(spec.customers)} customers, {_n(spec.orders)} orders "
        f"({_n(spec.orders - rejected)} within the credit limit, {_n(rejected)} oversized), "
        f"{spec.duplicate_rate:.0%} duplicates, "
        f"{'reordered' if spec.reorder else 'in order'}, {len(scenario.bad_rows)} bad rows, "
        f"seed {spec.seed} (--seed {spec.seed} repeats this input)",
        f"MongoDB: {mongo}, database {database}" + _database_note(mongo, keep_database),
        f"Work directory: {workdir}" + ("" if keep_workdir else " (removed at the end)"),
    ]


def _database_note(mongo: str, keep: bool) -> str:
    if not keep:
        return " (dropped at the end)"
    if mongo != "external":
        return (" (kept, but the local server stopped with the demo: set AGGBOX_MONGODB_URI "
                "to a server of yours to inspect the data afterwards)")
    return " (kept)"


def rounds_table(record: RunRecord) -> Table:
    t = Table(title="Messages per round", title_justify="left")
    t.add_column("Round", justify="right")
    t.add_column("Input", no_wrap=True)
    for name in ("In", "Applied", "Duplicates\ndropped", "Dead\nletters", "Parked",
                 "Published", "Outbox\nleft"):
        t.add_column(name, justify="right")
    totals = [0] * 6
    for i, r in enumerate(record.rounds):
        c = r.counts
        source = (f"generated, {len(r.inputs)} files" if r.number == 1
                  else f"round {r.number - 1}'s output")
        if r.redelivered:
            source += f" + {_n(r.redelivered)} redelivered"
        drain = record.drains[i] if i < len(record.drains) else None
        values = [len(r.lines), c.get("applied", 0), c.get("duplicate", 0),
                  c.get("dead_lettered", 0), c.get("parked", 0),
                  drain.published if drain else 0]
        totals = [a + b for a, b in zip(totals, values, strict=True)]
        t.add_row(str(r.number), Text(source), *(_n(v) for v in values),
                  _n(drain.pending) if drain else "-")
    left = record.drains[-1].pending if record.drains else 0
    t.add_section()
    t.add_row("", "[bold]total[/]", *(f"[bold]{_n(v)}[/]" for v in totals), f"[bold]{_n(left)}[/]")
    return t


def checks_table(checks: Sequence[Check]) -> Table:
    t = Table(title="Checks", title_justify="left")
    t.add_column("Check")
    t.add_column("Result", justify="center")
    t.add_column("Detail")
    for c in checks:
        verdict = "[bold green]PASS[/]" if c.passed else "[bold red]FAIL[/]"
        # Plain Text: ids such as "c-1:registered:" must not become markup or emoji.
        t.add_row(Text(c.name), verdict, Text(c.detail))
    return t


def print_report(console: Console, *, header: Sequence[str], record: RunRecord,
                 checks: Sequence[Check], seconds: float) -> None:
    console.print()
    for line in header:
        console.print(Text(line))
    console.print()
    console.print(rounds_table(record))
    console.print()
    console.print(checks_table(checks))
    bad = [c for c in checks if not c.passed]
    if bad:
        console.print(f"[bold red]FAIL[/]: {len(bad)} of {len(checks)} checks failed "
                      f"({seconds:.0f} s)", highlight=False)
    else:
        console.print(f"[bold green]PASS[/]: all {len(checks)} checks passed ({seconds:.0f} s)",
                      highlight=False)
