"""JSON Lines files in a directory: one file per batch, one envelope per line — the input
format of the Spark pipeline, so a pipeline can consume the dispatcher's output.

Files appear atomically: written as ``.tmp-<uuid>.jsonl`` (hidden, ignored by Spark's file
sources), fsynced, renamed to ``<UTC timestamp>-<uuid>.jsonl``, and the directory fsynced.
A batch is all-or-nothing: an I/O error fails every record of it (retryable)."""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path

from dispatcher.publishers.base import PublisherError, PublishResult
from dispatcher.record import OutboundRecord

__all__ = ["JsonLinesPublisher"]


class JsonLinesPublisher:
    """Writes batches to ``directory`` (created if missing)."""

    name = "jsonl"

    def __init__(self, directory: str | Path, *, fsync: bool = True) -> None:
        self.directory = Path(directory)
        self.fsync = fsync
        self.files_written = 0

    async def start(self) -> None:
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise PublisherError(
                f"cannot create the JSON Lines directory {self.directory}: {exc}; set "
                "jsonl_dir (AGGBOX_DISPATCHER_JSONL_DIR) to a writable directory"
            ) from exc

    async def publish(self, records: Sequence[OutboundRecord]) -> list[PublishResult]:
        if not records:
            return []
        try:
            await asyncio.to_thread(self._write, [r.value for r in records])
        except OSError as exc:
            err = PublishResult.retryable(f"writing to {self.directory} failed: {exc}",
                                          reason="io_error")
            return [err] * len(records)
        return [PublishResult.ok()] * len(records)

    def _write(self, lines: list[bytes]) -> Path:
        token = uuid.uuid4().hex
        stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S%fZ")
        tmp = self.directory / f".tmp-{token}.jsonl"
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
