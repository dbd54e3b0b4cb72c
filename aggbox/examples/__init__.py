"""Example domains shipped with aggbox, under its own name so that installing the wheel adds
no top-level ``examples`` package: :mod:`aggbox.examples.orders` (Customers and Orders, the
domain of ``aggbox demo``, the docs, the notebook and the benchmarks)."""
