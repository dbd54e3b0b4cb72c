"""JSON Lines files in a directory: one file per batch, one envelope per line — the input
format of the Spark pipeline, so a pipeline can consume the dispatcher's output. With
``record_format`` ``cloudevents`` each line is a structured-mode CloudEvent instead
(:mod:`dispatcher.publishers.formats`), which the pipeline reads as well.

Files appear atomically: written as ``.tmp-<uuid>.jsonl`` (hidden, ignored by Spark's file
sources), fsynced, renamed to ``<UTC timestamp>-<uuid>.jsonl``, and the directory fsynced.
A batch is all-or-nothing: an I/O error fails every record of it (retryable).

A process killed (``kill -9``) between writing and renaming leaves its temp file behind. It
is not published output (its entries are still in the outbox and go out again), so
:meth:`JsonLinesPublisher.start` deletes temp files older than ``stale_tmp_s`` and logs how
many; younger ones may belong to another dispatcher writing to the same directory right now.
The same clean-up runs again every ``stale_tmp_s`` while publishing."""

from __future__ import annotations

import asyncio
import logging
import os
import time
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path

from aggregates.core.reasons import Reason
from dispatcher.core.settings import RecordFormat
from dispatcher.publishers.base import PublisherError, PublishResult
from dispatcher.publishers.formats import encode_failure, json_line
from dispatcher.publishers.record import OutboundRecord

__all__ = ["TMP_PREFIX", "JsonLinesPublisher"]

log = logging.getLogger("aggbox.dispatcher.jsonl")

#: Name prefix of files being written (hidden; Spark's file sources skip them).
TMP_PREFIX = ".tmp-"


class JsonLinesPublisher:
    """Writes batches to ``directory`` (created if missing)."""

    name = "jsonl"

    def __init__(self, directory: str | Path, *, fsync: bool = True,
                 stale_tmp_s: float = 60.0, record_format: RecordFormat = "aggbox") -> None:
        self.directory = Path(directory)
        self.record_format: RecordFormat = record_format
        self.fsync = fsync
        self.stale_tmp_s = stale_tmp_s
        self.files_written = 0
        self.stale_removed = 0  #: temp files of crashed writers deleted so far
        self._next_cleanup = 0.0

    async def start(self) -> None:
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise PublisherError(
                f"cannot create the JSON Lines directory {self.directory}: {exc}; set "
                "jsonl_dir (AGGBOX_DISPATCHER_JSONL_DIR) to a writable directory"
            ) from exc
        await asyncio.to_thread(self.remove_stale_temp_files)

    def remove_stale_temp_files(self) -> int:
        """Delete ``.tmp-*.jsonl`` files not modified for ``stale_tmp_s`` (left by a writer
        that was killed); returns how many."""
        self._next_cleanup = time.monotonic() + self.stale_tmp_s
        cutoff = time.time() - self.stale_tmp_s
        removed = 0
        for path in self.directory.glob(f"{TMP_PREFIX}*.jsonl"):
            try:
                if path.stat().st_mtime <= cutoff:
                    path.unlink()
                    removed += 1
            except FileNotFoundError:
                continue  # renamed or removed meanwhile
            except OSError as exc:
                log.warning("cannot remove the stale temp file %s: %s", path, exc)
        if removed:
            self.stale_removed += removed
            log.warning("removed %d stale temp file(s) %s*.jsonl from %s, left by a writer "
                        "that died mid-batch (not published output: those entries are still "
                        "pending and are written again)", removed, TMP_PREFIX, self.directory,
                        extra={"removed": removed})
        return removed

    async def publish(self, records: Sequence[OutboundRecord]) -> list[PublishResult]:
        if not records:
            return []
        # Encoded record by record: one that cannot be is dead-lettered, the rest written.
        results: list[PublishResult] = [PublishResult.ok()] * len(records)
        lines: list[bytes] = []
        written: list[int] = []
        for i, r in enumerate(records):
            try:
                lines.append(json_line(r, self.record_format))
            except Exception as exc:
                results[i] = encode_failure(r, f"a JSON Lines line ({self.record_format})",
                                            exc)
                continue
            written.append(i)
        if not lines:
            return results
        try:
            if time.monotonic() >= self._next_cleanup:
                await asyncio.to_thread(self.remove_stale_temp_files)
            await asyncio.to_thread(self._write, lines)
        except OSError as exc:
            err = PublishResult.retryable(f"writing to {self.directory} failed: {exc}",
                                          reason=Reason.IO_ERROR)
            for i in written:
                results[i] = err
        return results

    def _write(self, lines: list[bytes]) -> Path:
        token = uuid.uuid4().hex
        stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S%fZ")
        tmp = self.directory / f"{TMP_PREFIX}{token}.jsonl"
        final = self.directory / f"{stamp}-{token}.jsonl"
        try:
            with open(tmp, "wb") as fh:
                fh.write(b"\n".join(lines) + b"\n")
                fh.flush()
                if self.fsync:
                    os.fsync(fh.fileno())
            os.replace(tmp, final)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        if self.fsync:
            fd = os.open(self.directory, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        self.files_written += 1
        return final

    async def close(self) -> None:
        return None
