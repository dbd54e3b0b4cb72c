"""The order domain of :mod:`tests.dispatcher.timerdomain` under names of its own, for the
end-to-end timer test over the real Kafka broker (tests/spark/test_timers_kafka.py): the
default topic template sends its fired timers to ``TimedOrder.events`` and
``TimedProbe.events``, topics no other test of the session writes to."""

from __future__ import annotations

from aggregates import AggregateType, HighWater, Inbox, Registry
from tests.dispatcher.timerdomain import Order, _define

orders = _define(AggregateType("TimedOrder", state=Order, collection="ktorders",
                               dedup=Inbox(window=1000)))
probes = _define(AggregateType("TimedProbe", state=Order, collection="ktprobes",
                               dedup=HighWater(mode="monotonic")))

registry = Registry([orders, probes])
