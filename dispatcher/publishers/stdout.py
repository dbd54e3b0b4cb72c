"""stdout, for debugging: one JSON object per record with topic, key, headers and the
envelope (with ``record_format`` ``cloudevents``: the structured-mode CloudEvent)."""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from typing import IO

from dispatcher.core.settings import RecordFormat
from dispatcher.publishers.base import PublishResult
from dispatcher.publishers.formats import structured
from dispatcher.publishers.record import OutboundRecord

__all__ = ["StdoutPublisher"]


class StdoutPublisher:
    name = "stdout"

    def __init__(self, stream: IO[str] | None = None, *,
                 record_format: RecordFormat = "aggbox") -> None:
        self._stream = stream
        self.record_format: RecordFormat = record_format

    async def start(self) -> None:
        return None

    async def publish(self, records: Sequence[OutboundRecord]) -> list[PublishResult]:
        out = self._stream or sys.stdout
        for r in records:
            value = (structured(r) if self.record_format == "cloudevents"
                     else json.loads(r.value))
            line = {"topic": r.topic, "key": r.key, "headers": r.headers, "value": value}
            out.write(json.dumps(line, ensure_ascii=False) + "\n")
        out.flush()
        return [PublishResult.ok()] * len(records)

    async def close(self) -> None:
        return None
