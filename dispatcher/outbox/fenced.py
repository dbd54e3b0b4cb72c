"""The documents of a published chunk and whether their pull may go ahead
(docs/design.md "Fencing"; the cycle's, dispatcher/outbox/cycle.py)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from dispatcher.publishers.record import InvalidEntry, OutboundRecord

__all__ = ["Pull", "still_fenced"]

log = logging.getLogger("aggbox.dispatcher")


@dataclass(slots=True)
class _Doc:
    key: Any
    records: list[OutboundRecord | InvalidEntry]
    stale: list[str]
    #: the ``fence`` header its records carry (None: none), and the document it came from
    #: (to compute the fence again before the pull)
    fence: str | None = None
    doc: Mapping[str, Any] = field(default_factory=dict, repr=False)


#: One document's pull: the document, the ids to pull, the ids released for a retry.
Pull = tuple[_Doc, list[str], list[str]]


def still_fenced(pulls: list[Pull], *, fence: Callable[[Mapping[str, Any]], str | None] | None,
                 lease_held: Callable[[], bool], collection: str
                 ) -> tuple[list[Pull], list[Pull]]:
    """The pulls of documents whose lease is still held at the epoch their records were
    published under (without a fence: while the whole set is held), and the others — to be
    released, not pulled. A record the publisher acknowledged after its lease ended is a
    late copy (docs/design.md "Fencing"): left in the outbox, its entry is published again
    by the owner that took over, under a higher epoch — pulled, the late copy could be its
    only copy, and a consumer that drops late copies would lose it."""
    keep: list[Pull] = []
    late: list[Pull] = []
    for pull in pulls:
        d = pull[0]
        held = lease_held() if d.fence is None or fence is None else fence(d.doc) == d.fence
        (keep if held else late).append(pull)
    if late:
        entries = sum(len(done) for _d, done, _r in late)
        log.warning("%s: %d published entr%s of %d document(s) left in the outbox: the "
                    "lease they were published under ended before the publisher answered "
                    "(late copies; the partition's next owner publishes them again)",
                    collection, entries, "y" if entries == 1 else "ies", len(late),
                    extra={"collection": collection})
    return keep, late
