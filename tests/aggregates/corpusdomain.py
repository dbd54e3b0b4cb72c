"""The aggregate type the number and type corpus (tests/corpus.py) is pushed through
(tests/aggregates/test_value_corpus.py): one handler per place a value enters. The message
names the corpus value (``{"name": ...}``); the handler makes it — a value a handler computes,
never one that came in as JSON."""

from __future__ import annotations

import dataclasses
from datetime import timedelta
from typing import Any

from pydantic import BaseModel

from aggregates import AggregateType, Effects, Emit, Message, Registry, Schedule
from aggregates.domain.effects import EffectCall
from tests.corpus import by_name

Probe = dict[str, Any]

probes: AggregateType[Probe] = AggregateType("Probe", state=dict, collection="probes")


class TypedModel(BaseModel):
    """A typed payload whose field pydantic cannot know the type of."""

    v: Any


@dataclasses.dataclass(frozen=True)
class TypedData:
    v: Any


def made(msg: Message) -> Any:
    return by_name(msg.payload["name"]).make()


@probes.handles("State")
def state(_: Probe, msg: Message) -> Any:
    return {"v": made(msg)}


@probes.handles("DictEmit")
def dict_emit(_: Probe, msg: Message) -> Any:
    return {"n": 1}, [Emit("Out", {"v": made(msg)})]


@probes.handles("TypedEmit")
def typed_emit(_: Probe, msg: Message) -> Any:
    return {"n": 1}, [Emit(TypedModel(v=made(msg)))]


@probes.handles("TypedDataclassEmit")
def typed_dataclass_emit(_: Probe, msg: Message) -> Any:
    return {"n": 1}, [Emit(TypedData(v=made(msg)))]


@probes.handles("Timer")
def timer(_: Probe, msg: Message) -> Any:
    return {"n": 1}, [Schedule(Emit("Out", {"v": made(msg)}), key="t",
                               after=timedelta(hours=1))]


@probes.handles("EffectEntry")
def effect_entry(_: Probe, msg: Message) -> Any:
    """An effect entry holding the value (an emit of an effect's type)."""
    return {"n": 1}, [Emit("ProbeCall", {"v": made(msg)})]


@probes.handles("CallEffect")
def call_effect(_: Probe, msg: Message) -> Any:
    """An effect entry naming the value its function is to return."""
    return {"n": 1}, [Emit("ProbeCall", {"name": msg.payload["name"]})]


@probes.handles("Called")
def called(_: Probe, msg: Message) -> Any:
    return {"result": dict(msg.payload)}


@probes.handles("CallFailed")
def call_failed(_: Probe, msg: Message) -> Any:
    return {"failure": dict(msg.payload)}


effects = Effects()


@effects.effect("ProbeCall", on_success="Called", on_failure="CallFailed", max_attempts=1)
def probe_call(call: EffectCall) -> dict[str, Any]:
    """Returns the corpus value its entry names (the effect *result* holds it)."""
    return {"v": by_name(str(call.payload["name"])).make()}


registry = Registry([probes])
