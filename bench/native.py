"""The native core against the pure path: instructions (callgrind) and wall time of the id
and hash calls and of the writer's components, ``AGGBOX_PURE=1`` against the native core
(native/, module ``_aggbox_native``, built by ``make install`` when cargo is on PATH;
docs/design.md "The hot path")::

    .venv/bin/python bench/native.py [--sizes 1000,3000]

Each mode (``AGGBOX_PURE=1`` and native) runs in a process of its own under
``valgrind --tool=callgrind --dump-before=getppid``, as bench/instructions.py does: a loop
over messages [0, n1) warms up, the figure is the loop over [n1, n2) ÷ (n2 − n1). Then the
same loops without valgrind, timed (best of 5; wall time, so load-dependent). The input is
bench/writer.py's (bench/instructions_writer.py): 5 messages per aggregate.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
COMPONENTS = {
    "call": "one call of a function that does nothing: Python def (pure), native noop (native)",
    "hash": "payload_hash(m.payload), one call per message",
    "hash_batch": "payload_hashes(payloads of one aggregate), one call per aggregate",
    "ids": "emitted_message_id(...), one call per message",
    "ids_batch": "emitted_message_ids(..., 5), one call per aggregate (5 ids)",
    "fold": "fold() of each aggregate's 5 messages (handlers included)",
}


def _nothing() -> None:
    pass


def setup(n_max: int) -> dict[str, Any]:
    sys.path.insert(0, str(HERE))
    from instructions_writer import setup as writer_setup

    ctx = writer_setup(n_max, None, ["fold"])
    ctx["payloads"] = [[m.payload for m in msgs] for _snap, msgs in ctx["groups"]]
    return ctx


def run(ctx: dict[str, Any], component: str, start: int, stop: int) -> None:
    from aggregates.core import ids

    per = 5
    if component == "call":
        fn = ids._native.noop if ids._native is not None else _nothing
        for _ in range(start, stop):
            fn()
    elif component == "hash":
        ph = ids.payload_hash
        for m in ctx["messages"][start:stop]:
            ph(m.payload)
    elif component == "hash_batch":
        phs = ids.payload_hashes
        for payloads in ctx["payloads"][start // per:stop // per]:
            phs(payloads)
    elif component == "ids":
        em = ids.emitted_message_id
        for m in ctx["messages"][start:stop]:
            em("Customer", m.aggregate_id, m.message_id, 0)
    elif component == "ids_batch":
        ems = ids.emitted_message_ids
        for m in ctx["messages"][start:stop:per]:
            ems("Customer", m.aggregate_id, m.message_id, per)
    elif component == "fold":
        from instructions_writer import NOW

        from aggregates.fold import fold

        for snap, msgs in ctx["groups"][start // per:stop // per]:
            fold(ctx["atype"], snap, msgs, now=NOW)
    else:
        raise SystemExit(f"unknown component {component!r}")


def child(n1: int, n2: int, timed: bool) -> None:
    ctx = setup(n2)
    from aggregates.core import ids

    if not timed:
        os.getppid()  # callgrind part: start and set-up
        for c in COMPONENTS:
            run(ctx, c, 0, n1)
            os.getppid()
            run(ctx, c, n1, n2)
            os.getppid()
        return
    out: dict[str, float] = {}
    for c in COMPONENTS:
        run(ctx, c, 0, n2)
        best = min(_timed(ctx, c, n2) for _ in range(5))
        out[c] = round(best / n2 * 1e9, 1)
    print(json.dumps({"native": ids._native is not None, "ns_per_msg": out}))


def _timed(ctx: dict[str, Any], c: str, n: int) -> float:
    t = time.perf_counter()
    run(ctx, c, 0, n)
    return time.perf_counter() - t


def instructions(n1: int, n2: int, pure: bool, work: Path) -> dict[str, int]:
    out = work / f"cg.{'pure' if pure else 'native'}"
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    env.pop("AGGBOX_PURE", None)
    if pure:
        env["AGGBOX_PURE"] = "1"
    cmd = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}",
           "--dump-before=getppid", "--dump-instr=no", sys.executable, __file__, "child",
           str(n1), str(n2)]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(done.stderr[-3000:])
    parts: dict[int, int] = {}
    for f in work.glob(out.name + ".*"):
        for line in f.read_text().splitlines():
            if line.startswith("summary:"):
                parts[int(f.name.rsplit(".", 1)[1])] = int(line.split()[1])
    return {c: round(parts[3 + 2 * i] / (n2 - n1)) for i, c in enumerate(COMPONENTS)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="1000,3000")
    ap.add_argument("--timed-n", type=int, default=20_000)
    args = ap.parse_args()
    n1, n2 = (int(x) for x in args.sizes.split(","))
    work = Path(tempfile.mkdtemp(prefix="aggbox-native-cg-"))
    try:
        counts = {mode: instructions(n1, n2, mode == "pure", work) for mode in ("pure", "native")}
    finally:
        shutil.rmtree(work, ignore_errors=True)
    wall: dict[str, Any] = {}
    for mode in ("pure", "native"):
        env = {**os.environ, "PYTHONHASHSEED": "0"}
        env.pop("AGGBOX_PURE", None)
        if mode == "pure":
            env["AGGBOX_PURE"] = "1"
        done = subprocess.run([sys.executable, __file__, "timed", "0", str(args.timed_n)],
                              env=env, capture_output=True, text=True, check=True)
        wall[mode] = json.loads(done.stdout.splitlines()[-1])
    print(f"{'component':<11} {'pure instr':>11} {'native':>9} {'pure ns':>9} {'native ns':>9}")
    for c in COMPONENTS:
        print(f"{c:<11} {counts['pure'][c]:>11,} {counts['native'][c]:>9,} "
              f"{wall['pure']['ns_per_msg'][c]:>9} {wall['native']['ns_per_msg'][c]:>9}")
    print(json.dumps({"instructions_per_msg": counts, "wall": wall}))


if __name__ == "__main__":
    if len(sys.argv) >= 2 and sys.argv[1] in ("child", "timed"):
        child(int(sys.argv[2]), int(sys.argv[3]), sys.argv[1] == "timed")
    else:
        main()
