"""What the daemon reports while it runs: Prometheus metrics and ``/healthz`` over aiohttp
(:mod:`~dispatcher.observe.metrics`) and the producer spans of published records
(:mod:`~dispatcher.observe.tracing`). Imports ``core`` and ``publishers``.

docs/design.md "Layout of the dispatcher" says which room may import which."""
