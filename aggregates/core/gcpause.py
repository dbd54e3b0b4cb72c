"""The cyclic garbage collector paused for the length of a chunk (docs/design.md "The hot
path"): a collection that starts while a chunk is folded walks every snapshot, result and
outcome the chunk still holds, again and again — measured at about 27k instructions per
message of the writer's ≈ 200k. Paused, the chunk's objects are freed by reference counting
as before, and whatever cycles a handler made are collected once the chunk is done (a
chunk is bounded by ``chunk_messages``, so is what waits).

Process-wide, as the collector is: nested and concurrent pauses (the writer's pipelined
chunks run in threads) are counted, and the collector is enabled again only when the last
one ends — and only if it was enabled when the first began (a process that turned it off
keeps it off)."""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["gc_paused"]

_lock = threading.Lock()
_depth = 0
_was_enabled = False


@contextmanager
def gc_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector while the block runs (see the module)."""
    global _depth, _was_enabled
    with _lock:
        if _depth == 0:
            _was_enabled = gc.isenabled()
            gc.disable()
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0 and _was_enabled:
                gc.enable()
