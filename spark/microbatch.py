"""Streaming micro-batches: the ``foreachBatch`` function (:class:`MicroBatch`), the way its
results come back to the client on Spark Connect (:class:`BatchViews`, one-row temporary
views), and the trigger option (:func:`with_trigger`).

With a Spark Connect session a stream's ``foreachBatch`` function runs in a Python process of
the Connect server: it is a picklable object (:class:`MicroBatch`; the pipeline pickles
without its session and registry, both found again there), and each micro-batch's result
comes back to the client through a one-row temporary view of the shared session, which
:class:`BatchViews` reads (``on_batch`` is called in the client).
"""

from __future__ import annotations

import json
import logging
import threading
import uuid
from collections.abc import Callable
from typing import Any, Protocol

from aggregates.core.errors import ConfigurationError
from spark.results import RunResult, StreamResult
from spark.sources import add_line_order

__all__ = ["BatchViews", "MicroBatch", "with_trigger"]

log = logging.getLogger("aggbox.spark")


class Processor(Protocol):
    """What a micro-batch runs: :meth:`spark.pipeline.Pipeline.process` (a protocol, so this
    module does not import the pipeline, which imports it)."""

    def process(self, raw: Any, *, run_id: str, batch_id: int | None = ...,
                outcomes_path: str | None = ..., input_count: int | None = ...,
                keep_outcomes: bool = ...) -> RunResult: ...


class MicroBatch:
    """The ``foreachBatch`` function: :meth:`Pipeline.process` on one micro-batch, its
    accounting checked (an error fails the query, the checkpoint keeps the batch).

    With a Spark Connect session it runs in a Python process of the server, so it must
    pickle: no session, no client-side callbacks (``sink`` is None), and the result is
    published as the temporary view ``<view_prefix><batch_id>`` of the shared session."""

    def __init__(self, pipeline: Processor, *, run_id: str, outcomes_path: str | None,
                 sink: Callable[[RunResult], None] | None,
                 view_prefix: str | None) -> None:
        self.pipeline = pipeline
        self.run_id = run_id
        self.outcomes_path = outcomes_path
        self.sink = sink
        self.view_prefix = view_prefix

    def __call__(self, df: Any, batch_id: int) -> None:
        df.persist()
        try:
            result = self.pipeline.process(add_line_order(df), run_id=self.run_id,
                                           batch_id=batch_id, outcomes_path=self.outcomes_path,
                                           keep_outcomes=False)
        finally:
            df.unpersist()
        result.outcomes = None
        log.info("micro-batch %d: %s", batch_id, result.summary())
        if self.sink is not None:
            self.sink(result)
        if self.view_prefix is not None:
            df.sparkSession.createDataFrame(
                [(batch_id, _result_json(result))], "batch_id long, result string",
            ).createOrReplaceTempView(f"{self.view_prefix}{batch_id}")
        result.raise_for_accounting()


def _result_json(r: RunResult) -> str:
    return json.dumps({
        "run_id": r.run_id, "input_count": r.input_count, "counts": r.counts,
        "reasons": [[*k, n] for k, n in r.reasons.items()],
        "by_type": [[*k, n] for k, n in r.by_type.items()],
        "outcomes_path": r.outcomes_path, "batch_id": r.batch_id, "seconds": r.seconds,
        "samples": [[*k, *v] for k, v in r.samples.items()],
    })


def _result_from_json(text: str) -> RunResult:
    d = json.loads(text)
    return RunResult(
        run_id=d["run_id"], input_count=d["input_count"], counts=d["counts"],
        reasons={(o, r): n for o, r, n in d["reasons"]},
        by_type={(a, m, o, r): n for a, m, o, r, n in d["by_type"]},
        outcomes_path=d["outcomes_path"], batch_id=d["batch_id"], seconds=d["seconds"],
        samples={(o, r): (m, t) for o, r, m, t in d.get("samples", [])})


class BatchViews:
    """Spark Connect: the client side of :class:`MicroBatch`'s result views. Reads each
    new view once (in batch order), drops it, appends the result to the
    :class:`StreamResult` and calls ``on_batch``."""

    def __init__(self, spark: Any, stream_result: StreamResult,
                 on_batch: Callable[[RunResult], None] | None,
                 interval: float = 0.5) -> None:
        self.spark = spark
        self.stream_result = stream_result
        self.on_batch = on_batch
        self.interval = interval
        self.prefix = f"aggbox_batch_{uuid.uuid4().hex[:12]}_"
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def poll(self) -> None:
        with self._lock:
            names = [t.name for t in self.spark.catalog.listTables(pattern=f"{self.prefix}*")
                     if t.isTemporary]
            found = sorted((int(n[len(self.prefix):]), n) for n in names
                           if n.startswith(self.prefix) and n[len(self.prefix):].isdigit())
            for _batch_id, name in found:
                (row,) = self.spark.table(name).collect()
                self.spark.catalog.dropTempView(name)
                result = _result_from_json(row["result"])
                self.stream_result.batches.append(result)
                if self.on_batch is not None:
                    self.on_batch(result)

    def start(self, query: Any) -> None:
        def loop() -> None:
            while not self._stop.wait(self.interval):
                try:
                    self.poll()
                    if not query.isActive:  # the last results were read just now
                        return
                except Exception as exc:  # the session may be closing; finish() reads again
                    log.debug("reading micro-batch results: %s", exc)
                    return

        self._thread = threading.Thread(target=loop, name="aggbox-batch-results", daemon=True)
        self._thread.start()

    def finish(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
        self.poll()


def with_trigger(writer: Any, trigger: str) -> Any:
    t = trigger.strip()
    if t.replace("_", "").lower() in ("availablenow", "once"):
        return writer.trigger(availableNow=True)
    if not t:
        raise ConfigurationError("empty trigger; use availableNow or an interval like '10 seconds'")
    return writer.trigger(processingTime=t)
