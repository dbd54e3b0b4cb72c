"""Evolving schemas (docs/evolving-schemas.md): message upcasters and stored-state migrations,
the part of :class:`aggregates.domain.aggregate.AggregateType` that turns old shapes into current
ones."""

from __future__ import annotations

import builtins
import copy
import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Generic, TypeAlias, cast

from aggregates.codec import StateCodec
from aggregates.core.errors import (
    AggboxError,
    ConfigurationError,
    StateMigrationError,
    UnknownSchemaVersion,
    UpcastFailed,
)
from aggregates.core.fieldnames import check_field_names
from aggregates.domain.handlers import check_arity
from aggregates.message.emit import S
from aggregates.message.envelope import Message

__all__ = ["SchemaEvolution", "StateMigration", "Upcaster"]

#: An upcaster: a message type's payload at version N → its payload at version N + 1.
Upcaster: TypeAlias = Callable[[dict[str, Any]], dict[str, Any]]
#: A state migration: the stored ``state`` document at version N → at version N + 1.
StateMigration: TypeAlias = Callable[[dict[str, Any]], dict[str, Any]]


class SchemaEvolution(Generic[S]):
    """Upcasters and state migrations of one aggregate type (a base of
    :class:`~aggregates.domain.aggregate.AggregateType`, which sets these attributes)."""

    name: str
    state_version: int
    codec: StateCodec[S]
    #: message type → upcasters, index i turning version i + 1 into i + 2
    _upcasters: dict[str, list[Upcaster]]
    #: index i turns stored state version i + 1 into i + 2
    _migrations: list[StateMigration]

    def upcaster(self, message_type: str | builtins.type[Any], *, from_version: int
                 ) -> Callable[[Upcaster], Upcaster]:
        """Decorator registering ``fn(payload: dict) -> dict``, turning ``message_type``'s
        payload at ``from_version`` into its payload at ``from_version + 1``. Register a
        type's upcasters in order (``from_version=1``, then 2, …); the last one's target is
        the type's current version (:meth:`message_version`). An upcaster must be pure and
        deterministic: it gets a copy of the payload and may change it."""
        mtype = message_type if isinstance(message_type, str) else getattr(
            message_type, "__name__", "")
        if not isinstance(mtype, str) or not mtype:
            raise ConfigurationError(f"{self.name}: upcaster({message_type!r}): pass a message "
                                     "type name or a payload class")
        expected = self.message_version(mtype)
        if (not isinstance(from_version, int) or isinstance(from_version, bool)
                or from_version != expected):
            raise ConfigurationError(
                f"{self.name}: upcaster for {mtype!r} from_version={from_version!r}: "
                f"expected from_version={expected} (register upcasters in order, one per "
                "version step)")

        def register(fn: Upcaster) -> Upcaster:
            check_arity(fn, 1, "(payload) and return the upgraded payload dict")
            chain = self._upcasters.setdefault(mtype, [])
            if len(chain) + 1 != from_version:
                raise ConfigurationError(f"{self.name}: upcaster for {mtype!r} from version "
                                         f"{from_version} registered twice")
            chain.append(fn)
            return fn

        return register

    @property
    def upcasts(self) -> bool:
        """Whether any upcaster is registered (the fold skips :meth:`upcast` otherwise for
        messages at schema version 1)."""
        return bool(self._upcasters)

    def message_version(self, message_type: str) -> int:
        """The latest schema version of ``message_type``: 1 plus its upcasters."""
        return len(self._upcasters.get(message_type, ())) + 1

    def upcast(self, msg: Message) -> Message:
        """``msg`` with its payload brought to :meth:`message_version` of its type (``msg``
        itself when it is current). Raises :class:`UnknownSchemaVersion` for a version newer
        than the latest, :class:`UpcastFailed` when an upcaster raises or returns
        something that is not a payload dict."""
        latest = self.message_version(msg.type)
        version = msg.schema_version
        if version == latest:
            return msg
        if version > latest:
            raise UnknownSchemaVersion(
                f"{msg.type} schema_version {version} is newer than the latest this "
                f"definition of {self.name} knows ({latest}); deploy the definitions with its "
                "upcaster (readers first), then replay the dead letters")
        payload = _run_chain(self._upcasters[msg.type][version - 1:], msg.payload,
                             start=version, what=f"upcaster {{}} of {msg.type}",
                             error=UpcastFailed)
        try:
            check_field_names(payload, "payload", envelope=True)
        except AggboxError as exc:
            raise UpcastFailed(f"the upcast payload of {msg.type}: {exc}") from None
        return dataclasses.replace(msg, payload=payload, schema_version=latest)

    def state_migration(self, *, from_version: int
                        ) -> Callable[[StateMigration], StateMigration]:
        """Decorator registering ``fn(doc: dict) -> dict``, turning a stored ``state``
        document at ``from_version`` into one at ``from_version + 1`` (plain BSON values, as
        stored; before the codec loads it). Register them in order, from 1 up to
        ``state_version - 1``. A migration must be pure and deterministic: it gets a copy."""
        expected = len(self._migrations) + 1
        if (not isinstance(from_version, int) or isinstance(from_version, bool)
                or from_version != expected):
            raise ConfigurationError(
                f"{self.name}: state_migration(from_version={from_version!r}): expected "
                f"from_version={expected} (register migrations in order, one per version step)")
        if from_version >= self.state_version:
            raise ConfigurationError(
                f"{self.name}: state_migration(from_version={from_version}) goes beyond "
                f"state_version={self.state_version}; raise state_version")

        def register(fn: StateMigration) -> StateMigration:
            check_arity(fn, 1, "(state_document) and return the migrated document")
            if len(self._migrations) + 1 != from_version:
                raise ConfigurationError(f"{self.name}: state migration from version "
                                         f"{from_version} registered twice")
            self._migrations.append(fn)
            return fn

        return register

    def migrate_state(self, doc: Mapping[str, Any] | None, stored_version: int
                      ) -> Mapping[str, Any] | None:
        """The stored ``state`` document ``doc`` (written at ``stored_version``) brought to
        :attr:`state_version` (``doc`` itself when current; ``None`` and an empty document
        are never migrated: there is nothing to convert). Raises
        :class:`StateMigrationError`."""
        if (not isinstance(stored_version, int) or isinstance(stored_version, bool)
                or stored_version < 1):
            raise StateMigrationError(f"{self.name}: the stored state version (_sv) "
                                      f"{stored_version!r} is not an integer ≥ 1")
        if stored_version > self.state_version:
            raise StateMigrationError(
                f"{self.name}: the stored state was written by a newer version (_sv "
                f"{stored_version}, this definition has state_version {self.state_version}); "
                "deploy the newer definitions")
        if stored_version == self.state_version or not doc:
            return doc
        if len(self._migrations) < self.state_version - 1:
            raise StateMigrationError(
                f"{self.name}: no state migration from version {len(self._migrations) + 1} "
                f"(state_version is {self.state_version}); register one with "
                f"@{self.name.lower()}.state_migration(from_version="
                f"{len(self._migrations) + 1})")
        return _run_chain(self._migrations[stored_version - 1:self.state_version - 1],
                          dict(doc), start=stored_version,
                          what=f"{self.name}: state migration {{}}", error=StateMigrationError)

    def load_state(self, doc: Mapping[str, Any] | None, stored_version: int = 1) -> S:
        """The state object of a stored ``state`` document written at ``stored_version``
        (the document's ``_sv``): migrated (:meth:`migrate_state`), then loaded by the codec.
        Raises :class:`StateMigrationError` or the codec's ``StateCodecError``."""
        if type(stored_version) is int and stored_version == self.state_version:  # current
            return self.codec.load(doc)
        return self.codec.load(self.migrate_state(doc, stored_version))


def _run_chain(fns: Sequence[Callable[[Any], Any]], value: Mapping[str, Any], *, start: int,
               what: str, error: builtins.type[AggboxError]) -> dict[str, Any]:
    """Apply version steps ``fns`` (the first takes version ``start``) to a deep copy of
    ``value``; each must return a dict. ``what`` names a step (``{}`` → the function)."""
    out: Any = copy.deepcopy(dict(value))
    for i, fn in enumerate(fns, start=start):
        name = what.format(getattr(fn, "__qualname__", fn))
        try:
            out = fn(out)
        except Exception as exc:
            raise error(f"{name} from version {i} to {i + 1} raised "
                        f"{builtins.type(exc).__name__}: {' '.join(str(exc).split())}"
                        ) from exc
        if not isinstance(out, dict):
            raise error(f"{name} from version {i} to {i + 1} returned "
                        f"{builtins.type(out).__name__}, not a dict")
    return cast(dict[str, Any], out)
