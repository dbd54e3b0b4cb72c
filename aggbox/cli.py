"""The ``aggbox`` command. Each component registers its own sub-commands:

- ``aggbox.commands.run``      — ``aggbox run``, ``aggbox stream`` (the Spark pipeline)
- ``aggbox.commands.dispatch`` — ``aggbox dispatch`` (the outbox dispatcher)
- ``aggbox.commands.dispatch_status`` — ``aggbox dispatch-status`` (who dispatches what)
- ``aggbox.commands.check_store`` — ``aggbox check-store`` (does a MongoDB do what aggbox needs)
- ``aggbox.admin.register``    — ``aggbox deadletters …``, ``aggbox parked …``, ``aggbox indexes``
- ``aggbox.demo.register``     — ``aggbox demo``

A sub-command module exposes ``register(subparsers) -> None``; each parser it adds sets
``func=<callable(args) -> int>`` with ``set_defaults``. Heavy imports (pyspark,
confluent_kafka) happen inside ``func`` so ``aggbox --help`` stays fast.

Errors: an :class:`AggboxError` is printed as one line on stderr (exit status 1); any other
exception too, with its traceback written to the log file (:mod:`aggbox.logs`), whose path
the line names. Unknown config file sections and ``AGGBOX_*`` environment variables are
warned about (one line each, with the closest known name).
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import logging
import os
import sys
from collections.abc import Sequence
from typing import Any

from aggregates.core.errors import AggboxError

SUBCOMMAND_MODULES = (
    "aggbox.commands.run", "aggbox.commands.dispatch", "aggbox.commands.dispatch_status",
    "aggbox.commands.check_store",
    "aggbox.admin", "aggbox.demo", "aggbox.configref",
    "aggbox.reasonref",
    "aggbox.local",
    "aggbox.migrate",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="aggbox",
        description="Exactly-once-effect message processing on MongoDB aggregates.",
    )
    parser.add_argument("--log-level", default="INFO",
                        help="DEBUG, INFO, WARNING or ERROR (default: INFO)")
    parser.add_argument("--log-json", action="store_true", help="structured JSON logs")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in SUBCOMMAND_MODULES:
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
    """Warn about config file sections and ``AGGBOX_*`` environment variables that no
    settings model reads (a typo is otherwise silently ignored)."""
    from aggbox.configref import section_models
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
    for key, value in data.items():
        if key in sections:
            continue
        if isinstance(value, dict):
            log.warning("config file %s: unknown section [%s] is ignored%s (sections: %s)",
                        path, key, _closest(key, sorted(sections), "[{}]"),
                        ", ".join(f"[{s}]" for s in sections))
            continue
        owners = [s for s, m in sections.items() if key in m.model_fields]
        hint = (f"; put it in [{owners[0]}]" if owners else _closest(key, sorted(
            {f for m in models for f in m.model_fields})))
        log.warning("config file %s: setting %r outside any [section] is ignored%s",
                    path, key, hint)


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


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        configure_logging(args.log_level, args.log_json)
    except ValueError as exc:  # an unknown --log-level
        configure_logging("INFO", args.log_json)
        log.warning("--log-level %s: %s; logging at INFO", args.log_level, exc)
    try:
        try:
            warn_unknown_settings(getattr(args, "config", None))
        except Exception:  # a warning must never stop the command
            log.debug("checking for unknown settings failed", exc_info=True)
        rc: int = args.func(args)
        return rc
    except AggboxError as exc:
        print(f"aggbox: error: {_one_line_message(exc)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # a bug or an unforeseen failure: one line, trace in the file
        from aggbox.logs import write_trace

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
