"""The aggregates module of tests/spark/test_deployment_errors.py's local-mode test: the
``Priced`` handler imports a module that is installed nowhere, after noting the Spark task
attempt that called it in the file its payload names (``touch``), so the test can count the
attempts that ran it. (One attempt may call it twice: the batch fold hands a slice whose
handler raised back to the definition, which calls it again — docs/design.md "The batch
fold".)"""

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
    from pyspark import TaskContext

    ctx = TaskContext.get()
    attempt = f"{ctx.stageId()}.{ctx.partitionId()}.{ctx.attemptNumber()}" if ctx else "-"
    with Path(msg.payload["touch"]).open("a") as calls:
        calls.write(f"{attempt}\n")
    import aggbox_helper_never_shipped  # type: ignore[import-not-found]  # noqa: F401

    return replace(state, total=state.total + 1)
