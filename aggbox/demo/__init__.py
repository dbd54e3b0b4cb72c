"""``aggbox demo``: the Customers & Orders scenario end to end, checked against an oracle.

Modules, one job each:

- :mod:`~aggbox.demo.generate` — the input (order-insensitive by construction) as JSON Lines;
- :mod:`~aggbox.demo.oracle` — the expected store, folded in memory from the input (its own
  envelope check, timers and round counts: ``oracle_envelope``, ``oracle_timers``,
  ``oracle_rounds``);
- :mod:`~aggbox.demo.rounds` — pipeline round → dispatcher drain → next round, until settled;
- :mod:`~aggbox.demo.engine` — the Spark pipeline and the dispatcher behind that loop;
- :mod:`~aggbox.demo.store` — what the run left in MongoDB;
- :mod:`~aggbox.demo.checks` — PASS/FAIL: oracle (timers too) and the six invariants;
- :mod:`~aggbox.demo.progress`, :mod:`~aggbox.demo.report` — the display;
- :mod:`~aggbox.demo.run` — all of it in order; :mod:`~aggbox.demo.cli` — the command.
"""

from aggbox.demo.cli import register

__all__ = ["register"]
