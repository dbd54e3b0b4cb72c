"""The ``aggbox dispatch-status`` report, read from the store only: leases, heartbeats,
handovers and pending entries per partition (:mod:`~dispatcher.status.report`) and their
text (:mod:`~dispatcher.status.text`). Imports ``core``, ``leases`` and ``outbox``.

docs/design.md "Layout of the dispatcher" says which room may import which."""
