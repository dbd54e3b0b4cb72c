"""The Customers and Orders demo domain, written the way a domain team would write it."""

from aggbox.examples.orders.domain import customers, orders, registry

__all__ = ["customers", "orders", "registry"]
