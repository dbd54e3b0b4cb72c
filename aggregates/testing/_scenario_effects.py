"""Effects in a :class:`~aggregates.testing.scenario.Scenario`: the team's own effect functions (an
:class:`~aggregates.domain.effects.Effects` registry) or fakes that answer per call
(:class:`Answer`), run with the dispatcher's effect rules — attempts begun before the call,
a query after an unanswered attempt, ``max_attempts``, the same reasons and error texts
(:mod:`aggregates.domain.effect_rules`) and the same reply
(:func:`aggregates.domain.effects.reply_message`).

No I/O of its own: what an effect function does is its business. Attempt records live in
memory for the scenario's life (in production they are ``aggbox_effects`` documents)."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Literal, TypeAlias

from aggregates.core.errors import ConfigurationError
from aggregates.core.reasons import Reason
from aggregates.domain.effect_rules import (
    exhausted_error,
    result_payload,
    retry_reason,
    text,
    with_attempt,
)
from aggregates.domain.effects import (
    Effect,
    EffectCall,
    Effects,
    PermanentEffectError,
    RetryableEffectError,
)

__all__ = ["Answer", "AnswerKind", "EffectCallRecord", "EffectDesk", "Settled"]

AnswerKind: TypeAlias = Literal["ok", "retryable", "permanent", "timeout"]


@dataclass(frozen=True, slots=True)
class Answer:
    """What a fake effect answers to one call: :meth:`ok`, :meth:`retryable`,
    :meth:`permanent` or :meth:`timeout`."""

    kind: AnswerKind
    payload: Mapping[str, Any] | None = None
    reason: str = ""
    detail: str = ""

    @staticmethod
    def ok(payload: Mapping[str, Any] | None = None) -> Answer:
        """Success; ``payload`` is the ``on_success`` message's payload."""
        return Answer("ok", dict(payload or {}))

    @staticmethod
    def retryable(detail: str = "", *, reason: str = Reason.EFFECT_RETRYABLE) -> Answer:
        """A transient failure (a 503): the call is made again, up to ``max_attempts``."""
        return Answer("retryable", reason=reason, detail=detail)

    @staticmethod
    def permanent(reason: str = Reason.EFFECT_REJECTED, detail: str = "") -> Answer:
        """A refusal for good (a 4xx): the aggregate receives ``on_failure``."""
        return Answer("permanent", reason=reason, detail=detail)

    @staticmethod
    def timeout() -> Answer:
        """No answer within ``timeout_s``: retried like a retryable failure."""
        return Answer("timeout")

    def give(self) -> Mapping[str, Any] | None:
        """The answer as an effect function gives it (returns or raises)."""
        if self.kind == "ok":
            return self.payload
        if self.kind == "retryable":
            raise RetryableEffectError(self.detail, reason=self.reason)
        if self.kind == "permanent":
            raise PermanentEffectError(self.reason, self.detail)
        raise TimeoutError("no answer")


class _Fake:
    """A fake effect function: the n-th call gets the n-th answer (the last one repeats)."""

    def __init__(self, answers: Sequence[Answer]) -> None:
        if not answers or not all(isinstance(a, Answer) for a in answers):
            raise ConfigurationError("fake_effect(): give at least one Answer, e.g. "
                                     "Answer.ok({...}) or Answer.timeout()")
        self.answers = list(answers)
        self.calls = 0

    def __call__(self, call: EffectCall) -> Mapping[str, Any] | None:
        answer = self.answers[min(self.calls, len(self.answers) - 1)]
        self.calls += 1
        return answer.give()


@dataclass(frozen=True, slots=True)
class EffectCallRecord:
    """One call of an effect function (or fake): the :class:`EffectCall` it got and how it
    answered — ``ok``, ``retryable``, ``permanent``, ``timeout``, ``lost`` (an injected
    fault: the call was made, its answer lost) or ``query`` (the query function was asked)."""

    call: EffectCall
    answer: str
    result: Mapping[str, Any] | None = None
    reason: str | None = None
    detail: str | None = None

    @property
    def type(self) -> str:
        return self.call.type


@dataclass(slots=True)
class _Attempt:
    attempts: int = 0
    final: bool = False
    result: dict[str, Any] | None = None
    failure: tuple[str, str] | None = None
    last_error: str | None = None


@dataclass(frozen=True, slots=True)
class Settled:
    """How one execution of an effect entry ended: ``retry`` (the entry stays, later ones
    of the aggregate wait), or a result to deliver (``result`` or ``failure``)."""

    status: Literal["ok", "failed", "retry"]
    attempts: int
    result: dict[str, Any] | None = None
    failure: tuple[str, str] | None = None
    answer: str = ""
    reason: str | None = None
    detail: str | None = None


@dataclass(slots=True)
class EffectDesk:
    """The effects of one scenario: registered ones, fakes (which win), attempt records,
    and every call made (:attr:`calls`)."""

    effects: Effects = field(default_factory=Effects)
    fakes: dict[str, Effect] = field(default_factory=dict)
    calls: list[EffectCallRecord] = field(default_factory=list)
    attempts: dict[str, _Attempt] = field(default_factory=dict)

    def fake(self, type: str, answers: Sequence[Answer], *, on_success: str | None,
             on_failure: str | None, max_attempts: int | None) -> Effect:
        base = self.effects.get(type) if type in self.effects else None
        success = on_success or (base.on_success if base else None)
        failure = on_failure or (base.on_failure if base else None)
        if success is None or failure is None:
            raise ConfigurationError(
                f"fake_effect({type!r}): no effect {type!r} is registered in effects=, so "
                "say which messages carry its results: on_success=..., on_failure=...")
        fake = Effect(type, _Fake(answers), success, failure,
                      max_attempts=max_attempts or (base.max_attempts if base else 5))
        self.fakes[type] = fake
        return fake

    def effect_for(self, type: str) -> Effect | None:
        if type in self.fakes:
            return self.fakes[type]
        return self.effects.get(type) if type in self.effects else None

    def execute(self, effect: Effect, call: EffectCall, *, fault: str | None = None) -> Settled:
        """One execution of the entry ``call.idempotency_key`` as the runner's steps 1–4
        do it. ``fault``: ``"fail"`` (this call times out before reaching the resource) or
        ``"lost"`` (the call is made, its answer lost)."""
        att = self.attempts.setdefault(call.idempotency_key, _Attempt())
        if att.final:  # a recorded result: delivered again
            return self._settled(att, "recorded")
        if att.attempts and effect.query is not None:  # an open attempt: ask first
            try:
                found = _invoke(effect.query, with_attempt(call, att.attempts),
                                effect.timeout_s)
            except PermanentEffectError as exc:
                self._record(call, "query", None, exc.reason, text(exc.detail or exc))
                return self._fail(att, exc.reason, text(exc.detail or exc), "query")
            except Exception as exc:
                reason, error = retry_reason(effect, exc, what="query")
                self._record(call, "query", None, reason, error)
                att.last_error = error
                return Settled("retry", att.attempts, answer="query", reason=reason,
                               detail=error)
            self._record(call, "query", found)
            if found is not None:
                return self._succeed(att, effect, call, found, "query")
        if att.attempts >= effect.max_attempts:
            return self._fail(att, Reason.EFFECT_ATTEMPTS_EXHAUSTED,
                              exhausted_error(effect, att.last_error), "exhausted")
        att.attempts += 1
        call = with_attempt(call, att.attempts)
        try:
            if fault == "fail":
                raise TimeoutError("injected fault")
            result = _invoke(effect.call, call, effect.timeout_s)
            if fault == "lost":
                self._record(call, "lost", result)
                raise TimeoutError("injected fault: answer lost")
        except PermanentEffectError as exc:
            self._record(call, "permanent", None, exc.reason, text(exc.detail or exc))
            return self._fail(att, exc.reason, text(exc.detail or exc), "permanent")
        except Exception as exc:
            reason, error = retry_reason(effect, exc)
            label = ("answer lost" if fault == "lost"  # what happened; the runner saw a timeout
                     else "timeout" if isinstance(exc, TimeoutError) else "retryable")
            if fault is None:  # an injected failure: the function was never called
                self._record(call, label, None, reason, error)
            att.last_error = error
            if att.attempts >= effect.max_attempts:
                return self._fail(att, Reason.EFFECT_ATTEMPTS_EXHAUSTED,
                                  exhausted_error(effect, error), label)
            return Settled("retry", att.attempts, answer=label, reason=reason, detail=error)
        self._record(call, "ok", result)
        return self._succeed(att, effect, call, result, "ok")

    def _record(self, call: EffectCall, answer: str, result: Any, reason: str | None = None,
                detail: str | None = None) -> None:
        self.calls.append(EffectCallRecord(call, answer, result if isinstance(result, Mapping)
                                           else None, reason, detail))

    def _succeed(self, att: _Attempt, effect: Effect, call: EffectCall, result: Any,
                 answer: str) -> Settled:
        payload, problem = result_payload({} if result is None else result, effect,
                                          aggregate_type=call.aggregate_type,
                                          aggregate_id=call.aggregate_id)
        if payload is None:
            return self._fail(att, Reason.EFFECT_ERROR, problem or "", answer)
        att.final, att.result = True, payload
        return self._settled(att, answer)

    def _fail(self, att: _Attempt, reason: str, error: str, answer: str) -> Settled:
        att.final, att.failure = True, (reason, error)
        return self._settled(att, answer)

    @staticmethod
    def _settled(att: _Attempt, answer: str) -> Settled:
        if att.failure is not None:
            return Settled("failed", att.attempts, failure=att.failure, answer=answer,
                           reason=att.failure[0], detail=att.failure[1])
        return Settled("ok", att.attempts, result=att.result, answer=answer)


def _invoke(fn: Callable[[EffectCall], Any], call: EffectCall, timeout_s: float) -> Any:
    """Call an effect or query function; an async one runs to completion within
    ``timeout_s`` (in a thread of its own when the caller already runs an event loop, as in
    Jupyter). A sync one is not bounded."""
    result = fn(call)
    if not inspect.isawaitable(result):
        return result

    async def bounded() -> Any:
        return await asyncio.wait_for(result, timeout_s)

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(bounded())
    with ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, bounded()).result()
