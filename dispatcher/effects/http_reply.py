"""An HTTP effect's reply (:mod:`dispatcher.effects.http`): how much of it is read, and
what becomes the effect's result (``{"status", "body"}`` for a JSON object usable as a
payload, else ``{"status", "text"}``) or the error's detail."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any, Final

import aiohttp

__all__ = ["MAX_BODY_BYTES", "MAX_BODY_DEPTH", "MAX_RESPONSE_BYTES", "MAX_TEXT_CHARS", "Reply",
           "read_capped", "reply_detail", "reply_result", "shown_url"]

#: At most this much of a response is read.
MAX_RESPONSE_BYTES: Final = 1024 * 1024
#: A JSON response larger than this is not put in the reply's ``body`` (the reply is stored
#: in the aggregate's document): only its first :data:`MAX_TEXT_CHARS` characters, as text.
MAX_BODY_BYTES: Final = 64 * 1024
#: ``text`` in the reply is cut to this many characters.
MAX_TEXT_CHARS: Final = 4096
#: A response ``body`` nested deeper than this is left out (``text`` instead).
MAX_BODY_DEPTH: Final = 20

_INT64: Final = 2**63


@dataclass(frozen=True, slots=True)
class Reply:
    """What was read of a response."""

    status: int
    data: bytes
    truncated: bool
    charset: str | None


async def read_capped(response: aiohttp.ClientResponse) -> tuple[bytes, bool]:
    """The response body, at most :data:`MAX_RESPONSE_BYTES` of it; ``True`` when cut."""
    chunks: list[bytes] = []
    size = 0
    async for chunk in response.content.iter_chunked(64 * 1024):
        room = MAX_RESPONSE_BYTES - size
        if len(chunk) > room:
            chunks.append(chunk[:room])
            return b"".join(chunks), True
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks), False


def shown_url(url: str) -> str:
    """The URL without query string and fragment, for error details."""
    return url.split("?", 1)[0].split("#", 1)[0]


def _text(reply: Reply) -> str:
    try:
        return reply.data.decode(reply.charset or "utf-8", errors="replace")
    except LookupError:
        return reply.data.decode("utf-8", errors="replace")


def reply_detail(method: str, url: str, reply: Reply) -> str:
    detail = f"{method} {shown_url(url)} -> HTTP {reply.status}"
    text = _text(reply).strip()
    return f"{detail}: {text[:200]}" if text else detail


def reply_result(reply: Reply) -> dict[str, Any]:
    """The success reply's payload: status, and the JSON body or the text."""
    result: dict[str, Any] = {"status": reply.status}
    body = None if reply.truncated or len(reply.data) > MAX_BODY_BYTES else _json_body(
        reply.data)
    if body is not None:
        result["body"] = body
        return result
    text = _text(reply)[:MAX_TEXT_CHARS]
    if text:
        result["text"] = text
    return result


def _json_body(data: bytes) -> dict[str, Any] | None:
    """``data`` as a JSON object usable as (part of) an aggbox payload, else ``None``."""
    try:
        value = json.loads(data, parse_constant=_no_constant)
    except ValueError:
        return None
    if not isinstance(value, dict) or not _valid(value, 0):
        return None
    return value


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid in a payload")


def _valid(value: Any, depth: int) -> bool:
    if depth > MAX_BODY_DEPTH:
        return False
    if isinstance(value, dict):
        for key, item in value.items():
            if key[:1] == "$" or "." in key or "\x00" in key:
                return False
            if not _valid(item, depth + 1):
                return False
        return True
    if isinstance(value, list):
        return all(_valid(item, depth + 1) for item in value)
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return True
    if isinstance(value, int):
        return -_INT64 <= value < _INT64
    return isinstance(value, float) and math.isfinite(value)
