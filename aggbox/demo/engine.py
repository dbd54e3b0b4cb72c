"""The real engines behind the demo loop: the Spark pipeline and the dispatcher (``--once``,
JSON Lines publisher)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from aggbox.demo.errors import DemoError
from aggbox.demo.model import OutcomeRow
from aggregates.core.settings import AggboxSettings

__all__ = ["DispatcherDrain", "SparkRound", "spark_session"]

_OUTCOME_COLUMNS = ("message_id", "aggregate_type", "aggregate_id", "outcome", "reason",
                    "emitted_ids", "from_parked")


#: Spark's JVM logs errors only while the demo's progress display runs (its default
#: profile prints start-up warnings, e.g. about the host name, to the terminal).
_LOG4J2 = """\
rootLogger.level = error
rootLogger.appenderRef.stderr.ref = stderr
appender.stderr.type = Console
appender.stderr.name = stderr
appender.stderr.target = SYSTEM_ERR
appender.stderr.layout.type = PatternLayout
appender.stderr.layout.pattern = %d{yy/MM/dd HH:mm:ss} %p %c{1}: %m%n%ex
# Spark's shell mode announces its default level unless its logger's level equals the root's.
logger.spark.name = org.apache.spark
logger.spark.level = error
"""


def spark_session(workdir: Path) -> tuple[Any, bool]:
    """The active SparkSession (a notebook's, a test suite's) or a new one; ``True`` when it
    was created here (then the caller stops it)."""
    from pyspark import SparkContext
    from pyspark.sql import SparkSession

    from spark.session import build_session, quiet_logs, remote_url

    active = SparkSession.getActiveSession()
    if active is not None:
        return active, False
    if remote_url() is not None:  # SPARK_REMOTE: a Spark Connect session, no JVM here
        return build_session(), True
    if SparkContext._active_spark_context is not None:
        # A context runs (created in another thread): share it, never stop it.
        return SparkSession.builder.getOrCreate(), False
    log4j = workdir / "log4j2.properties"
    log4j.write_text(_LOG4J2, encoding="utf-8")
    session = build_session(conf={
        "spark.ui.enabled": "false",
        "spark.driver.extraJavaOptions": f"-Dlog4j2.configurationFile={log4j.as_uri()}",
    })
    quiet_logs(session)
    return session, True


class SparkRound:
    """One pipeline run per round, on the demo's database."""

    def __init__(self, spark: Any, *, aggregates: str, settings: AggboxSettings) -> None:
        from spark.pipeline import Pipeline

        self.pipeline = Pipeline(spark, aggregates=aggregates, settings=settings,
                                 mongodb_uri=settings.mongodb_uri)

    def __call__(self, number: int, inputs: Sequence[Path]
                 ) -> tuple[dict[str, int], list[OutcomeRow]]:
        from spark.pipeline import new_run_id
        from spark.sources import read_batch

        # Pipeline.process instead of run_batch: a run whose outcomes do not add up must
        # show as a FAIL of invariant 6 in the table, not abort the demo.
        raw = read_batch(self.pipeline.spark, [str(p) for p in inputs], input_format="json")
        result = self.pipeline.process(raw, run_id=f"demo-round-{number}-{new_run_id()}")
        rows = result.outcomes.select(*_OUTCOME_COLUMNS).collect()
        return dict(result.counts), [OutcomeRow.from_mapping(r.asDict()) for r in rows]


class DispatcherDrain:
    """``aggbox dispatch --once --publisher jsonl``: every pending entry published once."""

    def __init__(self, *, aggregates: str, settings: AggboxSettings) -> None:
        self.aggregates = aggregates
        self.store = settings

    def __call__(self, directory: Path) -> tuple[int, int]:
        from dispatcher.core.settings import DispatcherSettings
        from dispatcher.daemon import Dispatcher

        settings = DispatcherSettings.load(aggregates=self.aggregates, collections=[],
                                           publisher="jsonl", jsonl_dir=str(directory),
                                           metrics_port=0)
        dispatcher = Dispatcher(settings, store=self.store)
        rc = asyncio.run(dispatcher.run(once=True))
        if rc != 0:
            raise DemoError(f"the dispatcher stopped with exit code {rc}; see the log above")
        published = sum(w.stats.published for w in dispatcher.workers)
        dead = sum(w.stats.dead_lettered for w in dispatcher.workers)
        return published, dead
