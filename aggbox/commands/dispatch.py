"""``aggbox dispatch``: the command line of the dispatcher daemon.

Every option overrides the setting of the same name from ``--config`` (section
``[dispatcher]``, or ``[aggbox]`` for the store) and from the environment. Heavy imports
happen inside :func:`run`, so ``aggbox --help`` stays fast.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

__all__ = ["main", "register", "run"]

_DESCRIPTION = """\
Publish the outbox entries of aggregate documents to a broker (Kafka), a directory of
JSON Lines files or stdout, then remove them from the documents.

Watches each collection with a change stream (or polls, on servers without change
streams), sweeps for pending entries at start-up and periodically, publishes the entries
of each aggregate in order keyed by aggregate id, pulls exactly the published ids, and
saves the stream's resume token. At-least-once: after a crash entries are published again
with the same ids; nothing is lost. One instance per collection is active (a lease); start
more as standbys. SIGTERM/SIGINT stop gracefully (exit code 0).

Settings come from (lowest to highest priority) defaults, the config file (sections
[dispatcher] and [aggbox]), environment variables (AGGBOX_DISPATCHER_<NAME>,
AGGBOX_<NAME>) and these options.
"""

_EPILOG = """\
examples:
  aggbox dispatch --aggregates examples.orders --publisher kafka \\
      --bootstrap-servers broker:9092 --topic-template '{aggregate_type}.events'
  aggbox dispatch --collection orders --publisher jsonl --jsonl-dir out/events --once
  AGGBOX_DISPATCHER_FAULT=after_publish:kill aggbox dispatch ...   (crash tests only)

endpoints: GET /metrics (Prometheus), GET /healthz (200 healthy, 503 not — e.g. no MongoDB
round trip for --unhealthy-after seconds) on --metrics-port.
"""

# option → (settings section, field name, argparse keyword arguments)
_OPTIONS: list[tuple[str, str, str, dict[str, Any]]] = [
    ("--collection", "dispatcher", "collections",
     {"action": "append", "metavar": "NAME"}),
    ("--aggregates", "dispatcher", "aggregates", {"metavar": "MODULE"}),
    ("--publisher", "dispatcher", "publisher", {"choices": ["kafka", "jsonl", "stdout"]}),
    ("--bootstrap-servers", "dispatcher", "kafka_bootstrap_servers", {"metavar": "HOSTS"}),
    ("--kafka-option", "dispatcher", "kafka_config",
     {"action": "append", "metavar": "KEY=VALUE"}),
    ("--delivery-timeout", "dispatcher", "kafka_delivery_timeout_s",
     {"type": float, "metavar": "SECONDS"}),
    ("--topic-template", "dispatcher", "topic_template", {"metavar": "TEMPLATE"}),
    ("--jsonl-dir", "dispatcher", "jsonl_dir", {"metavar": "DIR"}),
    ("--mode", "dispatcher", "mode", {"choices": ["auto", "stream", "poll"]}),
    ("--batch-size", "dispatcher", "batch_size", {"type": int, "metavar": "N"}),
    ("--max-batch-records", "dispatcher", "max_batch_records", {"type": int, "metavar": "N"}),
    ("--pacing-ms", "dispatcher", "pacing_ms", {"type": float, "metavar": "MS"}),
    ("--poll-interval-ms", "dispatcher", "poll_interval_ms", {"type": float, "metavar": "MS"}),
    ("--sweep-interval", "dispatcher", "sweep_interval_s", {"type": float, "metavar": "SECONDS"}),
    ("--lease-ttl", "dispatcher", "lease_ttl_s", {"type": float, "metavar": "SECONDS"}),
    ("--instance-id", "dispatcher", "instance_id", {"metavar": "NAME"}),
    ("--backoff-initial-ms", "dispatcher", "backoff_initial_ms", {"type": float, "metavar": "MS"}),
    ("--backoff-max-ms", "dispatcher", "backoff_max_ms", {"type": float, "metavar": "MS"}),
    ("--shutdown-timeout", "dispatcher", "shutdown_timeout_s",
     {"type": float, "metavar": "SECONDS"}),
    ("--metrics-port", "dispatcher", "metrics_port", {"type": int, "metavar": "PORT"}),
    ("--metrics-host", "dispatcher", "metrics_host", {"metavar": "ADDRESS"}),
    ("--unhealthy-after", "dispatcher", "unhealthy_after_s",
     {"type": float, "metavar": "SECONDS"}),
    ("--once-timeout", "dispatcher", "once_timeout_s", {"type": float, "metavar": "SECONDS"}),
    ("--json-logs", "dispatcher", "log_json", {"action": "store_const", "const": True}),
    ("--mongodb-uri", "aggbox", "mongodb_uri", {"metavar": "URI"}),
    ("--database", "aggbox", "database", {"metavar": "NAME"}),
    ("--dead-letter-collection", "aggbox", "dead_letter_collection", {"metavar": "NAME"}),
]


def _help(section: str, field: str) -> str:
    from aggregates.settings import AggboxSettings
    from dispatcher.settings import DispatcherSettings

    model: Any = DispatcherSettings if section == "dispatcher" else AggboxSettings
    info = model.model_fields[field]
    prefix = "AGGBOX_DISPATCHER_" if section == "dispatcher" else "AGGBOX_"
    default = info.get_default(call_default_factory=True)
    text = (info.description or "").replace("%", "%%")
    return f"{text} [env {prefix}{field.upper()}; default: {default!r}]"


def register(subparsers: Any) -> None:
    """Add ``aggbox dispatch`` to the ``aggbox`` command."""
    parser = subparsers.add_parser(
        "dispatch",
        help="run the outbox dispatcher daemon (change streams → Kafka / files / stdout)",
        description=_DESCRIPTION,
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _add_options(parser)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m dispatcher``: the same options as ``aggbox dispatch``, plus the logging
    options of ``aggbox`` (standalone, so the daemon does not import the other
    sub-commands)."""
    import logging
    import sys

    from aggregates.errors import AggboxError

    parser = argparse.ArgumentParser(
        prog="python -m dispatcher", description=_DESCRIPTION, epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--log-level", default="INFO",
                        help="DEBUG, INFO, WARNING or ERROR (default: INFO)")
    parser.add_argument("--log-json", action="store_true", help="structured JSON logs")
    _add_options(parser)
    args = parser.parse_args(argv)
    try:
        from aggbox.logs import configure

        configure(level=args.log_level, json_logs=args.log_json)
    except Exception:
        logging.basicConfig(level=args.log_level.upper())
    try:
        return run(args)
    except AggboxError as exc:
        print(f"aggbox dispatch: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


def _add_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", metavar="FILE",
                        help="TOML config file (sections [dispatcher] and [aggbox]); default: "
                             "$AGGBOX_CONFIG")
    parser.add_argument("--once", action="store_true",
                        help="sweep until every collection is drained, then exit (no change "
                             "stream, no metrics server; waits for the lease while another "
                             "instance is active; exit status 1 with one error line when a "
                             "collection makes no progress for --once-timeout seconds); for "
                             "demos, tests and cron jobs")
    for flag, section, field, kwargs in _OPTIONS:
        parser.add_argument(flag, dest=f"opt_{field}", help=_help(section, field), **kwargs)
    parser.set_defaults(func=run)


def _overrides(args: argparse.Namespace, section: str) -> dict[str, Any]:
    from aggregates.errors import ConfigurationError

    out: dict[str, Any] = {}
    for flag, sec, field, _kw in _OPTIONS:
        value = getattr(args, f"opt_{field}", None)
        if sec != section or value is None:
            continue
        if field == "kafka_config":
            pairs: dict[str, str] = {}
            for item in value:
                key, sep, val = item.partition("=")
                if not sep or not key:
                    raise ConfigurationError(f"{flag} {item!r}: use KEY=VALUE")
                pairs[key] = val
            value = pairs
        out[field] = value
    return out


def run(args: argparse.Namespace) -> int:
    import asyncio

    from aggregates.settings import AggboxSettings
    from dispatcher.daemon import Dispatcher
    from dispatcher.settings import DispatcherSettings

    settings = DispatcherSettings.load(config_file=args.config,
                                       **_overrides(args, "dispatcher"))
    store = AggboxSettings.load(config_file=args.config, **_overrides(args, "aggbox"))
    if settings.log_json:
        from aggbox.logs import configure

        configure(level=getattr(args, "log_level", "INFO"), json_logs=True)
    dispatcher = Dispatcher(settings, store=store)
    return asyncio.run(dispatcher.run(once=args.once, install_signal_handlers=True))
