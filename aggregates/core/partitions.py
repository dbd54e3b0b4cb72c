"""Partitions of an aggregate collection (docs/design.md "Document layout", field ``_p``).
Pure, no I/O.

Every aggregate document carries its partition in ``_p``, written once, when the writer
inserts it, so that several dispatcher instances can each publish a share of the partitions.
The partition is a stable hash of the aggregate id, computable in any language::

    int.from_bytes(sha256(aggregate_id.encode("utf-8", "surrogatepass")).digest()[:8], "big")
        % PARTITIONS

that is, the first 8 bytes of the SHA-256 digest of the id's UTF-8 bytes (a lone surrogate,
which MongoDB cannot store anyway, encoded as its three UTF-8-style bytes), read as an
unsigned big-endian integer, modulo 256. Never Python's ``hash()``, which differs between
processes.

:data:`PARTITIONS` is fixed for the life of a collection: enough for up to 256 dispatcher
instances, few enough that every instance can read all partition leases in each renewal
round. Changing it would put stored documents in the wrong partition: every document would
have to be re-partitioned.
"""

from __future__ import annotations

import hashlib
from typing import Final

__all__ = ["F_PARTITION", "PARTITIONS", "partition_of"]

#: Number of partitions of every aggregate collection. Fixed: see the module docstring.
PARTITIONS: Final = 256

#: The document field holding the partition (absent in a document something other than the
#: writer inserted, until ``aggbox migrate partitions``; the dispatcher counts those as
#: partition 0).
F_PARTITION: Final = "_p"


def partition_of(aggregate_id: str) -> int:
    """The partition (``0 <= p < PARTITIONS``) of ``aggregate_id``:
    ``int.from_bytes(hashlib.sha256(aggregate_id.encode("utf-8", "surrogatepass"))
    .digest()[:8], "big") % PARTITIONS``. Stable across processes, versions and languages."""
    digest = hashlib.sha256(aggregate_id.encode("utf-8", "surrogatepass")).digest()
    return int.from_bytes(digest[:8], "big") % PARTITIONS
