"""The ``fence`` header of a published record (pure): which lease it was published under.

The dispatcher stamps every Kafka record with ``fence: <database>.<collection>/<partition>:
<epoch>`` — the lease of the aggregate partition it held when it published the record
(docs/design.md "Scale-out: partitions and leases", "Fencing"). ``<database>.<collection>``
is the lease's scope exactly as stored (the ``scope`` field of
``aggbox_dispatcher_partitions``); epochs count per (scope, partition), so only records of
the same scope and partition are ever compared.

The value parses unambiguously whatever the collection is called: ``partition`` and
``epoch`` are decimal digits, so the last ``:`` ends the partition and the last ``/``
before it ends the collection; a database name cannot contain ``.`` (nor ``/ \\ " $``,
space, NUL), so the first ``.`` ends the database. A collection name may contain ``.``,
``/``, ``:`` and digits freely.

A consumer reads it with :func:`parse_fence`::

    fence = parse_fence(dict(msg.headers())["fence"])
    fence.scope, fence.partition, fence.epoch
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final

from aggregates.core.errors import AggboxError
from aggregates.core.partitions import PARTITIONS

__all__ = ["FENCE_HEADER", "Fence", "InvalidFence", "fence_scope", "format_fence",
           "parse_fence"]

#: The record header that carries the fence.
FENCE_HEADER: Final = "fence"

#: Characters a MongoDB database name cannot contain (and the scope separator ``.``).
_DB_FORBIDDEN: Final = frozenset('/\\. "$\x00')
#: Characters a collection name cannot contain.
_COLL_FORBIDDEN: Final = frozenset("$\x00")
#: A canonical decimal number: no sign, no leading zeros, ASCII digits only (``int()``
#: would also take ``+1``, ``1_0``, ``٣`` and spaces).
_DECIMAL: Final = re.compile(r"0|[1-9][0-9]*")
_FORMAT: Final = "<database>.<collection>/<partition>:<epoch>"


class InvalidFence(AggboxError, ValueError):
    """A ``fence`` header value that is not ``<database>.<collection>/<partition>:<epoch>``.
    ``field`` names the part that is wrong: ``fence`` (the value as a whole),
    ``database``, ``collection``, ``partition`` or ``epoch``."""

    def __init__(self, value: object, field: str, reason: str) -> None:
        self.value = value
        self.field = field
        self.reason = reason
        shown = repr(value)
        if len(shown) > 200:
            shown = shown[:197] + "..."
        super().__init__(f"invalid fence header {shown}: field {field!r}: {reason}; "
                         f"expected {_FORMAT}")


@dataclass(frozen=True, slots=True)
class Fence:
    """The lease a record was published under: partition ``partition`` of collection
    ``collection`` in database ``database``, at lease epoch ``epoch`` (it grows by one with
    every claim of that lease). ``str(fence)`` is the header value."""

    database: str
    collection: str
    partition: int
    epoch: int

    @property
    def scope(self) -> str:
        """``<database>.<collection>``: the lease scope as stored by the dispatcher."""
        return f"{self.database}.{self.collection}"

    @property
    def lease(self) -> tuple[str, str, int]:
        """(database, collection, partition): what the epoch counts in. Epochs of
        different leases are never comparable."""
        return self.database, self.collection, self.partition

    def __str__(self) -> str:
        return format_fence(self.database, self.collection, self.partition, self.epoch)


def fence_scope(database: str, collection: str) -> str:
    """``<database>.<collection>`` after checking both names (a value that would not parse
    back raises :class:`InvalidFence`). The dispatcher computes it once per collection."""
    scope = f"{database}.{collection}"
    _check_database(database, scope)
    _check_collection(collection, scope)
    return scope


def format_fence(database: str, collection: str, partition: int, epoch: int) -> str:
    """The header value; raises :class:`InvalidFence` for names or numbers that would not
    parse back to the same :class:`Fence`."""
    value = f"{fence_scope(database, collection)}/{partition}:{epoch}"
    _check_numbers(partition, epoch, value)
    return value


def parse_fence(value: str | bytes) -> Fence:
    """A ``fence`` header value (``str``, or the UTF-8 ``bytes`` a Kafka client returns) →
    :class:`Fence`. Raises :class:`InvalidFence` naming the part that is wrong."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        try:
            text = bytes(value).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise InvalidFence(value, "fence", f"not UTF-8 ({exc.reason})") from None
    elif isinstance(value, str):
        text = value
    else:
        raise InvalidFence(value, "fence", f"a {type(value).__name__}, not text")
    head, colon, epoch_s = text.rpartition(":")
    if not colon:
        raise InvalidFence(value, "fence", "no ':' before the epoch")
    scope, slash, partition_s = head.rpartition("/")
    if not slash:
        raise InvalidFence(value, "fence", "no '/' before the partition")
    database, dot, collection = scope.partition(".")
    if not dot:
        raise InvalidFence(value, "fence", "no '.' between database and collection")
    _check_database(database, value)
    _check_collection(collection, value)
    partition = _decimal(partition_s, "partition", value)
    epoch = _decimal(epoch_s, "epoch", value)
    _check_numbers(partition, epoch, value)
    return Fence(database, collection, partition, epoch)


def _decimal(text: str, field: str, value: object) -> int:
    if not _DECIMAL.fullmatch(text):
        raise InvalidFence(value, field, f"{text!r} is not a decimal number")
    return int(text)


def _check_numbers(partition: int, epoch: int, value: object) -> None:
    if isinstance(partition, bool) or not isinstance(partition, int) or not (
            0 <= partition < PARTITIONS):
        raise InvalidFence(value, "partition", f"{partition!r} is not in 0..{PARTITIONS - 1}")
    if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 1:
        raise InvalidFence(value, "epoch", f"{epoch!r} is not a lease epoch (1 or more)")


def _check_database(database: str, value: object) -> None:
    if not database:
        raise InvalidFence(value, "database", "empty")
    bad = sorted(set(database) & _DB_FORBIDDEN)
    if bad:
        raise InvalidFence(value, "database",
                           f"contains {''.join(bad)!r}, which a database name cannot")


def _check_collection(collection: str, value: object) -> None:
    if not collection:
        raise InvalidFence(value, "collection", "empty")
    bad = sorted(set(collection) & _COLL_FORBIDDEN)
    if bad:
        raise InvalidFence(value, "collection",
                           f"contains {''.join(bad)!r}, which a collection name cannot")
