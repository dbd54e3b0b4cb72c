"""Load on the persistent local server's H2 store: writes, change-stream reads and collection
scans at once, until a storage error or the time is up (issue 22).

    python bench/h2_chunks.py                    # aggbox's launcher (AggboxMongoH2Server)
    python bench/h2_chunks.py --stock            # mongo-java-server's own oplog and H2 setup
    python bench/h2_chunks.py --minutes 3 --writers 2
    python bench/h2_chunks.py --bare [--guard]   # H2 alone, no mongo-java-server

``--stock`` runs the launcher as it was before issue 22: ``new H2Backend(file)`` and
``server.enableOplog()``, nothing else (its source is below, compiled into a temporary
directory). Without it, the launcher of ``aggbox local start`` is run with its defaults.

Load: ``--writers`` threads insert documents in batches of 100 and update one in ten of them
(``$set`` of an outbox), one thread reads a change stream as the dispatcher does
(``updateLookup``, ``try_next``, a pause after an empty read), one thread reads the whole
collection every few seconds (a sweep). Printed every 15 s: oplog entries, documents, the
change-stream read latency (p50/p99 over the last interval), the data file's size, and the
storage errors (``MVStoreException`` in the server's log, and errors returned to the clients).
The run stops at the first storage error. Nothing is asserted: figures are printed.

``--bare`` shows the mechanism in H2 alone (``MVStore.open(file)``, H2's defaults): a map of
200,000 entries of ~300 bytes, one thread appending, updating and trimming it, another
scanning it whole again and again (a pause of 1 ms every 500 entries: a scan of some
seconds, like mongo-java-server reading its oplog), for ``--minutes``; with ``--guard``
each scan runs between ``registerVersionUsage()`` and ``deregisterVersionUsage()``, as
aggbox's launcher does for every request. Printed: full scans, ``MVStoreException``s
("Chunk N not found") and the file's size.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from common import quantile
from pymongo import MongoClient
from pymongo.errors import AutoReconnect, PyMongoError

from aggbox.servers import _process, maven

_STOCK_LAUNCHER = """
import de.bwaldvogel.mongo.MongoServer;
import de.bwaldvogel.mongo.MongoVersion;
import de.bwaldvogel.mongo.backend.h2.H2Backend;
import java.util.List;

public final class StockMongoH2Server {
    public static void main(String[] args) throws Exception {
        H2Backend backend = new H2Backend(args[1]);
        backend.version(new MongoVersion() {
            public List<Integer> getVersionArray() { return List.of(5, 0, 0); }
            public int getWireVersion() { return 13; }
        });
        MongoServer server = new MongoServer(backend);
        server.enableOplog();
        server.bind("127.0.0.1", Integer.parseInt(args[0]));
        Runtime.getRuntime().addShutdownHook(new Thread(server::shutdown));
        System.out.println("AGGBOX-MJS READY");
        System.out.flush();
        Thread.currentThread().join();
    }
}
"""


_BARE_REPRO = r"""
import org.h2.mvstore.MVMap;
import org.h2.mvstore.MVStore;
import org.h2.mvstore.MVStoreException;
import java.util.Iterator;
import java.util.Map;
import java.util.Random;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.concurrent.atomic.AtomicLong;

/** args: <file> <guard: true|false> <seconds> <entries> <scanPauseEvery> */
public final class H2ChunkRepro {
    public static void main(String[] args) throws Exception {
        String file = args[0];
        boolean guard = Boolean.parseBoolean(args[1]);
        long seconds = Long.parseLong(args[2]);
        int entries = Integer.parseInt(args[3]);
        int pauseEvery = Integer.parseInt(args[4]);
        MVStore store = MVStore.open(file);
        MVMap<Long, String> map = store.openMap("m");
        String pad = "x".repeat(300);
        for (long i = 0; i < entries; i++) map.put(i, pad + i);
        store.commit();
        AtomicBoolean stop = new AtomicBoolean();
        AtomicLong writes = new AtomicLong(), scans = new AtomicLong(), errors = new AtomicLong();
        Thread writer = new Thread(() -> {
            Random r = new Random(1);
            long next = entries;
            while (!stop.get()) {
                map.put(next++, pad);                                   // append (like the oplog)
                map.put((long) r.nextInt(entries), pad + r.nextInt());  // update in place
                if (r.nextInt(4) == 0) map.remove(next - entries);      // trim the head
                writes.incrementAndGet();
            }
        });
        Thread reader = new Thread(() -> {
            while (!stop.get()) {
                MVStore.TxCounter usage = guard ? store.registerVersionUsage() : null;
                try {
                    long n = 0;
                    Iterator<Map.Entry<Long, String>> it = map.entrySet().iterator();
                    while (it.hasNext() && !stop.get()) {
                        it.next();
                        if (++n % pauseEvery == 0) Thread.sleep(1);
                    }
                    scans.incrementAndGet();
                } catch (MVStoreException e) {
                    if (errors.incrementAndGet() <= 3) System.out.println("  " + e);
                } catch (InterruptedException e) {
                    return;
                } finally {
                    if (usage != null) store.deregisterVersionUsage(usage);
                }
            }
        });
        long t0 = System.currentTimeMillis();
        writer.start(); reader.start();
        Thread.sleep(seconds * 1000);
        stop.set(true);
        writer.join(); reader.join();
        System.out.printf(
            "guard=%s: %d s, %,d writes, %d full scans, %d MVStoreExceptions, file %.0f MB%n",
            guard, (System.currentTimeMillis() - t0) / 1000, writes.get(), scans.get(),
            errors.get(), store.getFileStore().size() / 1e6);
        store.close();
    }
}
"""


def _bare(guard: bool, minutes: float) -> int:
    jars = maven.resolve_classpath("mongo-java-server-h2")
    h2 = [j for j in jars if "h2database" in j.name]
    with tempfile.TemporaryDirectory(prefix="aggbox-h2-bare-") as tmp:
        work = Path(tmp)
        (work / "H2ChunkRepro.java").write_text(_BARE_REPRO, encoding="utf-8")
        subprocess.run([maven.javac_executable(), "-nowarn", "-cp", maven.classpath_string(h2),
                        "-d", str(work), str(work / "H2ChunkRepro.java")], check=True)
        return subprocess.run(
            [maven.java_executable(), "-cp", maven.classpath_string([work, *h2]),
             "H2ChunkRepro", str(work / "bare.mv"), "true" if guard else "false",
             str(int(minutes * 60)), "200000", "500"], check=False).returncode


def _start(stock: bool, work: Path) -> tuple[subprocess.Popen[bytes], str, Path]:
    jars = maven.resolve_classpath("mongo-java-server-h2")
    if stock:
        src = work / "StockMongoH2Server.java"
        src.write_text(_STOCK_LAUNCHER, encoding="utf-8")
        classes = work / "classes"
        subprocess.run([maven.javac_executable(), "-nowarn", "-cp", maven.classpath_string(jars),
                        "-d", str(classes), str(src)], check=True)
        launcher = "StockMongoH2Server"
        extra: list[str] = []
    else:
        from aggbox.servers import persistent

        classes = maven.compile_java("h2server", jars)  # aggbox/servers/java/h2server/
        launcher = "AggboxMongoH2Server"
        extra = persistent.oplog_options()
    port = _process.free_port()
    data = work / "aggbox.mv"
    log_path = work / "server.log"
    argv = [maven.java_executable(), "-XX:+UseParallelGC",
            "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn", "-cp",
            maven.classpath_string([classes, *jars]), launcher, str(port), str(data), *extra]
    log = open(log_path, "ab")  # noqa: SIM115 - closed with the process
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 60
    while b"AGGBOX-MJS READY" not in log_path.read_bytes():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"server did not start:\n{log_path.read_text()[-2000:]}")
        time.sleep(0.1)
    return proc, f"mongodb://127.0.0.1:{port}/?directConnection=true", log_path


class Load:
    def __init__(self, uri: str, stock: bool) -> None:
        self.uri = uri
        self.stock = stock
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.inserted = 0
        self.read_latencies: list[float] = []
        self.events = 0
        self.client_errors: list[str] = []
        self.stalls = 0  # operations cut off by the client (pool cleared: the server stalled)

    def _error(self, where: str, exc: BaseException) -> None:
        with self.lock:
            self.client_errors.append(f"{where}: {exc}")
        self.stop.set()

    def writer(self, index: int) -> None:
        client: MongoClient[dict[str, Any]] = MongoClient(self.uri)
        coll = client.bench.docs
        n = 0
        payload = "x" * 300
        try:
            while not self.stop.is_set():
                docs = [{"_id": f"w{index}-{n + i}", "v": 1, "pad": payload} for i in range(100)]
                try:
                    coll.insert_many(docs, ordered=False)
                    for i in range(0, 100, 10):
                        coll.update_one({"_id": f"w{index}-{n + i}"},
                                        {"$set": {"v": 2, "outbox": [{"id": f"o{index}-{n + i}"}]}})
                except AutoReconnect:
                    with self.lock:
                        self.stalls += 1
                n += 100
                with self.lock:
                    self.inserted += 100
        except PyMongoError as exc:
            self._error(f"writer {index}", exc)
        finally:
            client.close()

    def reader(self) -> None:
        client: MongoClient[dict[str, Any]] = MongoClient(self.uri)
        coll = client.bench.docs
        try:
            start = client.admin.command("isMaster")["localTime"]
            from bson import Timestamp

            with coll.watch([{"$match": {"operationType": {"$in": ["insert", "update"]},
                                         "fullDocument.outbox": {"$exists": True}}}],
                            full_document="updateLookup", batch_size=500,
                            start_at_operation_time=Timestamp(int(start.timestamp()), 0)) as stream:
                while not self.stop.is_set():
                    t0 = time.perf_counter()
                    event = stream.try_next()
                    with self.lock:
                        self.read_latencies.append(time.perf_counter() - t0)
                        if event is not None:
                            self.events += 1
                    if event is None:
                        time.sleep(0.05)
        except PyMongoError as exc:
            self._error("change stream", exc)
        finally:
            client.close()

    def sweeper(self) -> None:
        client: MongoClient[dict[str, Any]] = MongoClient(self.uri)
        coll = client.bench.docs
        try:
            while not self.stop.is_set():
                try:
                    for _doc in coll.find({"outbox": {"$exists": True}}, batch_size=1000):
                        pass
                except AutoReconnect:
                    with self.lock:
                        self.stalls += 1
                self.stop.wait(5)
        except PyMongoError as exc:
            self._error("sweep", exc)
        finally:
            client.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--stock", action="store_true",
                        help="mongo-java-server's own oplog and H2 setup (before issue 22)")
    parser.add_argument("--minutes", type=float, default=8.0)
    parser.add_argument("--writers", type=int, default=2)
    parser.add_argument("--interval", type=float, default=15.0,
                        help="seconds between printed lines (the smoke run: 1)")
    parser.add_argument("--bare", action="store_true", help="H2 alone (see above)")
    parser.add_argument("--guard", action="store_true",
                        help="with --bare: register the version for each scan")
    args = parser.parse_args(argv)
    if args.bare:
        return _bare(args.guard, args.minutes)

    with tempfile.TemporaryDirectory(prefix="aggbox-h2-") as tmp:
        work = Path(tmp)
        proc, uri, log_path = _start(args.stock, work)
        load = Load(uri, args.stock)
        threads = [threading.Thread(target=load.writer, args=(i,), daemon=True)
                   for i in range(args.writers)]
        threads += [threading.Thread(target=load.reader, daemon=True),
                    threading.Thread(target=load.sweeper, daemon=True)]
        admin: MongoClient[dict[str, Any]] = MongoClient(uri)
        print(f"launcher: {'stock mongo-java-server 1.47 + H2' if args.stock else 'aggbox'}; "
              f"{args.writers} writers, 1 change stream, 1 sweep; up to {args.minutes:g} min")
        began = time.monotonic()
        for t in threads:
            t.start()
        storage_errors = 0
        try:
            while not load.stop.is_set() and time.monotonic() - began < args.minutes * 60:
                load.stop.wait(args.interval)
                log_text = log_path.read_text(errors="replace")
                storage_errors = log_text.count("MVStoreException")
                try:
                    if args.stock:
                        entries = admin.local["oplog.rs"].estimated_document_count()
                    else:
                        entries = admin.admin.command("aggboxOplogStats")["entries"]
                except AutoReconnect:
                    entries = -1  # the server stalled past pymongo's heartbeat: not counted
                    with load.lock:
                        load.stalls += 1
                with load.lock:
                    lat, load.read_latencies = load.read_latencies, []
                    inserted, events = load.inserted, load.events
                print(f"{time.monotonic() - began:6.0f} s  oplog {entries:>8,}  docs {inserted:>8,}"
                      f"  events {events:>7,}  read p50 {quantile(lat, 0.5) * 1000:8.1f} ms"
                      f"  p99 {quantile(lat, 0.99) * 1000:8.1f} ms"
                      f"  max {max(lat, default=float('nan')) * 1000:8.1f} ms  reads {len(lat):>5}"
                      f"  file {(work / 'aggbox.mv').stat().st_size / 1e6:7.1f} MB"
                      f"  storage errors {storage_errors}", flush=True)
                if storage_errors:
                    load.stop.set()
        finally:
            load.stop.set()
            for t in threads:
                t.join(timeout=60)
            admin.close()
            proc.terminate()
            proc.wait(timeout=60)
        for err in load.client_errors:
            print(f"client error: {err[:300]}")
        if storage_errors:
            lines = [line for line in log_path.read_text(errors="replace").splitlines()
                     if "MVStoreException" in line]
            print("first storage errors in the server log:")
            for line in lines[:5]:
                print("  " + line[:300])
        print(f"result: {storage_errors} storage errors in the server log, "
              f"{len(load.client_errors)} client errors, {load.stalls} operations cut off "
              f"by a stall (pymongo AutoReconnect, retried), after "
              f"{time.monotonic() - began:.0f} s")
        if os.environ.get("H2_CHUNKS_KEEP_LOG"):
            Path(os.environ["H2_CHUNKS_KEEP_LOG"]).write_bytes(log_path.read_bytes())
    return 0


if __name__ == "__main__":
    sys.exit(main())
