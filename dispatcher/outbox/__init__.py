"""The outbox path: from a document's pending entries to acknowledged, ``$pull``ed ones. The
cycle (publish → dead-letter → pull: :mod:`~dispatcher.outbox.cycle`,
:mod:`~dispatcher.outbox.pull`, :mod:`~dispatcher.outbox.inflight`,
:mod:`~dispatcher.outbox.outcomes`, :mod:`~dispatcher.outbox.retries`), how documents are
found (sweeps: :mod:`~dispatcher.outbox.sweep`; the change stream and its checkpoints:
:mod:`~dispatcher.outbox.stream`, :mod:`~dispatcher.outbox.streammode`; the held partitions
as filters: :mod:`~dispatcher.outbox.selection`) and the backlog gauges
(:mod:`~dispatcher.outbox.backlog`). Imports ``core``, ``publishers`` and ``observe``.

docs/design.md "Layout of the dispatcher" says which room may import which."""
