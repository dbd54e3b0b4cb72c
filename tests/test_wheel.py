"""The built wheel installs exactly the four packages (``aggregates``, ``spark``,
``dispatcher``, ``aggbox``) and their ``py.typed`` markers: no top-level ``examples``,
``tests`` or ``bench`` in a user's site-packages (the example domain is
``aggbox.examples``).

The wheel is built from a clean copy of the work tree (setuptools reuses a stale ``build/``
directory, which could hide or add files), without build isolation: a few seconds.

Then it is installed as a team would (issue 34): into fresh virtualenvs, with no extra — the
core (``aggregates``, the harness, ``Scenario``, ``aggbox --help`` / ``--version``) works and
each command that needs an extra says which in one line — and with each extra, whose command
then runs for real. The extras' dependencies come from a wheelhouse in the aggbox cache
(``$AGGBOX_CACHE_DIR/wheelhouse``), filled from PyPI with ``pip wheel`` the first time an
install from it alone fails; after that the installs are offline (pyspark's wheel is ~300 MB:
the spark virtualenv takes about a minute to install, the others seconds).

README's own commands (issue 44, item 1): ``make dist`` in a clean copy of the work tree, then
README "Install"'s block as written, by bash, in a folder outside the checkout — from that
``dist/`` (the native core for this platform: ``aggbox --version`` says ``native core``) and
from one without a wheel for this platform (the fallback: ``pure Python``) — and README's
flow from the team's folder with its own module (README's aggregate as ``my_domain.py``):
``aggbox local start``, ``run``, ``dispatch --once``, ``show``, ``local stop``. Before: README's
``pip install 'aggbox[spark,dispatcher]'`` found no distribution, and a wheel built from the
checkout carried no native core."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("aggregates", "spark", "dispatcher", "aggbox")
_SKIP = {".git", ".venv", "build", "dist", ".mypy_cache", ".ruff_cache", ".hypothesis",
         ".pytest_cache", "__pycache__"}


def _copy_tree(dest: Path) -> None:
    """The work tree without virtualenv, VCS data, caches and earlier build output."""
    ignore = shutil.ignore_patterns(*_SKIP, "*.pyc", "*.egg-info")
    for entry in ROOT.iterdir():
        if entry.name in _SKIP or entry.name.endswith(".egg-info"):
            continue
        if entry.is_dir():
            shutil.copytree(entry, dest / entry.name, ignore=ignore)
        elif entry.is_file():
            shutil.copy2(entry, dest / entry.name)


@pytest.fixture(autouse=True)
def _no_pythonpath(monkeypatch: pytest.MonkeyPatch) -> None:
    """The fresh virtualenvs see only what they installed: the suite's PYTHONPATH (the
    checkout, for Spark's workers; tests/conftest.py) would make pip find the checkout's
    ``aggbox.egg-info`` and skip installing the wheel (no ``bin/aggbox``), and the
    virtualenvs' Pythons import the checkout instead of the wheel."""
    monkeypatch.delenv("PYTHONPATH", raising=False)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    src = tmp_path_factory.mktemp("src")
    out = tmp_path_factory.mktemp("wheel")
    _copy_tree(src)
    done = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
         "--disable-pip-version-check", "-q", "-w", str(out), str(src)],
        capture_output=True, text=True, timeout=180, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    (found,) = out.glob("aggbox-*.whl")
    return found


def test_wheel_installs_only_the_four_packages(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    top = {n.split("/")[0] for n in names}
    dist_info = {t for t in top if t.endswith(".dist-info")}
    assert len(dist_info) == 1
    assert top - dist_info == set(PACKAGES), sorted(top)
    assert not any(n.startswith(("examples/", "tests/", "bench/")) for n in names)


def test_wheel_ships_the_example_domain_and_the_type_markers(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    for package in PACKAGES:
        assert f"{package}/py.typed" in names, package
    assert "aggbox/examples/orders/domain.py" in names
    assert "aggbox/commands/run.py" in names and "aggbox/commands/dispatch.py" in names
    assert "aggbox/servers/poms/kafka.xml" in names  # the local servers' Maven poms
    # the local servers' Java launchers, the H2 one a folder compiled together
    assert "aggbox/servers/java/AggboxMongoServer.java" in names
    assert "aggbox/servers/java/h2server/BoundedOplog.java" in names


# -- installed into fresh virtualenvs ----------------------------------------------------------
#: A module of each extra (pyproject.toml [project.optional-dependencies]).
EXTRA_MODULES = {"spark": "pyspark", "dispatcher": "aiohttp", "kafka": "confluent_kafka",
                 "notebook": "nbclient", "otel": "opentelemetry", "testing": "mongomock"}
PIP = ("-m", "pip", "--disable-pip-version-check", "-q")


def _wheelhouse() -> Path:
    from aggbox.servers.maven import cache_dir

    house = cache_dir() / "wheelhouse"
    house.mkdir(exist_ok=True)
    return house


def _venv(wheel: Path, where: Path, extras: str = "") -> Path:
    """A fresh virtualenv (the running interpreter's base Python) with the wheel and its
    extras installed; its ``bin`` directory."""
    subprocess.run([sys.executable, "-m", "venv", str(where)], check=True, timeout=300)
    python = str(where / "bin" / "python")
    target = f"{wheel}[{extras}]" if extras else str(wheel)
    house = _wheelhouse()
    offline = [python, *PIP, "install", "--no-index", "--find-links", str(house), target]
    done = subprocess.run(offline, capture_output=True, text=True, timeout=1800, check=False)
    if done.returncode != 0:  # the wheelhouse lacks something: fill it from PyPI, once
        fill = subprocess.run([python, *PIP, "wheel", "-w", str(house), target],
                              capture_output=True, text=True, timeout=3600, check=False)
        assert fill.returncode == 0, fill.stdout + fill.stderr
        for built in house.glob("aggbox-*.whl"):  # never install a stale aggbox from there
            built.unlink()
        done = subprocess.run(offline, capture_output=True, text=True, timeout=1800,
                              check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    return where / "bin"


def _importable(bin_dir: Path, module: str) -> bool:
    code = f"import importlib.util, sys; sys.exit(importlib.util.find_spec({module!r}) is None)"
    return subprocess.run([str(bin_dir / "python"), "-c", code], check=False).returncode == 0


def _aggbox(bin_dir: Path, cwd: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """``aggbox ARGS`` of that virtualenv, run in ``cwd`` with no AGGBOX_* variable of ours
    (the state directory in ``cwd``'s parent)."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith("AGGBOX_")}
    environ.update(AGGBOX_HOME=str(cwd.parent / "home"), **env)
    if "AGGBOX_CACHE_DIR" in os.environ:  # the suite's Maven cache
        environ["AGGBOX_CACHE_DIR"] = os.environ["AGGBOX_CACHE_DIR"]
    return subprocess.run([str(bin_dir / "aggbox"), *args], cwd=cwd, env=environ,
                          capture_output=True, text=True, timeout=900, check=False)


def _one_line(done: subprocess.CompletedProcess[str], line: str) -> None:
    assert done.returncode == 1, done
    assert (done.stdout, done.stderr) == ("", f"aggbox: error: {line}\n")


NEEDS_SPARK = "needs the spark extra: pip install 'aggbox[spark]'"
NEEDS_DISPATCHER = "needs the dispatcher extra: pip install 'aggbox[dispatcher]'"

#: README's aggregate and its harness test, and a Scenario over it: the core, no extra.
HARNESS_TEST = """
from dataclasses import dataclass, replace

from aggregates import AggregateType, Emit, Handled, Inbox, Message, Registry
from aggregates.testing import AggregateHarness, Scenario, message


@dataclass(frozen=True)
class Customer:
    credit_limit: int = 0
    reserved: int = 0


@dataclass(frozen=True)
class OrderCreated:
    order_id: str
    amount: int


customers = AggregateType("Customer", state=Customer, collection="customers",
                          dedup=Inbox(window=1000))


@customers.handles("CustomerRegistered")
def register(state: Customer, msg: Message) -> Customer:
    return replace(state, credit_limit=msg.payload["credit_limit"])


@customers.handles(OrderCreated)
def reserve(state: Customer, order: OrderCreated, msg: Message) -> Handled[Customer]:
    to = ("Order", order.order_id)
    if state.reserved + order.amount > state.credit_limit:
        return state, [Emit("CreditLimitExceeded", {"order_id": order.order_id}, to=to)]
    return replace(state, reserved=state.reserved + order.amount), [
        Emit("CreditReserved", {"order_id": order.order_id}, to=to)]


h = AggregateHarness(customers, aggregate_id="c-1")
h.given(message("CustomerRegistered", {"credit_limit": 100}, to=customers, id="c-1"))
order = message("OrderCreated", {"order_id": "o-1", "amount": 30}, to=customers, id="c-1")
assert h.when(order).emitted_types == ["CreditReserved"]
assert h.when(order).outcome == "duplicate"
assert h.state.reserved == 30

sc = Scenario(Registry([customers]))
sc.given(message("CustomerRegistered", {"credit_limit": 100}, to=customers, id="c-2"))
sc.when(message("OrderCreated", {"order_id": "o-2", "amount": 80}, to=customers, id="c-2"))
assert sc.state(customers, "c-2").reserved == 80
print("harness ok")
"""


def test_no_extra_core_help_version_and_harness(wheel: Path, tmp_path: Path) -> None:
    bin_dir = _venv(wheel, tmp_path / "venv")
    assert not any(_importable(bin_dir, m) for m in EXTRA_MODULES.values())
    cwd = tmp_path / "work"
    cwd.mkdir()
    done = _aggbox(bin_dir, cwd, "--help")
    assert done.returncode == 0 and done.stderr == "", done
    for command in ("run", "stream", "dispatch", "dispatch-status", "deadletters", "show"):
        assert f"    {command} " in done.stdout, command
    done = _aggbox(bin_dir, cwd, "--version")
    assert done.returncode == 0 and done.stdout.startswith("aggbox 0.1.0 (Python "), done
    # The wheel alone: no native core in this venv, and the version line says so.
    assert done.stdout.rstrip().endswith(", pure Python)"), done
    (cwd / "test_domain.py").write_text(HARNESS_TEST)
    done = subprocess.run([str(bin_dir / "python"), "test_domain.py"], cwd=cwd,
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.stdout == "harness ok\n", done
    (cwd / "test_domain.py").unlink()
    _one_line(_aggbox(bin_dir, cwd, "run", "--input", "in.jsonl"), f"aggbox run {NEEDS_SPARK}")
    _one_line(_aggbox(bin_dir, cwd, "stream", "--directory", "in"),
              f"aggbox stream {NEEDS_SPARK}")
    _one_line(_aggbox(bin_dir, cwd, "dispatch", "--once"), f"aggbox dispatch {NEEDS_DISPATCHER}")
    _one_line(_aggbox(bin_dir, cwd, "demo"), "aggbox demo needs the dispatcher and spark "
              "extras: pip install 'aggbox[dispatcher,spark]'")
    # memory_database() is the testing extra's: one line, not a traceback
    done = subprocess.run([str(bin_dir / "python"), "-c",
                           "from aggregates.testing import memory_database; memory_database()"],
                          cwd=cwd, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 1 and "pip install 'aggbox[testing]'" in done.stderr, done
    assert list(cwd.iterdir()) == []  # no aggbox.log, nothing else
    assert not (tmp_path / "home").exists()


def test_dispatcher_extra_runs_dispatch(wheel: Path, tmp_path: Path, mongo_uri: str,
                                        db: Any) -> None:
    bin_dir = _venv(wheel, tmp_path / "venv", "dispatcher")
    assert _importable(bin_dir, "aiohttp") and not _importable(bin_dir, "pyspark")
    cwd = tmp_path / "work"
    cwd.mkdir()
    db.orders.insert_one({"_id": "o-1", "_v": 1, "_type": "Order", "state": {}, "outbox": [
        {"id": "e-1", "type": "Hello", "payload": {}, "to": None}]})
    done = _aggbox(bin_dir, cwd, "dispatch", "--once", "--aggregates", "aggbox.examples.orders",
                   "--publisher", "stdout", "--mongodb-uri", mongo_uri, "--database", db.name)
    assert done.returncode == 0, done
    _one_line(_aggbox(bin_dir, cwd, "run", "--input", "in.jsonl"), f"aggbox run {NEEDS_SPARK}")
    assert list(cwd.iterdir()) == []


def test_spark_extra_runs_a_batch(wheel: Path, tmp_path: Path, mongo_uri: str, db: Any) -> None:
    bin_dir = _venv(wheel, tmp_path / "venv", "spark")
    assert _importable(bin_dir, "pyspark") and not _importable(bin_dir, "aiohttp")
    cwd = tmp_path / "work"
    cwd.mkdir()
    (cwd / "in.jsonl").write_text(json.dumps({
        "message_id": "m-1", "type": "CustomerRegistered", "aggregate_type": "Customer",
        "aggregate_id": "c-1", "payload": {"name": "Ada", "credit_limit": 100}}) + "\n")
    done = _aggbox(bin_dir, cwd, "run", "--input", "in.jsonl", "--aggregates",
                   "aggbox.examples.orders", "--mongodb-uri", mongo_uri, "--database", db.name,
                   "--no-progress", "--json")
    assert done.returncode == 0, done.stderr
    assert db.customers.find_one({"_id": "c-1"})["state"]["credit_limit"] == 100
    _one_line(_aggbox(bin_dir, cwd, "dispatch", "--once"), f"aggbox dispatch {NEEDS_DISPATCHER}")
    assert sorted(p.name for p in cwd.iterdir()) == ["in.jsonl"]


def test_the_other_extras_bring_what_they_say(wheel: Path, tmp_path: Path) -> None:
    """testing (memory_database), otel, kafka, notebook: each importable and used."""
    bin_dir = _venv(wheel, tmp_path / "venv", "testing,otel,kafka,notebook")
    assert all(_importable(bin_dir, EXTRA_MODULES[e])
               for e in ("testing", "otel", "kafka", "notebook"))
    code = (
        "from aggregates import AggboxSettings, Message, StoreWriter\n"
        "from aggregates.testing import memory_database\n"
        "from aggbox.examples.orders import registry\n"
        "db = memory_database()\n"
        "w = StoreWriter(db, registry, settings=AggboxSettings(database=db.name,"
        " pipeline_depth=1))\n"
        "out = w.process([Message('m-1', 'CustomerRegistered', 'Customer', 'c-1',"
        " {'name': 'Ada', 'credit_limit': 5})])\n"
        "assert [o.outcome for o in out] == ['applied'], out\n"
        "from aggregates.debug import dead_letters\n"
        "print(type(dead_letters(db)).__name__)\n")
    done = subprocess.run([str(bin_dir / "python"), "-c", code], capture_output=True,
                          text=True, timeout=300, check=False)
    assert done.returncode == 0 and done.stdout == "DataFrame\n", done


# -- README "Install" and "From your project folder", as written (issue 44, item 1) ------------
README = ROOT / "README.md"


def _readme_block(*needles: str, language: str = "bash") -> str:
    """The one fenced block of README.md in ``language`` that holds every needle."""
    from tests.docs.markdown import fenced_blocks

    (block,) = [b for b in fenced_blocks(README)
                if b.language == language and all(n in b.source for n in needles)]
    return block.source


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """README's ``make dist`` in a clean copy of the work tree, with this virtualenv (the one
    ``make install`` made): the aggbox wheel, the native core's wheel for this platform (with
    cargo) and its pure fallback."""
    assert "make dist" in _readme_block("make dist")
    src = tmp_path_factory.mktemp("dist-src")
    _copy_tree(src)
    done = subprocess.run(["make", "-C", str(src), "dist", f"VENV={sys.prefix}"],
                          capture_output=True, text=True, timeout=1800, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    return src / "dist"


def _platform_wheels(folder: Path) -> list[Path]:
    return [w for w in folder.glob("aggbox_native-*.whl") if not w.name.endswith("-any.whl")]


def test_make_dist_builds_the_wheels_readme_names(dist: Path) -> None:
    names = sorted(p.name for p in dist.iterdir())
    assert "aggbox-0.1.0-py3-none-any.whl" in names, names
    assert "aggbox_native-0.1.0-py3-none-any.whl" in names, names  # the fallback
    if shutil.which("cargo"):  # the native core for this platform
        assert len(_platform_wheels(dist)) == 1, names
    fallback = zipfile.ZipFile(dist / "aggbox_native-0.1.0-py3-none-any.whl").namelist()
    assert all(n.startswith("aggbox_native-0.1.0.dist-info/") for n in fallback), fallback
    meta = zipfile.ZipFile(dist / "aggbox-0.1.0-py3-none-any.whl").read(
        "aggbox-0.1.0.dist-info/METADATA").decode()
    native_version = re.search(r'^version = "(.+)"', (ROOT / "native" / "pyproject.toml")
                               .read_text(), re.M)
    assert native_version is not None
    assert f'Requires-Dist: aggbox-native=={native_version.group(1)}; extra == "native"' \
        in meta, meta


def _install_as_readme_says(dist_dir: Path, where: Path) -> Path:
    """README's install block, run by bash in ``where`` with ``AGGBOX_DIST`` = ``dist_dir``;
    the extras' dependencies come from the aggbox cache's wheelhouse (``PIP_FIND_LINKS``,
    offline: as a company's pip.conf would add a mirror), filled from PyPI once. The team's
    project folder; its virtualenv is ``.venv`` there."""
    block = _readme_block(".venv/bin/pip install", "AGGBOX_DIST")
    house = _wheelhouse()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AGGBOX_", "PIP_"))}
    env.update(AGGBOX_DIST=str(dist_dir), PIP_FIND_LINKS=str(house), PIP_NO_INDEX="1",
               PIP_DISABLE_PIP_VERSION_CHECK="1",
               PATH=f"{Path(sys.base_prefix) / 'bin'}{os.pathsep}{env.get('PATH', '')}")
    project = where / "my-team-project"
    project.mkdir(parents=True)

    def run() -> subprocess.CompletedProcess[str]:
        shutil.rmtree(project / ".venv", ignore_errors=True)
        return subprocess.run(["bash", "-euc", block], cwd=where, env=env, capture_output=True,
                              text=True, timeout=3600, check=False)

    done = run()
    if done.returncode != 0:  # the wheelhouse lacks something: fill it from PyPI, once
        requirement = re.search(r"'(aggbox\[[^']+\][^']*)'", block)
        assert requirement is not None, block
        fill = subprocess.run([sys.executable, *PIP, "wheel", "-w", str(house), "--find-links",
                               str(dist_dir), requirement.group(1)],
                              capture_output=True, text=True, timeout=3600, check=False)
        assert fill.returncode == 0, fill.stdout + fill.stderr
        for built in [*house.glob("aggbox-*.whl"), *house.glob("aggbox_native-*.whl")]:
            built.unlink()  # never install an aggbox from there
        done = run()
    assert done.returncode == 0, done.stdout + done.stderr
    return project


def _readme_flow(project: Path) -> subprocess.CompletedProcess[str]:
    """README "From your project folder": its aggregate saved as ``my_domain.py`` in the
    team's folder, then its commands, by bash, with the team's virtualenv first on PATH; the
    local server's state in the project's parent."""
    (project / "my_domain.py").write_text(_readme_block("customers = AggregateType",
                                                        language="python"))
    flow = _readme_block("--aggregates my_domain", "aggbox local start")
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGGBOX_")}
    env.update(AGGBOX_HOME=str(project.parent / "home"),
               PATH=f"{project / '.venv' / 'bin'}{os.pathsep}{env.get('PATH', '')}")
    if "AGGBOX_CACHE_DIR" in os.environ:  # the suite's Maven cache
        env["AGGBOX_CACHE_DIR"] = os.environ["AGGBOX_CACHE_DIR"]
    try:
        return subprocess.run(["bash", "-euc", flow], cwd=project, env=env,
                              capture_output=True, text=True, timeout=1800, check=False)
    finally:  # whatever happened: no server left behind
        subprocess.run([str(project / ".venv" / "bin" / "aggbox"), "local", "stop",
                        "--delete-data"], cwd=project, env=env, capture_output=True,
                       timeout=300, check=False)


@pytest.mark.parametrize("core", ["native core", "pure Python"])
def test_readme_install_and_flow_from_a_team_folder(core: str, dist: Path,
                                                    tmp_path: Path) -> None:
    """README's install command from ``dist/`` as ``make dist`` leaves it (the native core
    for this platform) and from one without a wheel for this platform (built without cargo,
    or for another platform: the fallback), then README's flow — run, dispatch, show — in
    the team's folder with its own module."""
    folder = dist
    if core == "pure Python":
        folder = tmp_path / "dist-elsewhere"
        shutil.copytree(dist, folder)
        for wheel in _platform_wheels(folder):
            wheel.unlink()
    elif not _platform_wheels(dist):  # no cargo here: make dist built the fallback only
        assert shutil.which("cargo") is None
        core = "pure Python"
    project = _install_as_readme_says(folder, tmp_path)
    aggbox = project / ".venv" / "bin" / "aggbox"
    version = subprocess.run([str(aggbox), "--version"], capture_output=True, text=True,
                             timeout=300, check=False)
    assert version.stdout.startswith("aggbox 0.1.0 (Python "), version
    assert version.stdout.rstrip().endswith(f", {core})"), version
    assert not any(p.name == "aggbox" for p in project.iterdir())  # nothing of the checkout

    done = _readme_flow(project)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "cannot import" not in done.stderr, done.stderr
    assert re.search(r"│ applied\s+│\s+│\s+2 │", done.stdout), done.stdout
    published = [json.loads(line) for f in sorted((project / "out").glob("*.jsonl"))
                 for line in f.read_text().splitlines()]
    assert [(r["type"], r["aggregate_id"]) for r in published] == [("CreditReserved", "o-1")]
    assert re.search(r"reserved\s+30", done.stdout), done.stdout  # aggbox show
