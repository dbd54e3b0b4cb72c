"""``aggbox check-store``: aggbox's store contract, shipped with the package and run against
the MongoDB a user names, in a scratch database it creates and drops.

- :mod:`aggbox.checkstore.report` — results, verdict, exit status, table and JSON (pure);
- :mod:`aggbox.checkstore.logic` — client options, scratch names, server description (pure);
- :mod:`aggbox.checkstore.checks` — the checks without change streams (I/O);
- :mod:`aggbox.checkstore.library` — the checks that send the library's own writes (the
  writer's ``$slice``, the dead-letter store's ``$setOnInsert``, the dispatcher's ``$pull``);
- :mod:`aggbox.checkstore.streams` — the change-stream checks, through the dispatcher's own
  stream code (I/O);
- :mod:`aggbox.checkstore.probe` — whether what answers on the port is MongoDB at all (I/O);
- :mod:`aggbox.checkstore.runner` — connect, refuse a non-empty database, run each check
  isolated, drop (I/O).

The command line is :mod:`aggbox.commands.check_store`; docs/operations.md, "Checking your
MongoDB", lists what each check means and what vendors document.
"""

from aggbox.checkstore.report import CheckResult, Report, Status
from aggbox.checkstore.runner import NotEmpty, NotMongoDB, Target, Unreachable, check_store

__all__ = ["CheckResult", "NotEmpty", "NotMongoDB", "Report", "Status", "Target",
           "Unreachable", "check_store"]
