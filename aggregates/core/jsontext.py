"""Compact JSON text with an encoder built once (pure).

``json.JSONEncoder.encode`` builds its C encoder on every call; for a small value that is
a third of the call's CPU (the payload hash of every message, the record value of every
published entry). :func:`compact_encoder` builds it once and gives exactly
``JSONEncoder(separators=(",", ":"), …).encode``'s text."""

from __future__ import annotations

import json
import json.encoder
from collections.abc import Callable
from typing import Any

__all__ = ["compact_encoder"]


def compact_encoder(default: Callable[[Any], Any], *, sort_keys: bool, ensure_ascii: bool
                    ) -> Callable[[Any], str]:
    """``json.JSONEncoder(separators=(",", ":"), sort_keys=…, ensure_ascii=…,
    default=default).encode``, with the C encoder built once when the interpreter has one.
    It keeps no cycle check of its own (no state shared between threads): a value that
    contains itself recurses until RecursionError, and is then encoded by the plain
    encoder, which raises its own error (``ValueError: Circular reference detected``)."""
    plain = json.JSONEncoder(separators=(",", ":"), sort_keys=sort_keys,
                             ensure_ascii=ensure_ascii, default=default)
    make = getattr(json.encoder, "c_make_encoder", None)
    if make is None:  # pragma: no cover - CPython always has it
        return plain.encode
    strings = json.encoder.encode_basestring_ascii if ensure_ascii else (
        json.encoder.encode_basestring)
    fast = make(None, default, strings, None, ":", ",", sort_keys, False, True)

    def encode(value: Any) -> str:
        if type(value) is not dict:
            return plain.encode(value)
        try:
            return "".join(fast(value, 0))
        except RecursionError:
            return plain.encode(value)

    return encode
