"""A store that speaks MongoDB's wire protocol but lacks something aggbox needs.

Servers that are not MongoDB (FerretDB, Cosmos DB, DocumentDB, …) answer a feature they do
not have with an error of their own — FerretDB 1.24 with code 238 ``NotImplemented``
("Index option "expireAfterSeconds" is not implemented yet"), others with 115
``CommandNotSupported``. :func:`not_implemented` recognises those by code (never by the
text); :class:`UnsupportedByServer` is the one line the user then gets: what the server
lacks and what aggbox needs it for — not "check that the server is reachable", since it
was reached. ``aggbox check-store`` reports the same errors per check."""

from __future__ import annotations

from typing import Final

from pymongo.errors import OperationFailure

from aggregates.core.errors import AggboxError

__all__ = ["NOT_IMPLEMENTED_CODES", "UnsupportedByServer", "not_implemented"]

#: 238 NotImplemented (FerretDB, mongod's own stubs), 115 CommandNotSupported.
NOT_IMPLEMENTED_CODES: Final = frozenset({115, 238})


class UnsupportedByServer(AggboxError):
    """The MongoDB server answered, and does not implement something aggbox needs.
    ``str()`` is one line naming it; the server's error is the ``__cause__``."""


def not_implemented(exc: BaseException) -> bool:
    """Whether ``exc`` is a server saying it does not implement the operation (or one of
    its options), as opposed to refusing it for this data or this user."""
    return isinstance(exc, OperationFailure) and exc.code in NOT_IMPLEMENTED_CODES
