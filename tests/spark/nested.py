"""A nested, typed state for the pipeline test of the state codec (imported by executors as
``tests.spark.nested``): handlers read ``state.address.city`` and a tuple field."""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime
from decimal import Decimal

from aggregates import AggregateType, Message, Registry


@dataclass(frozen=True)
class Address:
    city: str = ""


@dataclass(frozen=True)
class Customer:
    address: Address = Address()
    tags: tuple[str, ...] = ()
    credit: Decimal = Decimal("0")
    moved_at: datetime | None = None


customers = AggregateType("Customer", state=Customer, collection="nested_customers")


@customers.handles("Moved")
def moved(state: Customer, msg: Message) -> Customer:
    # Reads the nested object and the tuple: a dict or a list here would fail the handler.
    tags = (*state.tags, f"left:{state.address.city or '-'}")
    return replace(state, address=Address(city=str(msg.payload["city"])), tags=tags,
                   credit=state.credit + Decimal(str(msg.payload["credit"])),
                   moved_at=msg.occurred_at)


registry = Registry([customers])
