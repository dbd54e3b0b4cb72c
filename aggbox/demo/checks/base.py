"""What the checks share: the verdict of one check, the evidence they read (prepared once),
and formatting helpers. The evidence is plain data, so the checks run — and are tested to
fail on a corrupted store — without Spark."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from aggbox.demo.model import OutcomeRow, RunRecord
from aggbox.demo.oracle import Envelope, Expected, Key, bson_plain, classify
from aggbox.demo.store import StoreView
from aggregates.domain.aggregate import Registry
from aggregates.fold.document import F_STATE

__all__ = ["SHOW", "Check", "Evidence", "fmt", "plural", "state_of", "verdict"]

#: Offenders named in a FAIL detail.
SHOW: Final = 3


@dataclass(frozen=True, slots=True)
class Check:
    name: str
    passed: bool
    detail: str

    @property
    def result(self) -> str:
        return "PASS" if self.passed else "FAIL"


@dataclass(slots=True)
class Evidence:
    """Everything the checks look at, prepared once."""

    expected: Expected
    store: StoreView
    run: RunRecord
    registry: Registry
    #: every valid input message of every round, by id
    messages: dict[str, Envelope] = field(init=False, default_factory=dict)
    #: applied outcome rows per aggregate (all rounds)
    applied: dict[Key, list[OutcomeRow]] = field(init=False, default_factory=dict)
    #: every record the dispatcher published, parsed
    published: list[dict[str, Any]] = field(init=False, default_factory=list)
    #: the ids each drain published
    published_by_drain: list[set[str]] = field(init=False, default_factory=list)

    def __post_init__(self) -> None:
        for r in self.run.rounds:
            for line in r.lines:
                c = classify(line, self.registry)
                if c.message is not None and c.reason is None:
                    self.messages.setdefault(c.message.message_id, c.message)
        for r in self.run.rounds:
            for o in r.outcomes:
                if o.outcome == "applied" and o.aggregate_type and o.aggregate_id:
                    self.applied.setdefault((o.aggregate_type, o.aggregate_id), []).append(o)
        for d in self.run.drains:
            ids: set[str] = set()
            for line in d.records:
                env = json.loads(line)
                self.published.append(env)
                ids.add(str(env["message_id"]))
            self.published_by_drain.append(ids)


def fmt(n: int) -> str:
    return f"{n:,}"


def plural(n: int, word: str) -> str:
    return f"{fmt(n)} {word}" + ("" if n == 1 else "s")


def verdict(name: str, problems: Sequence[str], ok: str, *, total: int | None = None
            ) -> Check:
    """PASS with ``ok`` when there are no problems, else FAIL naming the first few."""
    if not problems:
        return Check(name, True, ok)
    shown = "; ".join(problems[:SHOW])
    more = f" (+{fmt(len(problems) - SHOW)} more)" if len(problems) > SHOW else ""
    of = f" of {fmt(total)}" if total is not None else ""
    return Check(name, False, f"{fmt(len(problems))}{of} wrong: {shown}{more}")


def state_of(doc: Mapping[str, Any] | None) -> dict[str, Any]:
    """The ``state`` sub-document of a stored aggregate (``{}`` when missing), datetimes as
    aware UTC like the oracle's (:func:`~aggbox.demo.oracle.bson_plain`)."""
    state: dict[str, Any] = bson_plain(dict((doc or {}).get(F_STATE) or {}))
    return state
