"""aggregates.core.gcpause: the collector is paused for a chunk, enabled again when the last
pause ends, and left off in a process that turned it off."""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator

import pytest

from aggregates.core.gcpause import gc_paused


@pytest.fixture(autouse=True)
def _restore() -> Iterator[None]:
    was = gc.isenabled()
    yield
    if was:
        gc.enable()
    else:
        gc.disable()


def test_paused_inside_enabled_after() -> None:
    gc.enable()
    with gc_paused():
        assert not gc.isenabled()
        with gc_paused():  # nested: the inner end does not enable it
            assert not gc.isenabled()
        assert not gc.isenabled()
    assert gc.isenabled()


def test_enabled_again_after_an_error() -> None:
    gc.enable()
    with pytest.raises(ValueError), gc_paused():
        raise ValueError("boom")
    assert gc.isenabled()


def test_a_process_that_turned_it_off_keeps_it_off() -> None:
    gc.disable()
    with gc_paused():
        assert not gc.isenabled()
    assert not gc.isenabled()


def test_overlapping_pauses_in_threads_enable_once_the_last_ends() -> None:
    gc.enable()
    first_in, second_in, first_out = threading.Event(), threading.Event(), threading.Event()
    seen: list[bool] = []

    def first() -> None:
        with gc_paused():
            first_in.set()
            second_in.wait(30)
        first_out.set()

    def second() -> None:
        first_in.wait(30)
        with gc_paused():
            second_in.set()
            first_out.wait(30)
            seen.append(gc.isenabled())  # the first ended: still paused for this one

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert seen == [False]
    assert gc.isenabled()


def test_the_writer_pauses_it_for_a_chunk() -> None:
    from aggbox.examples.orders import registry
    from aggregates import AggboxSettings, Message, StoreWriter
    from aggregates.testing import memory_database

    states: list[bool] = []
    db = memory_database()
    writer = StoreWriter(db, registry, settings=AggboxSettings(database=db.name,
                                                               pipeline_depth=1),
                         before_write=lambda _ops: states.append(gc.isenabled()))
    gc.enable()
    out = writer.process([Message(message_id="m1", type="CustomerRegistered",
                                  aggregate_type="Customer", aggregate_id="c1",
                                  payload={"name": "A", "credit_limit": 10})])
    assert [o.outcome for o in out] == ["applied"]
    assert states and not any(states)
    assert gc.isenabled()
