"""The dead letters of entries the dispatcher cannot publish (docs/design.md "The
dispatcher", step 3): an entry that forms no valid record (:func:`invalid_letter`) and a
record the publisher refused for good or could not encode (:func:`rejected_letter`), for the
outbox cycle and the timer firer alike. Each carries the entry id as its ``message_id``, so
``aggbox deadletters show <entry id>`` (and ``dismiss``/``replay --id``) find it by the id
the outbox, the logs and the consumers know."""

from __future__ import annotations

from aggregates.core.reasons import Reason
from aggregates.fold import DeadLetter
from aggregates.wire.outbound import InvalidEntry
from dispatcher.publishers.base import PublishResult
from dispatcher.publishers.record import OutboundRecord

__all__ = ["invalid_letter", "rejected_letter"]


def invalid_letter(exc: InvalidEntry, *, aggregate_type: str, aggregate_id: str
                   ) -> DeadLetter:
    """``invalid_outbox_entry``: the entry as stored (``raw``) and why it forms no record."""
    return DeadLetter(message=None, raw=exc.entry, reason=Reason.INVALID_OUTBOX_ENTRY,
                      detail=str(exc), aggregate_type=aggregate_type,
                      aggregate_id=aggregate_id, message_id=exc.entry_id)


def rejected_letter(r: OutboundRecord, res: PublishResult, publisher: str, *,
                    what: str = "it") -> DeadLetter:
    """A record ``res`` (permanent) says will never go out: the envelope as its message
    (the entry as stored when the envelope does not validate), the detail saying who refused
    it and why — an effect that failed for good, a record the publisher could not encode
    (``invalid_outbox_entry``), or the broker's refusal (``what``: how to name the entry,
    e.g. ``timer 'deadline'``)."""
    if res.effect:
        detail = f"effect {r.envelope.get('type')!r} failed for good: {res.error}"
    elif res.reason == Reason.INVALID_OUTBOX_ENTRY:
        detail = f"publisher {publisher} {res.error}"
    else:
        detail = (f"publisher {publisher} rejected {what} for good (topic {r.topic!r}): "
                  f"{res.error}")
    try:
        message = r.message
    except Exception:  # an envelope the publisher could not take may not validate either
        message = None
    return DeadLetter(message=message, raw=None if message is not None else r.entry,
                      reason=res.reason or Reason.REJECTED_BY_BROKER, detail=detail,
                      aggregate_type=r.source_type, aggregate_id=str(r.document_id),
                      message_id=r.message_id)
