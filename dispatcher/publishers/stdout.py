"""stdout, for debugging: one JSON object per record with topic, key, headers and the
envelope (with ``record_format`` ``cloudevents``: the structured-mode CloudEvent)."""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from typing import IO

from dispatcher.core.settings import RecordFormat
from dispatcher.publishers.base import PublishResult
from dispatcher.publishers.formats import encode_failure, structured
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
        encoding = getattr(out, "encoding", None) or "utf-8"
        results: list[PublishResult] = [PublishResult.ok()] * len(records)
        lines: list[str] = []
        written: list[int] = []
        for i, r in enumerate(records):  # one that cannot be encoded: dead-lettered alone
            try:
                lines.append(_line(r, self.record_format, encoding))
            except Exception as exc:
                results[i] = encode_failure(
                    r, "a CloudEvent for stdout" if self.record_format == "cloudevents"
                    else "a stdout line", exc)
                continue
            written.append(i)
        if lines:
            try:
                out.write("".join(lines))
                out.flush()
            except OSError as exc:  # e.g. a closed pipe: tried again later
                err = PublishResult.retryable(f"writing to stdout failed: {exc}")
                for i in written:
                    results[i] = err
        return results

    async def close(self) -> None:
        return None


def _line(r: OutboundRecord, record_format: RecordFormat, encoding: str) -> str:
    value = structured(r) if record_format == "cloudevents" else json.loads(r.value)
    line = {"topic": r.topic, "key": r.key, "headers": r.headers, "value": value}
    text = json.dumps(line, ensure_ascii=False, allow_nan=False) + "\n"
    try:
        text.encode(encoding)
    except UnicodeEncodeError:  # a terminal that cannot show it: the same JSON, escaped
        text = json.dumps(line, allow_nan=False) + "\n"
    return text
