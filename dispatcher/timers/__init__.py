"""Due timers: the firer (:mod:`~dispatcher.timers.firer`) publishes each due timer as a
record built like an outbox entry's and removes it once acknowledged, for the partitions
this instance holds, beside the outbox path (docs/design.md "Timers"). Imports ``core``,
``publishers`` and ``observe``.

docs/design.md "Layout of the dispatcher" says which room may import which."""
