"""The public API is split by what it does: the domain API at ``aggregates``, read-only
debugging helpers in ``aggregates.debug``, operations that write in ``aggregates.ops``."""

from __future__ import annotations

import importlib

import pytest

import aggregates
import aggregates.debug
import aggregates.ops

WRITERS = {"replay_dead_letters", "release_aggregate", "clear_block", "DeadLetterStore",
           "ParkedStore"}
NOTEBOOK_HELPERS = {"replay", "trace", "load_aggregate", "AggregateView", "dead_letters"}


@pytest.mark.parametrize("name", ["aggregates", "aggregates.debug", "aggregates.ops",
                                  "aggregates.domain.aggregate", "aggregates.codec",
                                  "aggregates.core.reasons", "aggregates.testing"])
def test_every_exported_name_exists(name: str) -> None:
    module = importlib.import_module(name)
    assert sorted(module.__all__) == sorted(set(module.__all__)), name
    for export in module.__all__:
        assert hasattr(module, export), f"{name}.{export}"


def test_the_layers_do_not_mix() -> None:
    top = set(aggregates.__all__)
    assert not top & (WRITERS | NOTEBOOK_HELPERS)
    assert not set(aggregates.debug.__all__) & WRITERS
    assert set(aggregates.ops.__all__) >= WRITERS
    assert set(aggregates.debug.__all__) >= NOTEBOOK_HELPERS


def test_old_import_paths_still_work() -> None:
    from aggregates.codec import StateCodec
    from aggregates.domain.aggregate import AggregateType, Emit, Registry, TypedHandler

    assert aggregates.AggregateType is AggregateType and aggregates.Emit is Emit
    assert aggregates.Registry is Registry and aggregates.StateCodec is StateCodec
    assert TypedHandler.__module__ == "aggregates.domain.handlers"
