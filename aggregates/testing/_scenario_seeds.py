"""``check_fault_tolerance(..., hash_seeds=True)``: run a flow undisturbed in subprocesses
with other ``PYTHONHASHSEED`` s and compare their final states — a handler whose emits or
state follow the iteration order of a ``set`` (or ``frozenset``) of strings ends
differently under another seed, which no run inside one process can show.

The subprocess imports ``flow``, the registry and the effects by module and name
(``python -m aggregates.testing._scenario_seeds``, a pickled request on stdin, the pickled
states on stdout)."""

from __future__ import annotations

import itertools
import os
import pickle
import subprocess
import sys
from collections.abc import Callable, Mapping
from types import ModuleType
from typing import Any

from aggregates.core.errors import AggboxError, ConfigurationError
from aggregates.core.samevalue import same_value

__all__ = ["SEEDS", "check_hash_seeds"]

#: The hash seeds of the subprocesses (fixed: the same runs every time).
SEEDS = (1, 2, 3)
_TIMEOUT_S = 600


def _where(obj: object, what: str) -> tuple[str, str]:
    """``(module, name)`` under which a subprocess can import ``obj``."""
    module, name = getattr(obj, "__module__", None), getattr(obj, "__qualname__", None)
    if (isinstance(module, str) and isinstance(name, str) and "<locals>" not in name
            and module != "__main__"):
        return module, name
    found = [(m, attr) for m, mod in list(sys.modules.items())
             if m != "__main__" and isinstance(mod, ModuleType)
             for attr, value in list(vars(mod).items()) if value is obj]
    if not found:
        raise ConfigurationError(
            f"check_fault_tolerance(hash_seeds=True) imports the {what} in a subprocess: "
            "define it at the top level of an importable module (not in __main__ or a function)")
    return min(found)


def _load(where: tuple[str, str]) -> Any:
    module, name = where
    obj: Any = __import__(module, fromlist=["_"])
    for part in name.split("."):
        obj = getattr(obj, part)
    return obj


def check_hash_seeds(flow: Callable[..., object], registry: object, effects: object,
                     options: Mapping[str, Any], expected: dict[tuple[str, str], Any],
                     error: Callable[[str], AggboxError]) -> None:
    """Raise ``error(message)`` if the flow's final states under two of :data:`SEEDS`
    differ (hash order), or if they agree but differ from ``expected`` (this process's:
    state this process kept, not hash order) — each message names only what was seen."""
    request = pickle.dumps({"flow": _where(flow, "flow"), "registry": _where(registry, "registry"),
                            "effects": None if effects is None else _where(effects, "effects"),
                            "options": dict(options)})
    path = os.pathsep.join(os.path.abspath(p or os.curdir) for p in sys.path)
    procs = [(seed, subprocess.Popen(
        [sys.executable, "-m", "aggregates.testing._scenario_seeds"], stdin=subprocess.PIPE,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        env={**os.environ, "PYTHONHASHSEED": str(seed), "PYTHONPATH": path}))
        for seed in SEEDS]
    seeded: list[tuple[str, dict[tuple[str, str], Any]]] = []
    for seed, proc in procs:
        out, err = proc.communicate(request, timeout=_TIMEOUT_S)
        if proc.returncode != 0:
            last = (err.decode(errors="replace").strip().splitlines() or ["(no output)"])[-1]
            raise error(f"hash_seeds: the undisturbed run under PYTHONHASHSEED={seed} failed: "
                        f"{last}")
        seeded.append((f"PYTHONHASHSEED={seed}", dict(pickle.loads(out))))
    # Fresh processes that differ only in their hash seed and disagree: hash order is seen.
    for (first, base), (label, states) in itertools.combinations(seeded, 2):
        if not same_value(states, base):  # a NaN in a state is the same NaN
            raise error(f"the undisturbed run ends differently under {label} than under "
                        f"{first} (two fresh processes that differ only in their hash seed): "
                        "a handler follows the iteration order of a set of strings (or "
                        "another hash order) — iterate sorted(...) before emitting or "
                        "storing:\n" + _diff(first, base, label, states))
    label, states = seeded[0]
    if not same_value(states, expected):  # the seeds agree among themselves
        raise error("the undisturbed run ends the same in three fresh processes "
                    f"(PYTHONHASHSEED={', '.join(map(str, SEEDS))}) but differently in this "
                    "one — state this process kept between runs (a module-level counter, "
                    "cache or list, messages built outside the flow), or a hash order those "
                    "three seeds happen to share:\n" + _diff("this process", expected,
                                                             "fresh processes", states))


def _diff(first: str, base: dict[tuple[str, str], Any], label: str,
          states: dict[tuple[str, str], Any]) -> str:
    keys = sorted(k for k in set(states) | set(base)
                  if not same_value(states.get(k), base.get(k)))
    shown = "\n".join(f"  {t}/{i}: {first}: {_cut(base.get((t, i), '(absent)'))}\n"
                      f"  {' ' * len(t + i)}  {label}: {_cut(states.get((t, i), '(absent)'))}"
                      for t, i in keys[:3])
    return shown + (f"\n  … and {len(keys) - 3} more" if len(keys) > 3 else "")


def _cut(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 240 else text[:240] + "…"


def _child() -> None:
    from aggregates.testing._numbering import numbered_run
    from aggregates.testing.scenario import Scenario

    request = pickle.loads(sys.stdin.buffer.read())
    effects = None if request["effects"] is None else _load(request["effects"])
    sc = Scenario(_load(request["registry"]), effects=effects, **request["options"])
    with numbered_run():  # as check_fault_tolerance's own runs
        _load(request["flow"])(sc)
    sc.deliver_late()
    sys.stdout.buffer.write(pickle.dumps(list(sc.states().items())))


if __name__ == "__main__":
    _child()
