"""The ``aggbox`` command. Each component registers its own sub-commands:

- ``aggbox.commands.run``      — ``aggbox run``, ``aggbox stream`` (the Spark pipeline)
- ``aggbox.commands.dispatch`` — ``aggbox dispatch`` (the outbox dispatcher)
- ``aggbox.commands.dispatch_status`` — ``aggbox dispatch-status`` (who dispatches what)
- ``aggbox.commands.check_store`` — ``aggbox check-store`` (does a MongoDB do what aggbox needs)
- ``aggbox.admin.register``    — ``aggbox deadletters …``, ``aggbox parked …``, ``aggbox indexes``
- ``aggbox.demo.register``     — ``aggbox demo``
- ``aggbox.commands.trace``    — ``aggbox trace``, ``aggbox outcomes`` (the audit log)

A sub-command module exposes ``register(subparsers) -> None``; each parser it adds sets
``func=<callable(args) -> int>`` with ``set_defaults``. Heavy imports (pyspark,
confluent_kafka) happen inside ``func``. :mod:`aggbox.subcommands` lists every command with
its one-line help, so ``aggbox --help`` and ``--version`` import no command module and a
command imports only its own (issue 44, item 5: bench/cli_start.py). Every command runs with
the current folder first on the import path, where a team's aggregates module is
(:mod:`aggbox.commands.importpath`, items 2 and 6).

Errors: an :class:`AggboxError` is printed as one line on stderr, ``aggbox <command>: error:
…`` (exit status 1); any other exception too, with its traceback written to the log file
(:mod:`aggbox.logs`), whose path the line names. Unknown ``AGGBOX_*`` environment variables
are warned about (one line each, with the closest known name); an unknown config file
section is an error (with the closest known one). A command whose extra (pyproject.toml
optional dependencies) is not installed says which in one line (:data:`COMMAND_EXTRAS`).
With ``--json``, stdout holds one JSON object whatever happens
(:mod:`aggbox.commands.json_errors`).
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import logging
import os
import re
import signal
import sys
from collections.abc import Sequence
from types import FrameType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # imported in the functions: ``main`` must start before ``aggregates``
    from aggregates.core.errors import AggboxError

from aggbox.subcommands import SUBCOMMAND_MODULES, add_placeholders, module_of

#: reStructuredText in help texts taken from docstrings: ``x``, :mod:`x`, :func:`~a.b`.
_RST_ROLE = re.compile(r":[a-z]+:`~?([^`]+)`")
_RST_LITERAL = re.compile(r"``([^`]+)``")


def plain_text(text: str) -> str:
    """Help text as a terminal shows it: reStructuredText markup removed."""
    return _RST_LITERAL.sub(r"\1", _RST_ROLE.sub(r"\1", text))


class AggboxParser(argparse.ArgumentParser):
    """Every parser of the command (sub-commands inherit the class): help as plain text, and
    an unknown option is reported by the sub-command that received it, with its own usage
    and the closest option (argparse reports it at the top level, with ``aggbox``'s usage)."""

    #: False for the top-level parser, which keeps argparse's own handling
    strict_extras = True

    def format_help(self) -> str:
        return plain_text(super().format_help())

    def parse_known_args(self, args: Sequence[str] | None = None,  # type: ignore[override]
                         namespace: argparse.Namespace | None = None,
                         ) -> tuple[argparse.Namespace, list[str]]:
        parsed, extras = super().parse_known_args(args, namespace)
        if extras and self.strict_extras:
            self.error(f"unrecognized arguments: {' '.join(extras)}"
                       f"{_closest(extras[0], self._option_names(), '{}')}")
        return parsed, extras

    def _option_names(self) -> list[str]:
        return sorted(o for a in self._actions for o in a.option_strings if o.startswith("--"))


def aggbox_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("aggbox")
    except PackageNotFoundError:  # imported from a checkout that was never installed
        return "unknown (not installed)"


class _Version(argparse.Action):
    """``--version``: the line as it is (argparse's own action wraps it at the terminal's
    width)."""

    def __init__(self, option_strings: list[str], dest: str, version: str = "",
                 **kwargs: Any) -> None:
        kwargs.setdefault("help", "show the version and exit")
        super().__init__(option_strings, dest=argparse.SUPPRESS, **kwargs)
        self.version = version

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:
        print(self.version)
        parser.exit(0)


def core_kind() -> str:
    """Which hot path the writer's ids and hashes take (docs/design.md "The hot path"):
    found without importing it (the CLI's start stays short). Short: argparse wraps the
    version line at the terminal's width."""
    import importlib.util
    import os

    if os.environ.get("AGGBOX_PURE") == "1":
        return "pure Python: AGGBOX_PURE=1"
    if importlib.util.find_spec("_aggbox_native") is None:
        return "pure Python"
    return "native core"


def build_parser(command: str | None = None, *, lazy: bool = False) -> argparse.ArgumentParser:
    """The parser of every sub-command; with ``lazy``, only ``command``'s module is imported
    and registered, the other commands are placeholders (name and help:
    :mod:`aggbox.subcommands`), so that ``aggbox --help``, ``--version`` and a command start
    without importing the others."""
    parser = AggboxParser(
        prog="aggbox",
        description="Exactly-once-effect message processing on MongoDB aggregates.",
    )
    parser.strict_extras = False
    parser.add_argument("--version", action=_Version, nargs=0,
                        version=f"aggbox {aggbox_version()} (Python {sys.version.split()[0]}, "
                                f"{core_kind()})")
    parser.add_argument("--log-level", default="INFO",
                        help="DEBUG, INFO, WARNING or ERROR (default: INFO)")
    parser.add_argument("--log-json", action="store_true", help="structured JSON logs")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    wanted = module_of(command)
    for name in SUBCOMMAND_MODULES:
        if lazy and name != wanted and add_placeholders(sub, name):
            continue
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name != name:
                raise
            continue
        module.register(sub)
    return parser


#: ``AGGBOX_*`` environment variables that are not settings of a settings model.
OTHER_ENV_VARS = frozenset({
    "AGGBOX_CONFIG", "AGGBOX_LOG_FILE", "AGGBOX_CACHE_DIR", "AGGBOX_LOCAL_MONGO",
    "AGGBOX_HOME",
})

log = logging.getLogger("aggbox")


def _closest(name: str, known: Sequence[str], form: str = "{}") -> str:
    match = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
    return f"; did you mean {form.format(match[0])}?" if match else ""


def warn_unknown_settings(config_file: str | None) -> None:
    """Warn about ``AGGBOX_*`` environment variables and top-level config file keys that no
    settings model reads (a typo is otherwise silently ignored); an unknown config file
    section is a :class:`ConfigurationError` with the closest known section."""
    from aggbox.configref import section_models
    from aggregates.core.errors import AggboxError, ConfigurationError
    from aggregates.core.settings import read_config_file

    models = section_models()
    sections = {m.section: m for m in models}
    env_names = set(OTHER_ENV_VARS)
    for m in models:
        env_names.update(m.env_name(f) for f in m.model_fields)
    unknown_env = sorted(k for k in os.environ
                         if k.upper().startswith("AGGBOX_") and k.upper() not in env_names)
    for name in unknown_env:
        log.warning("unknown environment variable %s is ignored%s", name,
                    _closest(name.upper(), sorted(env_names)))
    try:
        data = read_config_file(config_file)
    except AggboxError:
        return  # the command itself reports a missing or invalid file
    path = config_file or os.environ.get("AGGBOX_CONFIG")
    bad_sections = []
    for key, value in data.items():
        if key in sections:
            continue
        if isinstance(value, dict):
            bad_sections.append(f"unknown section [{key}]"
                                f"{_closest(key, sorted(sections), '[{}]')}")
            continue
        owners = [s for s, m in sections.items() if key in m.model_fields]
        hint = (f"; put it in [{owners[0]}]" if owners else _closest(key, sorted(
            {f for m in models for f in m.model_fields})))
        log.warning("config file %s: setting %r outside any [section] is ignored%s",
                    path, key, hint)
    if bad_sections:  # its settings would be silently ignored: an error, as a misspelt key
        raise ConfigurationError(
            f"config file {path}: {'; '.join(bad_sections)} (sections: "
            f"{', '.join(f'[{s}]' for s in sections)})")


def _one_line(exc: BaseException, limit: int = 300) -> str:
    """``Type: first line of the message`` (shortened; the rest is in the trace)."""
    lines = [line.strip() for line in str(exc).strip().splitlines() if line.strip()]
    text = lines[0] if lines else ""
    if len(text) > limit:
        text = text[:limit].rstrip() + " …"
    elif len(lines) > 1:
        text += " …"
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def configure_logging(level: str, json_logs: bool) -> None:
    from aggbox.logs import configure

    configure(level=level, json_logs=json_logs)


#: The optional dependencies (pyproject.toml [project.optional-dependencies]) by the top-level
#: module whose absence means the extra is not installed.
MODULE_EXTRAS = {
    "pyspark": "spark", "pyarrow": "spark", "pandas": "spark", "grpc": "spark",
    "aiohttp": "dispatcher", "prometheus_client": "dispatcher",
    "confluent_kafka": "kafka", "mongomock": "testing", "opentelemetry": "otel",
    "nbclient": "notebook", "nbformat": "notebook",
}
#: The extras a command cannot start without, checked before it runs.
COMMAND_EXTRAS = {
    "run": ("pyspark", "pyarrow"), "stream": ("pyspark", "pyarrow"),
    "dispatch": ("aiohttp", "prometheus_client"), "dispatch-status": ("aiohttp",),
    "demo": ("pyspark", "pyarrow", "aiohttp", "prometheus_client"),
    "trace": ("pandas", "pyarrow"), "outcomes": ("pandas", "pyarrow"),
}


def _extra_line(command: str, modules: Sequence[str]) -> str:
    extras = sorted({MODULE_EXTRAS[m] for m in modules})
    names = " and ".join(extras)
    return (f"aggbox {command} needs the {names} extra{'s' if len(extras) > 1 else ''}: "
            f"pip install 'aggbox[{','.join(extras)}]'")


def missing_extra(command: str) -> str | None:
    """One line naming the extra ``command`` needs and how to install it (None: installed)."""
    from importlib.util import find_spec

    missing = [m for m in COMMAND_EXTRAS.get(command, ()) if find_spec(m) is None]
    return _extra_line(command, missing) if missing else None


def _command_word(words: Sequence[str]) -> str | None:
    """The sub-command of an ``aggbox`` command line, before any parsing."""
    rest = list(words)
    while rest and rest[0].startswith("-"):
        option = rest.pop(0)
        if option == "--log-level" and rest:
            rest.pop(0)
    return rest[0] if rest else None


def _stop_before_start(signum: int, frame: FrameType | None) -> None:
    """SIGTERM before the dispatcher's own handler is installed: nothing was started yet, so
    stopping is exiting, with the status of a graceful stop (0)."""
    log.info("%s received before the dispatcher started: exiting",
             signal.Signals(signum).name)
    raise SystemExit(0)


def main(argv: Sequence[str] | None = None) -> int:
    words = list(sys.argv[1:] if argv is None else argv)
    previous = None
    # ``aggbox dispatch`` is a daemon a supervisor may stop at any time, also while Python
    # still imports (seconds on a busy machine): without this, SIGTERM's default action
    # ends it with status -15 (issue 34). The daemon installs its own handler at start.
    if _command_word(words) == "dispatch":
        previous = signal.signal(signal.SIGTERM, _stop_before_start)
    try:
        if "--json" in words:  # one JSON object on stdout whatever happens (issue 40)
            from aggbox.commands.json_errors import one_json_object

            return one_json_object(_command_word(words), lambda: _main(words))
        return _main(words)
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def _main(argv: Sequence[str]) -> int:
    parser = build_parser(_command_word(argv), lazy=True)
    args = parser.parse_args(argv)  # --help and --version exit here, having imported little
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    from aggregates.core.errors import AggboxError, ConfigurationError

    needs = missing_extra(args.command)
    if needs:
        print(f"aggbox: error: {needs}", file=sys.stderr)
        return 1
    try:
        configure_logging(args.log_level, args.log_json)
    except ValueError as exc:  # an unknown --log-level
        configure_logging("INFO", args.log_json)
        log.warning("--log-level %s: %s; logging at INFO", args.log_level, exc)
    try:
        try:
            warn_unknown_settings(getattr(args, "config", None))
        except ConfigurationError as exc:  # an unknown config file section
            print(f"aggbox {args.command}: error: {_one_line_message(exc)}", file=sys.stderr)
            # a command whose usage errors have an exit status of their own (check-store: 2)
            return int(getattr(args, "config_error_status", 1))
        except Exception:  # a warning must never stop the command
            log.debug("checking for unknown settings failed", exc_info=True)
        from aggbox.commands.importpath import project_folder

        project_folder(args)  # the team's module is imported from the current folder
        rc: int = args.func(args)
        return rc
    except AggboxError as exc:
        print(f"aggbox {args.command}: error: {_one_line_message(exc)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # a bug or an unforeseen failure: one line, trace in the file
        from aggbox.logs import write_trace

        extra = _missing_module_extra(exc)
        if extra:  # an optional dependency a command imported without a pre-check
            print(f"aggbox: error: {_extra_line(args.command, [extra])}", file=sys.stderr)
            log.debug("missing optional dependency", exc_info=True)
            return 1

        if _is_uri_error(exc):  # its text may quote the password: neither shown nor logged
            print(f"aggbox {args.command}: error: {_uri_message(args)}", file=sys.stderr)
            return 1
        message = _one_line(exc)
        path = write_trace(f"aggbox {args.command}: {message}", exc)
        where = (f" (full trace in {path})" if path else
                 " (run with --log-level DEBUG for details)")
        print(f"aggbox {args.command}: error: {message}{where}", file=sys.stderr)
        log.debug("uncaught exception", exc_info=True)
        return 1


def _missing_module_extra(exc: BaseException) -> str | None:
    """The module of an extra that ``exc`` says is not installed (None: another error)."""
    if not isinstance(exc, ModuleNotFoundError):
        return None
    top = (exc.name or "").partition(".")[0]
    return top if top in MODULE_EXTRAS else None


def _one_line_message(exc: AggboxError) -> str:
    return " ".join(str(exc).split())


def _is_uri_error(exc: BaseException) -> bool:
    """pymongo's InvalidURI, or any exception raised while pymongo parsed a URI."""
    if type(exc).__module__.startswith("pymongo") and type(exc).__name__ == "InvalidURI":
        return True
    tb = exc.__traceback__
    while tb is not None:
        if str(tb.tb_frame.f_globals.get("__name__", "")).startswith("pymongo.uri_parser"):
            return True
        tb = tb.tb_next
    return False


def _uri_message(args: argparse.Namespace) -> str:
    """One line for pymongo's rejection of a MongoDB URI that no sub-command checked: the
    URI is checked again to name its source, without the password."""
    from aggbox.admin import check_mongodb_uri, mongodb_uri_source
    from aggregates.core.errors import AggboxError

    candidates: list[tuple[Any, str]] = [
        (getattr(args, name, None), "--mongodb-uri")
        for name in ("opt_aggbox_mongodb_uri", "opt_mongodb_uri")]
    candidates.append((os.environ.get("AGGBOX_MONGODB_URI"), mongodb_uri_source()))
    for uri, source in candidates:
        if isinstance(uri, str) and uri:
            try:
                check_mongodb_uri(uri, source)
            except AggboxError as problem:
                return str(problem)
    return ("invalid MongoDB URI: check --mongodb-uri, AGGBOX_MONGODB_URI or mongodb_uri "
            "in the [aggbox] section of the config file (user name and password "
            "percent-encoded with urllib.parse.quote_plus)")


if __name__ == "__main__":
    sys.exit(main())
