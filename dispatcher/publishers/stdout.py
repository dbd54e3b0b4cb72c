"""stdout, for debugging: one JSON object per record with topic, key, headers and the
envelope."""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from typing import IO

from dispatcher.publishers.base import PublishResult
from dispatcher.record import OutboundRecord

__all__ = ["StdoutPublisher"]


class StdoutPublisher:
    name = "stdout"

    def __init__(self, stream: IO[str] | None = None) -> None:
        self._stream = stream

    async def start(self) -> None:
        return None

    async def publish(self, records: Sequence[OutboundRecord]) -> list[PublishResult]:
        out = self._stream or sys.stdout
        for r in records:
            line = {"topic": r.topic, "key": r.key, "headers": r.headers,
                    "value": json.loads(r.value)}
            out.write(json.dumps(line, ensure_ascii=False) + "\n")
        out.flush()
        return [PublishResult.ok()] * len(records)

    async def close(self) -> None:
        return None
