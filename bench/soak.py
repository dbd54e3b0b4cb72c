"""Soak of the persistent local server (issue 22): ``aggbox local start``'s mongo-java-server
with H2, in a temporary ``AGGBOX_HOME``, and ``aggbox dispatch`` in stream mode (a subprocess:
``python -m aggbox.commands.dispatch``, JSON Lines publisher) through ``--writes`` writes of
outbox-carrying documents, with ``--cycles`` stops and starts of the server in between.

The writes: the StoreWriter handles one message per write, each emitting one outbox entry,
round robin over ``--docs`` documents of the type ``Emitter`` (collection ``emitters``),
``--batch`` messages per ``process()`` call, as fast as it goes. The dispatcher drains the
outboxes meanwhile.

One run:

1. start the server and the dispatcher; probe (start): ``--probe-rate`` writes/s for
   ``--probe-seconds`` s, and the commit → publish latency of those entries (publish time:
   the UTC stamp in the JSON Lines file's name, taken before it is written; commit time:
   the entry's ``created_at``);
2. ``--cycles`` times: ``--writes`` / ``--cycles`` writes at full speed, wait until every
   outbox is empty, stop the dispatcher (SIGTERM) and the server (``aggbox local stop``),
   start the server again and check that every document and every outbox entry is intact
   (below), start the dispatcher again;
3. probe (end), as in 1, and a last check.

Intact: the script keeps its own count of what it wrote (per document: entries emitted);
every document exists with ``state.emitted`` and ``_seq`` equal to that count, and every
entry ``(document, seq)`` it emitted is either still in the document's outbox or in a
published JSON Lines line (published twice is counted, not an error: delivery is at least
once). Storage errors: lines of the server log with ``MVStoreException`` or
``AGGBOX-STORAGE-ERROR``, plus the server's own count (``aggboxOplogStats``).

Printed per phase: writes/s, entries published/s (from the phase's start until its outboxes
are empty), oplog entries, data file size, storage errors; at the end the start/end ratios
and a JSON line. Nothing is timed-asserted; the exit status is 1 when data is not intact or a
storage error was seen.

Usage: python bench/soak.py [--writes 1000000] [--cycles 4] [--docs 10000] [--batch 500]
       [--probe-rate 200] [--probe-seconds 10]
Environment: ``AGGBOX_LOCAL_OPLOG_*`` (the server's oplog bounds) are passed through.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pymongo import MongoClient

from aggbox.servers import persistent
from aggregates import AggboxSettings, AggregateType, Emit, Handled, Message, Registry, StoreWriter

ROOT = Path(__file__).resolve().parents[1]
COLLECTION = "emitters"
DATABASE = "soak"
_STORAGE_ERROR = re.compile(r"MVStoreException|AGGBOX-STORAGE-ERROR")
_DOC_INDEX_BITS = 32  # (document index << 32) | seq identifies an entry


@dataclass(frozen=True)
class Ticker:
    emitted: int = 0


emitters: AggregateType[Ticker] = AggregateType("Emitter", state=Ticker, collection=COLLECTION,
                                                max_outbox=100_000)


@emitters.handles("Emit")
def _emit(state: Ticker, msg: Message) -> Handled[Ticker]:
    return (replace(state, emitted=state.emitted + 1),
            [Emit("Tick", {"i": state.emitted + 1, "note": "soak entry"})])


registry = Registry([emitters])


@dataclass
class Phase:
    """Figures of one phase (a probe or a bulk cycle)."""

    name: str
    writes: int = 0
    seconds: float = 0.0
    writes_per_s: float = 0.0
    published_per_s: float = 0.0
    latency_p50_ms: float | None = None
    latency_p99_ms: float | None = None
    oplog_entries: int = 0
    file_mb: float = 0.0
    storage_errors: int = 0
    intact: bool | None = None


@dataclass
class SoakResult:
    writes: int = 0
    restarts: int = 0
    phases: list[Phase] = field(default_factory=list)
    checks: list[dict[str, Any]] = field(default_factory=list)
    storage_errors: int = 0
    duplicates: int = 0
    intact: bool = True

    def summary(self) -> dict[str, Any]:
        probes = [p for p in self.phases if p.name.startswith("probe")]
        bulk = [p for p in self.phases if p.name.startswith("cycle")]

        def ratio(a: float | None, b: float | None) -> float | None:
            return round(a / b, 3) if a is not None and b else None

        out: dict[str, Any] = {"writes": self.writes, "restarts": self.restarts,
                               "intact": self.intact, "storage_errors": self.storage_errors,
                               "duplicates": self.duplicates}
        if len(probes) >= 2:
            first, last = probes[0], probes[-1]
            out.update(latency_p50_ms_start=first.latency_p50_ms,
                       latency_p99_ms_start=first.latency_p99_ms,
                       latency_p50_ms_end=last.latency_p50_ms,
                       latency_p99_ms_end=last.latency_p99_ms,
                       latency_p50_end_vs_start=ratio(last.latency_p50_ms, first.latency_p50_ms),
                       latency_p99_end_vs_start=ratio(last.latency_p99_ms, first.latency_p99_ms))
        if bulk:
            first, last = bulk[0], bulk[-1]
            out.update(published_per_s_first=first.published_per_s,
                       published_per_s_last=last.published_per_s,
                       published_per_s_last_vs_first=ratio(last.published_per_s,
                                                           first.published_per_s),
                       writes_per_s_first=first.writes_per_s, writes_per_s_last=last.writes_per_s,
                       oplog_entries_end=last.oplog_entries, file_mb_end=last.file_mb)
        return out


class Soak:
    """One soak run in ``home`` (its ``AGGBOX_HOME``); see the module's docstring."""

    def __init__(self, home: Path, *, docs: int = 10_000, batch: int = 500,
                 echo: bool = True) -> None:
        self.home = home
        self.docs = [f"agg-{i:06d}" for i in range(docs)]
        self.batch = batch
        self.echo = echo
        self.jsonl_dir = home / "published"
        self.expected = [0] * docs  # entries emitted per document, by this script's count
        self.published: set[int] = set()
        self.publish_ms: dict[int, float] = {}  # probe entries: publish time (epoch ms)
        self.created_ms: dict[int, float] = {}  # probe entries: created_at (epoch ms)
        self.duplicates = 0
        self.seen_files: set[str] = set()
        self.next_doc = 0
        self.message_seq = 0
        self.uri = ""
        self.client: MongoClient[dict[str, Any]] | None = None
        self.dispatcher: subprocess.Popen[bytes] | None = None
        self.writer: StoreWriter | None = None
        self.result = SoakResult()
        self._env_saved: str | None = None

    # ---- processes -------------------------------------------------------------------------

    def _say(self, text: str) -> None:
        if self.echo:
            print(text, flush=True)

    def start_server(self) -> None:
        state, _started = persistent.start_persistent_mongodb()
        self.uri = state.uri
        self.client = MongoClient(self.uri, tz_aware=True)
        db = self.client[DATABASE]
        self.writer = StoreWriter(db, registry, settings=AggboxSettings.load(database=DATABASE))
        self.writer.ensure_indexes()

    def stop_server(self) -> None:
        if self.client is not None:
            self.client.close()
            self.client = None
        persistent.stop_persistent_mongodb()

    def start_dispatcher(self) -> None:
        env = {**os.environ, "AGGBOX_MONGODB_URI": self.uri, "AGGBOX_DATABASE": DATABASE}
        log = open(self.home / "dispatcher.log", "ab")  # noqa: SIM115 - kept by the child
        self.dispatcher = subprocess.Popen(
            [sys.executable, "-m", "aggbox.commands.dispatch", "--log-level", "WARNING",
             "--collection", COLLECTION, "--publisher", "jsonl", "--jsonl-dir",
             str(self.jsonl_dir), "--mode", "stream", "--metrics-port", "0"],
            cwd=ROOT, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
        log.close()

    def stop_dispatcher(self) -> None:
        proc, self.dispatcher = self.dispatcher, None
        if proc is None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=30)

    @contextlib.contextmanager
    def running(self) -> Iterator[Soak]:
        saved = os.environ.get("AGGBOX_HOME")
        os.environ["AGGBOX_HOME"] = str(self.home)
        try:
            self.start_server()
            self.start_dispatcher()
            yield self
        finally:
            self.stop_dispatcher()
            with contextlib.suppress(Exception):
                self.stop_server()
            if saved is None:
                os.environ.pop("AGGBOX_HOME", None)
            else:
                os.environ["AGGBOX_HOME"] = saved

    # ---- writes ----------------------------------------------------------------------------

    def write(self, n: int) -> list[int]:
        """``n`` writes (``batch`` per call); the keys of the entries emitted."""
        assert self.writer is not None
        keys: list[int] = []
        while n > 0:
            size = min(n, self.batch)
            msgs = []
            chosen = []
            for _ in range(size):
                index = self.next_doc
                self.next_doc = (self.next_doc + 1) % len(self.docs)
                self.message_seq += 1
                chosen.append(index)
                msgs.append(Message(message_id=f"m{self.message_seq}", type="Emit",
                                    aggregate_type="Emitter", aggregate_id=self.docs[index],
                                    payload={}))
            outcomes = self.writer.process(msgs)
            for index, outcome in zip(chosen, outcomes, strict=True):
                if len(outcome.emitted_ids) != 1:
                    raise RuntimeError(f"write for {self.docs[index]}: {outcome}")
                self.expected[index] += 1
                keys.append((index << _DOC_INDEX_BITS) | self.expected[index])
            n -= size
            self.result.writes += size
        return keys

    # ---- what was published ----------------------------------------------------------------

    def read_published(self, probe: set[int] | None = None) -> None:
        """Read the JSON Lines files not read yet."""
        if not self.jsonl_dir.exists():
            return
        for path in sorted(self.jsonl_dir.glob("*.jsonl")):
            if path.name.startswith(".") or path.name in self.seen_files:
                continue
            self.seen_files.add(path.name)
            stamp = datetime.strptime(path.name.split("-", 1)[0], "%Y%m%dT%H%M%S%fZ")
            published_ms = stamp.replace(tzinfo=UTC).timestamp() * 1000
            for line in path.read_bytes().splitlines():
                if not line:
                    continue
                env = json.loads(line)
                source = env["source"]
                index = int(str(source["id"]).rsplit("-", 1)[1])
                key = (index << _DOC_INDEX_BITS) | int(source["seq"])
                if key in self.published:
                    self.duplicates += 1
                    continue
                self.published.add(key)
                if probe is not None and key in probe:
                    self.publish_ms[key] = published_ms
                    created = datetime.fromisoformat(env["occurred_at"].replace("Z", "+00:00"))
                    self.created_ms[key] = created.timestamp() * 1000

    def pending_documents(self) -> int:
        assert self.client is not None
        return self.client[DATABASE][COLLECTION].count_documents({"outbox.0": {"$exists": True}})

    def wait_drained(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.pending_documents() == 0:
                return True
            if self.dispatcher is not None and self.dispatcher.poll() is not None:
                raise RuntimeError(f"the dispatcher exited ({self.dispatcher.returncode}); "
                                   f"log: {self.home / 'dispatcher.log'}")
            time.sleep(0.5)
        return False

    # ---- checks ----------------------------------------------------------------------------

    def storage_errors(self) -> int:
        log = persistent.data_dir() / "server.log"
        in_log = 0
        if log.exists():
            in_log = sum(1 for line in log.read_text(errors="replace").splitlines()
                         if _STORAGE_ERROR.search(line))
        return in_log

    def server_stats(self) -> dict[str, Any]:
        assert self.client is not None
        stats: dict[str, Any] = self.client.admin.command("aggboxOplogStats")
        return stats

    def check_intact(self, label: str) -> bool:
        """Every document and every entry the script wrote is in the store or published."""
        assert self.client is not None
        self.read_published()
        coll = self.client[DATABASE][COLLECTION]
        seen_docs = 0
        bad_docs: list[str] = []
        pending: set[int] = set()
        for doc in coll.find({}, {"state": 1, "_seq": 1, "outbox.source": 1}):
            seen_docs += 1
            index = int(str(doc["_id"]).rsplit("-", 1)[1])
            want = self.expected[index]
            if doc.get("state", {}).get("emitted") != want or doc.get("_seq") != want:
                bad_docs.append(f"{doc['_id']}: state {doc.get('state')}, _seq "
                                f"{doc.get('_seq')}, expected {want}")
            for entry in doc.get("outbox", []):
                pending.add((index << _DOC_INDEX_BITS) | int(entry["source"]["seq"]))
        wanted_docs = sum(1 for n in self.expected if n > 0)
        missing = 0
        for index, n in enumerate(self.expected):
            for seq in range(1, n + 1):
                key = (index << _DOC_INDEX_BITS) | seq
                if key not in self.published and key not in pending:
                    missing += 1
        ok = not bad_docs and seen_docs == wanted_docs and missing == 0
        check = {"at": label, "documents": seen_docs, "documents_expected": wanted_docs,
                 "documents_wrong": len(bad_docs), "entries_expected": sum(self.expected),
                 "entries_published": len(self.published), "entries_pending": len(pending),
                 "entries_missing": missing, "duplicates": self.duplicates, "intact": ok}
        self.result.checks.append(check)
        self.result.intact = self.result.intact and ok
        self._say(f"  check {label}: {seen_docs:,}/{wanted_docs:,} documents "
                  f"({len(bad_docs)} wrong), {check['entries_expected']:,} entries: "
                  f"{len(self.published):,} published, {len(pending):,} pending, {missing} "
                  f"missing, {self.duplicates} published twice -> "
                  f"{'intact' if ok else 'NOT INTACT'}")
        for line in bad_docs[:5]:
            self._say(f"    {line}")
        return ok

    # ---- phases ----------------------------------------------------------------------------

    def _phase_figures(self, phase: Phase) -> Phase:
        stats = self.server_stats()
        phase.oplog_entries = int(stats.get("entries", 0))
        phase.file_mb = round(int(stats.get("fileBytes", 0)) / 1e6, 1)
        phase.storage_errors = self.storage_errors() + int(stats.get("storageErrors", 0))
        self.result.storage_errors = max(self.result.storage_errors, phase.storage_errors)
        self.result.phases.append(phase)
        return phase

    def probe(self, name: str, rate: float, seconds: float, timeout: float) -> Phase:
        """``rate`` writes/s for ``seconds``; their commit → publish latency."""
        self.write(min(10, len(self.docs)))  # warm-up: the dispatcher is up and publishing
        self.wait_drained(timeout)
        keys: set[int] = set()
        per_tick = max(1, int(rate / 10))
        ticks = max(1, int(seconds * 10))
        start = time.monotonic()
        for tick in range(ticks):
            keys.update(self.write(per_tick))
            delay = start + (tick + 1) / 10 - time.monotonic()
            if delay > 0:
                time.sleep(delay)
        took = time.monotonic() - start
        drained = self.wait_drained(timeout)
        self.read_published(probe=keys)
        latencies = sorted(self.publish_ms[k] - self.created_ms[k] for k in keys
                           if k in self.publish_ms)
        phase = Phase(name, writes=len(keys), seconds=round(took, 1),
                      writes_per_s=round(len(keys) / took, 1))
        if latencies:
            phase.latency_p50_ms = round(latencies[len(latencies) // 2], 1)
            phase.latency_p99_ms = round(latencies[min(len(latencies) - 1,
                                                       int(len(latencies) * 0.99))], 1)
        self._phase_figures(phase)
        self._say(f"  {name}: {len(keys):,} writes at {phase.writes_per_s:g}/s, "
                  f"{len(latencies):,} published{'' if drained else ' (NOT drained)'}: "
                  f"latency p50 {phase.latency_p50_ms} ms, p99 {phase.latency_p99_ms} ms; "
                  f"oplog {phase.oplog_entries:,} entries, file {phase.file_mb:g} MB, "
                  f"storage errors {phase.storage_errors}")
        return phase

    def bulk(self, name: str, writes: int, timeout: float) -> Phase:
        """``writes`` writes at full speed, then until every outbox is empty."""
        self.read_published()
        published_before = len(self.published)
        start = time.monotonic()
        self.write(writes)
        wrote = time.monotonic() - start
        drained = self.wait_drained(timeout)
        took = time.monotonic() - start
        self.read_published()
        phase = Phase(name, writes=writes, seconds=round(took, 1),
                      writes_per_s=round(writes / wrote, 1),
                      published_per_s=round((len(self.published) - published_before) / took, 1))
        self._phase_figures(phase)
        self._say(f"  {name}: {writes:,} writes at {phase.writes_per_s:g}/s, published "
                  f"{phase.published_per_s:g}/s over {took:.0f} s"
                  f"{'' if drained else ' (NOT drained)'}; oplog {phase.oplog_entries:,} "
                  f"entries, file {phase.file_mb:g} MB, storage errors {phase.storage_errors}")
        return phase

    def restart(self, label: str) -> bool:
        """Stop the dispatcher and the server, start the server, check, start the dispatcher."""
        self.stop_dispatcher()
        self.stop_server()
        self.start_server()
        self.result.restarts += 1
        ok = self.check_intact(label)
        self.result.phases[-1].intact = ok
        self.start_dispatcher()
        return ok


def run_soak(home: Path, *, writes: int, cycles: int = 4, docs: int = 10_000, batch: int = 500,
             probe_rate: float = 200.0, probe_seconds: float = 10.0,
             drain_timeout: float = 3600.0, echo: bool = True) -> SoakResult:
    """One soak run in ``home`` (an empty directory); see the module's docstring."""
    soak = Soak(home, docs=docs, batch=batch, echo=echo)
    per_cycle = [writes // cycles + (1 if i < writes % cycles else 0) for i in range(cycles)]
    with soak.running():
        soak.probe("probe (start)", probe_rate, probe_seconds, drain_timeout)
        for i, n in enumerate(per_cycle, 1):
            soak.bulk(f"cycle {i}", n, drain_timeout)
            soak.restart(f"restart {i}")
        soak.probe("probe (end)", probe_rate, probe_seconds, drain_timeout)
        soak.wait_drained(drain_timeout)
        soak.check_intact("end")
        soak.result.storage_errors = max(soak.result.storage_errors, soak.storage_errors())
    soak.result.duplicates = soak.duplicates
    return soak.result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--writes", type=int, default=1_000_000)
    ap.add_argument("--cycles", type=int, default=4, help="server stops and starts")
    ap.add_argument("--docs", type=int, default=10_000)
    ap.add_argument("--batch", type=int, default=500, help="messages per StoreWriter call")
    ap.add_argument("--probe-rate", type=float, default=200.0, help="writes/s of the probes")
    ap.add_argument("--probe-seconds", type=float, default=10.0)
    ap.add_argument("--keep", action="store_true", help="keep the temporary AGGBOX_HOME")
    args = ap.parse_args(argv)
    home = Path(tempfile.mkdtemp(prefix="aggbox-soak-"))
    print(f"AGGBOX_HOME {home}; {args.writes:,} writes over {args.docs:,} documents, "
          f"{args.cycles} server restarts; oplog bounds: "
          f"{' '.join(persistent.oplog_options())}", flush=True)
    began = time.monotonic()
    try:
        result = run_soak(home, writes=args.writes, cycles=args.cycles, docs=args.docs,
                          batch=args.batch, probe_rate=args.probe_rate,
                          probe_seconds=args.probe_seconds)
    finally:
        if not args.keep:
            import shutil

            shutil.rmtree(home, ignore_errors=True)
    summary = result.summary()
    summary["seconds"] = round(time.monotonic() - began)
    print(json.dumps({**summary, "phases": [asdict(p) for p in result.phases],
                      "checks": result.checks}))
    return 0 if result.intact and result.storage_errors == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
