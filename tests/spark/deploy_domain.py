"""The aggregates module of tests/spark/test_deployment_errors.py's local-mode test: the
``Priced`` handler imports a module that is installed nowhere, after noting each call in
the file its payload names (``touch``), so the test can count the task attempts that ran
it."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from aggregates import AggregateType, Message


@dataclass(frozen=True)
class Meter:
    total: int = 0


meters = AggregateType("Meter", state=Meter, collection="deploy_meters")


@meters.handles("Priced")
def priced(state: Meter, msg: Message) -> Meter:
    with Path(msg.payload["touch"]).open("a") as calls:
        calls.write("called\n")
    import aggbox_helper_never_shipped  # type: ignore[import-not-found]  # noqa: F401

    return replace(state, total=state.total + 1)
