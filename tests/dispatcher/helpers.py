"""Helpers of the dispatcher tests: writing outbox entries through the real writer, reading
what was published, running the dispatcher in-process or as a subprocess."""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections import defaultdict
from collections.abc import Awaitable, Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from pymongo.database import Database

from aggregates import Message, StoreWriter
from dispatcher.core.settings import DispatcherSettings
from dispatcher.core.timing import Timing
from dispatcher.daemon import Dispatcher
from dispatcher.publishers.base import PublishResult
from dispatcher.publishers.record import OutboundRecord

ROOT = Path(__file__).resolve().parents[2]
_seq = itertools.count(1)


def emit(writer: StoreWriter, docs: Iterable[str], *, n: int = 1, rounds: int = 1,
         **payload: Any) -> dict[str, list[str]]:
    """Each document handles ``rounds`` Emit messages of ``n`` entries. Returns the emitted
    ids per document, in emission order."""
    docs = list(docs)
    msgs = [
        Message(message_id=f"in-{next(_seq)}", type="Emit", aggregate_type="Emitter",
                aggregate_id=d, payload={"n": n, **payload})
        for _ in range(rounds) for d in docs
    ]
    out: dict[str, list[str]] = defaultdict(list)
    for o in writer.process(msgs):
        assert o.outcome == "applied", o
        out[o.aggregate_id].extend(o.emitted_ids)
    return dict(out)


def merge(*emitted: dict[str, list[str]]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = defaultdict(list)
    for e in emitted:
        for k, v in e.items():
            out[k].extend(v)
    return dict(out)


def quick_settings(domain: str, **over: Any) -> DispatcherSettings:
    """Dispatcher settings for in-process tests of ``domain`` (an aggregates module): no
    metrics server, short pauses and backoffs; ``over`` replaces any of them."""
    base: dict[str, Any] = dict(
        aggregates=domain, metrics_port=0, pacing_ms=10, poll_interval_ms=50, lease_ttl_s=3,
        backoff_initial_ms=20, backoff_max_ms=100, sweep_interval_s=30, once_timeout_s=30)
    return DispatcherSettings.load(**{**base, **over})


def pending_entries(db: Database[Any], collection: str = "emitters") -> int:
    return sum(len(d.get("outbox") or []) for d in db[collection].find({}, {"outbox": 1}))


def jsonl_envelopes(directory: Path) -> list[dict[str, Any]]:
    """Every envelope written by the JSON Lines publisher, in file (= time) order (hidden
    ``.tmp-*`` files are not output)."""
    out: list[dict[str, Any]] = []
    for f in sorted(directory.glob("*.jsonl")):
        if f.name.startswith("."):
            continue
        out.extend(json.loads(line) for line in f.read_text().splitlines() if line)
    return out


def check_delivery(published: Sequence[tuple[str, str, int]],
                   emitted: dict[str, list[str]]) -> dict[str, int]:
    """``published`` = (aggregate id, message id, seq) in consumption order. Asserts: every
    emitted id arrived at least once; nothing else arrived; per aggregate the first
    occurrences are in emission order. Returns counts (``duplicates`` = extra copies)."""
    expected = {mid for ids in emitted.values() for mid in ids}
    seen: set[str] = set()
    first_order: dict[str, list[str]] = defaultdict(list)
    dups = 0
    for agg, mid, _seq in published:
        assert mid in expected, f"unexpected message {mid} from {agg}"
        if mid in seen:
            dups += 1
            continue
        seen.add(mid)
        first_order[agg].append(mid)
    missing = expected - seen
    assert not missing, f"{len(missing)} entries never published, e.g. {sorted(missing)[:3]}"
    for agg, ids in emitted.items():
        assert first_order[agg] == ids, f"order of {agg} differs from emission order"
    return {"published": len(published), "distinct": len(seen), "duplicates": dups}


class ListPublisher:
    """An in-memory publisher (implements the interface; for cycle-logic tests). ``fail``
    decides per record: None (ok) or a PublishResult."""

    name = "list"

    def __init__(self, fail: Callable[[OutboundRecord], PublishResult | None] | None = None,
                 *, delay: float = 0.0) -> None:
        self.records: list[OutboundRecord] = []
        self.calls = 0
        self.fail = fail
        self.delay = delay  # seconds "at the broker" per call

    async def start(self) -> None:
        return None

    async def publish(self, records: Sequence[OutboundRecord]) -> list[PublishResult]:
        self.calls += 1
        if self.delay:
            await asyncio.sleep(self.delay)
        out = []
        failed_keys: set[str] = set()
        for r in records:
            res = self.fail(r) if self.fail else None
            if res is None and r.key in failed_keys:
                # the publisher contract: keep a key's order, do not deliver past a failure
                res = PublishResult.retryable("an earlier record of this key failed")
            if res is None:
                self.records.append(r)
                res = PublishResult.ok()
            elif res.status == "retryable":
                failed_keys.add(r.key)
            out.append(res)
        return out

    def delivered(self) -> list[tuple[str, str, int]]:
        return [(r.document_id, r.message_id, r.message.source.seq if r.message.source else 0)
                for r in self.records]

    async def close(self) -> None:
        return None


def _guard(timeout: float) -> float:
    """The hang guard for a wait expected to take ``timeout``: four times it, at least a
    minute. A wait that succeeds returns as soon as its condition holds, so the guard costs
    nothing unless something is really stuck."""
    return max(4 * timeout, 60.0)


async def wait_for(predicate: Callable[[], bool | Awaitable[bool]], timeout: float = 30.0,
                   what: str = "condition") -> None:
    """Wait until ``predicate`` holds. ``timeout`` is what the condition takes on an idle
    machine; the wait gives up only after :func:`_guard` of it — a hang guard, not a time
    limit a correct run can trip on a busy laptop (lease rounds, heartbeats and the server
    all share two cores with the rest of the suite)."""
    timeout = _guard(timeout)
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if not isinstance(value, bool):
            value = await value
        if value:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(0.02)


def wait_sync(predicate: Callable[[], bool], timeout: float = 30.0, what: str = "condition"
              ) -> None:
    """:func:`wait_for` for threads: gives up after :func:`_guard` of ``timeout``."""
    timeout = _guard(timeout)
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.05)


async def run_while(dispatcher: Dispatcher, body: Callable[[], Awaitable[Any]]) -> Any:
    """Run ``dispatcher`` in the background while ``body`` runs; stop it gracefully after
    and assert it exited with 0."""
    task = asyncio.create_task(dispatcher.run())
    try:
        await asyncio.wait_for(dispatcher.started.wait(), 30)
        result = await body()
    finally:
        dispatcher.request_stop()
        rc = await asyncio.wait_for(task, 60)
    assert rc == 0
    return result


def spawn(args: Sequence[str], *, mongodb_uri: str, database: str, log: Path,
          fault: str | None = None, extra_env: dict[str, str] | None = None
          ) -> subprocess.Popen[bytes]:
    """``python -m aggbox.commands.dispatch ARGS`` against the test database, output into
    ``log``; with ``fault``, through the test-only entry point that injects those fault
    rules (:mod:`tests.dispatcher.faultrun`)."""
    env = dict(os.environ)
    env.update({"AGGBOX_MONGODB_URI": mongodb_uri, "AGGBOX_DATABASE": database,
                "PYTHONUNBUFFERED": "1"})
    env.update(extra_env or {})
    fh = open(log, "ab")  # noqa: SIM115 - the child owns it
    entry = ["tests.dispatcher.faultrun", fault] if fault else ["aggbox.commands.dispatch"]
    command = [sys.executable, "-m", *entry, *args]
    return subprocess.Popen(command, cwd=ROOT, env=env,
                            stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)


class FakeTime:
    """Injected time (:class:`dispatcher.core.timing.Timing`) for deterministic tests: the clock
    moves only when the dispatcher pauses; each pause is recorded. After ``hold_after``
    pauses the next one blocks until :meth:`release` — the worker is then parked at a known
    point, and what it did so far can be asserted exactly."""

    def __init__(self, *, random: float = 0.5, hold_after: int | None = None) -> None:
        self.now = 1000.0
        self.sleeps: list[float] = []
        self.hold_after = hold_after
        self.held = asyncio.Event()
        self._go = asyncio.Event()
        self.timing = Timing(monotonic=lambda: self.now, sleep=self.sleep,
                             random=lambda: random)

    async def sleep(self, seconds: float) -> None:
        if self.hold_after is not None and len(self.sleeps) >= self.hold_after:
            self.held.set()
            await self._go.wait()
        self.sleeps.append(seconds)
        self.now += seconds
        await asyncio.sleep(0.001)  # let the rest of the program (and the server) move on

    def release(self) -> None:
        self.hold_after = None
        self._go.set()


# -- processes and ports ---------------------------------------------------------------------
def dead_port() -> int:
    """A loopback port where nothing listens (bound, then closed)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def healthz(port: int | None) -> tuple[int, dict[str, Any]]:
    """``/healthz`` of a dispatcher: (status, body)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def run_once(*args: str, env: dict[str, str], timeout: float
             ) -> tuple[subprocess.CompletedProcess[bytes], float]:
    """``aggbox dispatch --once ARGS`` as a process: (the finished process, seconds)."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", **env}
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "aggbox.commands.dispatch", "--once", *args],
                          cwd=ROOT, env=env, capture_output=True, timeout=timeout, check=False)
    return done, time.monotonic() - started
