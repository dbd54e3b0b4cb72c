"""What the dispatcher is wired from: the collections to dispatch, the effects it executes
and the router that executes them (:class:`~dispatcher.daemon.Dispatcher` uses these;
``aggbox dispatch status`` resolves the collections the same way)."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from aggregates.core.errors import ConfigurationError
from aggregates.core.settings import AggboxSettings
from aggregates.domain.aggregate import Registry
from aggregates.domain.effects import Effects
from dispatcher.core.faults import Faults
from dispatcher.core.settings import DispatcherSettings
from dispatcher.observe.metrics import Metrics
from dispatcher.publishers import Publisher

__all__ = ["check_replies", "effect_router", "load_effects", "resolve_collections"]

log = logging.getLogger("aggbox.dispatcher")


def resolve_collections(settings: DispatcherSettings) -> list[tuple[str, str | None]]:
    """``(collection, aggregate type name or None)`` for every collection to dispatch."""
    from aggregates.domain.aggregate import Registry

    types: dict[str, str] = {}
    if settings.aggregates:
        for atype in Registry.from_module(settings.aggregates):
            types.setdefault(atype.collection, atype.name)
    names = list(settings.collections) or list(types)
    if not names:
        raise ConfigurationError(
            "no collections to dispatch: set `collections` (--collection, "
            "AGGBOX_DISPATCHER_COLLECTIONS) or `aggregates` (--aggregates)"
        )
    if len(set(names)) != len(names):
        raise ConfigurationError(f"collections listed twice: {names}")
    return [(n, types.get(n)) for n in names]


def load_effects(settings: DispatcherSettings) -> Effects:
    """The effects of the ``aggregates`` module plus the built-ins of ``settings.effects``."""
    found = Effects.from_module(settings.aggregates) if settings.aggregates else Effects()
    if settings.effects:
        from dispatcher.effects.builtin import builtin_effects

        found = found.merged(builtin_effects(settings.effects))
    return found


def check_replies(effects: Effects, registry: Registry) -> None:
    """Every effect's result messages must have a handler in some aggregate type, or each
    result would be dead-lettered (``unknown_message_type``)."""
    handled = {t for atype in registry for t in atype.message_types}
    for e in effects:
        missing = [t for t in (e.on_success, e.on_failure) if t not in handled]
        if missing:
            raise ConfigurationError(
                f"effect {e.type}: no aggregate type handles {' or '.join(missing)}; add a "
                "handler for its result messages to the aggregate type that emits "
                f"{e.type} (registered types: {registry.names})")


async def effect_router(db: Any, publisher: Publisher, effects: Effects, *,
                        settings: DispatcherSettings, store: AggboxSettings, metrics: Metrics,
                        faults: Faults) -> tuple[Publisher, Any]:
    """``publisher`` wrapped so that effect entries are executed (dispatcher.effects), and
    the synchronous MongoDB client of the store writer that applies their results (the
    caller closes it)."""
    from pymongo import MongoClient

    from aggregates.store.writer import StoreWriter
    from dispatcher.effects.attempts import Attempts
    from dispatcher.effects.router import EffectRouter
    from dispatcher.effects.runner import EffectRunner

    if not settings.aggregates:
        raise ConfigurationError(
            "effects need the aggregate types their results are applied to: set "
            "`aggregates` (--aggregates MODULE)")
    registry = Registry.from_module(settings.aggregates)
    check_replies(effects, registry)
    uri = store.mongodb_uri
    if not uri:
        raise ConfigurationError(
            "effects need mongodb_uri (--mongodb-uri, AGGBOX_MONGODB_URI) for the store "
            "writer that applies their results")
    sync_client: Any = MongoClient(uri, tz_aware=True, appname="aggbox-effects")
    try:
        writer = StoreWriter(sync_client[store.database], registry,
                             settings=store.model_copy(update={"pipeline_depth": 1}))
        attempts = Attempts(db, collection=settings.effect_collection)
        await attempts.ensure_indexes()
    except BaseException:
        sync_client.close()
        raise

    async def reply(messages: list[Any]) -> list[Any]:
        return await asyncio.to_thread(writer.process, messages)

    runner = EffectRunner(attempts, reply, metrics=metrics, faults=faults)
    log.info("effects executed by this dispatcher: %s",
             ", ".join(f"{e.type} ({e.kind}, {e.guarantee})" for e in effects))
    return EffectRouter(publisher, runner, effects,
                        concurrency=settings.effect_concurrency), sync_client
