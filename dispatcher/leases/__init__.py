"""Partition leases: which partitions this instance holds. The pure rule of the fair share
(:mod:`~dispatcher.leases.balance`), the leases and heartbeats as stored
(:mod:`~dispatcher.leases.partlease`) and the lease rounds that claim, renew and release them
(:mod:`~dispatcher.leases.balancer`). Imports ``core`` and ``observe``.

docs/design.md "Layout of the dispatcher" says which room may import which."""
