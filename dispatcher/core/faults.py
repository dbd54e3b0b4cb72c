"""Fault injection for crash and recovery tests. Inert unless a test passes rules in.

Production code never reads fault rules from anywhere: a test builds :class:`Faults` and
passes it to :class:`~dispatcher.daemon.Dispatcher` (``faults=``); a test that runs the
daemon as a process uses the test-only entry point ``python -m tests.dispatcher.faultrun
RULES <dispatch options>``. Rules are comma-separated ``point:action[@n]``: at the n-th
time (default 1st) the dispatcher reaches ``point``, ``action`` happens.

Points (in the order one batch goes through them):

- ``stream_open`` — a change stream is about to be opened;
- ``stream_read`` — the change stream is about to be read;
- ``before_publish`` — records are about to go to the publisher;
- ``after_publish`` — the broker acknowledged, nothing pulled yet;
- ``after_pull`` — entries pulled from the outbox, resume token not yet saved;
- ``after_checkpoint`` — resume token saved.

Points of the effect runner (:mod:`dispatcher.effects.runner`), per effect entry:

- ``effect_before_call`` — the attempt is recorded, the call not made yet;
- ``effect_after_call`` — the call returned, its result not recorded yet;
- ``effect_after_result`` — the result is recorded, the reply message not written yet.

Points of the timer firer (:mod:`dispatcher.timers.firer`), per round that publishes:

- ``timer_before_publish`` — due timers are about to go to the publisher;
- ``timer_after_publish`` — the broker acknowledged them, nothing removed yet.

Actions:

- ``kill`` — SIGKILL this process (as ``kill -9`` would);
- ``exit`` — ``os._exit(70)`` without any clean-up;
- ``history_lost`` — raise ``OperationFailure`` code 286 (ChangeStreamHistoryLost), which
  mongo-java-server never produces by itself;
- ``invalid_token`` — raise ``OperationFailure`` code 260 (InvalidResumeToken);
- ``no_change_streams`` — raise ``OperationFailure`` code 40573, what a standalone
  ``mongod`` answers to ``$changeStream`` (tests the fallback to polling);
- ``invalidate`` (at ``stream_read``) — the stream ends as after an ``invalidate`` event
  (collection dropped or renamed on MongoDB), which mongo-java-server never sends: raises
  :class:`InjectedInvalidate`, which the worker turns into that event;
- ``pause=SECONDS`` — the whole process stops for that long (a blocking sleep: no lease
  round, no heartbeat, nothing else of the event loop runs), as in a long GC or VM pause
  or ``SIGSTOP``. At ``before_publish`` it is the owner paused between its last lease check
  and the publisher's send: its leases expire, another instance claims them, and the
  records it then sends are late copies (docs/design.md "Fencing").

Example: ``Faults.parse("after_publish:kill@3")`` kills the process right after the
third batch was acknowledged by the broker and before it was pulled;
``Faults.parse("before_publish:pause=8@2")`` stops it for 8 s right before it hands its
second batch to the publisher.
"""

from __future__ import annotations

import logging
import math
import os
import signal
import time
from collections import Counter
from dataclasses import dataclass
from typing import Final, Literal

from pymongo.errors import OperationFailure

from aggregates.core.errors import ConfigurationError

__all__ = ["POINTS", "FaultRule", "Faults", "InjectedInvalidate"]

log = logging.getLogger("aggbox.dispatcher.faults")

POINTS: Final = ("stream_open", "stream_read", "before_publish", "after_publish", "after_pull",
                 "after_checkpoint", "effect_before_call", "effect_after_call",
                 "effect_after_result", "timer_before_publish", "timer_after_publish")
Action = Literal["kill", "exit", "history_lost", "invalid_token", "no_change_streams",
                 "invalidate", "pause"]
ACTIONS: Final = ("kill", "exit", "history_lost", "invalid_token", "no_change_streams",
                  "invalidate", "pause")

CHANGE_STREAM_HISTORY_LOST: Final = 286
INVALID_RESUME_TOKEN: Final = 260
CHANGE_STREAMS_NOT_SUPPORTED: Final = 40573


class InjectedInvalidate(Exception):
    """Fault action ``invalidate``: the change stream is to end as after an ``invalidate``
    event."""


@dataclass(frozen=True, slots=True)
class FaultRule:
    point: str
    action: Action
    at: int = 1
    #: how long ``pause`` stops the process
    seconds: float = 0.0


class Faults:
    """The configured rules and how often each point was reached."""

    def __init__(self, rules: list[FaultRule] | None = None) -> None:
        self.rules = list(rules or [])
        self.hits: Counter[str] = Counter()

    @classmethod
    def parse(cls, spec: str | None) -> Faults:
        rules: list[FaultRule] = []
        for part in (spec or "").split(","):
            part = part.strip()
            if not part:
                continue
            point, _, rest = part.partition(":")
            action, _, count = rest.partition("@")
            action, has_arg, arg = action.partition("=")
            if point not in POINTS or action not in ACTIONS:
                raise ConfigurationError(
                    f"fault rules: bad rule {part!r}; use point:action[@n] with point in "
                    f"{POINTS} and action in {ACTIONS} (pause=SECONDS)"
                )
            try:
                at = int(count) if count else 1
            except ValueError:
                raise ConfigurationError(f"fault rules: bad count in {part!r}") from None
            seconds = 0.0
            if action == "pause" or has_arg:
                try:
                    seconds = float(arg)
                except ValueError:
                    seconds = -1.0
                if action != "pause" or not (0 < seconds < math.inf):
                    raise ConfigurationError(
                        f"fault rules: bad rule {part!r}; only pause takes a value: "
                        f"pause=SECONDS, a positive number")
            rules.append(FaultRule(point, action, at, seconds))  # type: ignore[arg-type]
        return cls(rules)

    def add(self, point: str, action: Action, at: int = 1, seconds: float = 0.0) -> None:
        """Arm a rule at run time (in-process tests); ``at`` counts from now."""
        self.rules.append(FaultRule(point, action, self.hits[point] + at, seconds))

    def hit(self, point: str) -> None:
        """Called by the dispatcher at each point; does nothing unless a rule matches."""
        if not self.rules:
            return
        self.hits[point] += 1
        n = self.hits[point]
        for rule in self.rules:
            if rule.point == point and rule.at == n:
                self._act(rule)

    def _act(self, rule: FaultRule) -> None:
        log.warning("fault injection: %s at %s (hit %d)", rule.action, rule.point, rule.at)
        if rule.action == "pause":
            for handler in logging.getLogger().handlers:
                handler.flush()
            time.sleep(rule.seconds)  # blocking on purpose: the whole process stands still
            log.warning("fault injection: pause at %s ended after %.1fs", rule.point,
                        rule.seconds)
        if rule.action == "kill":
            for handler in logging.getLogger().handlers:
                handler.flush()
            os.kill(os.getpid(), signal.SIGKILL)
        elif rule.action == "exit":
            os._exit(70)
        elif rule.action == "history_lost":
            raise OperationFailure("injected: change stream history lost",
                                   code=CHANGE_STREAM_HISTORY_LOST)
        elif rule.action == "invalid_token":
            raise OperationFailure("injected: invalid resume token", code=INVALID_RESUME_TOKEN)
        elif rule.action == "no_change_streams":
            raise OperationFailure("injected: $changeStream is only supported on replica sets",
                                   code=CHANGE_STREAMS_NOT_SUPPORTED)
        elif rule.action == "invalidate":
            raise InjectedInvalidate("injected: change stream invalidated")
