"""``aggbox dispatch``: the command line of the dispatcher daemon
(``python -m aggbox.commands.dispatch`` runs it standalone, without the other sub-commands).

Every option overrides the setting of the same name from ``--config`` (section
``[dispatcher]``, or ``[aggbox]`` for the store) and from the environment (flags from
:mod:`aggbox.commands.options`). Heavy imports happen inside :func:`run`, so
``aggbox --help`` stays fast.

No MongoDB URI given: the server of ``aggbox local start``, else a throw-away local server,
resolved here once (:func:`aggbox.servers.mongodb_uri`); the daemon always gets a URI and
never starts a server itself (docs/design.md, "Layering").
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from typing import Any

from aggbox.commands.options import (
    SettingOption,
    add_setting_options,
    key_values,
    overrides,
)
from aggregates.core.settings import AggboxSettings, SectionSettings
from dispatcher.core.settings import DispatcherSettings

__all__ = ["main", "register", "run"]

_DESCRIPTION = """\
Publish the outbox entries of aggregate documents to a broker (Kafka), a directory of
JSON Lines files or stdout, then remove them from the documents.

Watches each collection with a change stream (or polls, on servers without change
streams), sweeps for pending entries at start-up and periodically, publishes the entries
of each aggregate in order keyed by aggregate id, pulls exactly the published ids, and
saves the stream's resume token. At-least-once: after a crash entries are published again
with the same ids; nothing is lost. To scale out, start more instances: each collection's
256 partitions are shared among the running instances (leases, balanced without a
coordinator; `aggbox dispatch-status` shows who holds what). SIGTERM/SIGINT stop gracefully
(exit code 0) and hand the partitions over at once.

Side effects: entries whose type has an effect — an `Effects` instance in the --aggregates
module, or a built-in HTTP/SMTP effect in [dispatcher.effects.<Type>] — are executed
instead of published: the attempt is recorded, the call made, the result recorded and
applied to the aggregate as a message, then the entry is removed (docs/side-effects.md).

Settings come from (lowest to highest priority) defaults, the config file (sections
[dispatcher] and [aggbox]), environment variables (AGGBOX_DISPATCHER_<NAME>,
AGGBOX_<NAME>) and these options.
"""

_EPILOG = """\
examples:
  aggbox dispatch --aggregates aggbox.examples.orders --publisher kafka \\
      --bootstrap-servers broker:9092 --topic-template '{aggregate_type}.events'
  aggbox dispatch --collection orders --publisher jsonl --jsonl-dir out/events --once

endpoints: GET /metrics (Prometheus), GET /healthz (200 healthy, 503 not — e.g. no MongoDB
round trip for --unhealthy-after seconds) on --metrics-port.
"""

_D, _A = DispatcherSettings, AggboxSettings
_F, _N, _S = float, "SECONDS", "MS"

_OPTIONS: list[SettingOption] = [
    SettingOption("--collection", _D, "collections", {"action": "append", "metavar": "NAME"}),
    SettingOption("--aggregates", _D, "aggregates", {"metavar": "MODULE"}),
    SettingOption("--publisher", _D, "publisher", {"choices": ["kafka", "jsonl", "stdout"]}),
    SettingOption("--record-format", _D, "record_format",
                  {"choices": ["aggbox", "cloudevents"]}),
    SettingOption("--bootstrap-servers", _D, "kafka_bootstrap_servers", {"metavar": "HOSTS"}),
    SettingOption("--kafka-option", _D, "kafka_config",
                  {"action": "append", "metavar": "KEY=VALUE"}, key_values),
    SettingOption("--delivery-timeout", _D, "kafka_delivery_timeout_s",
                  {"type": _F, "metavar": _N}),
    SettingOption("--topic-template", _D, "topic_template", {"metavar": "TEMPLATE"}),
    SettingOption("--jsonl-dir", _D, "jsonl_dir", {"metavar": "DIR"}),
    SettingOption("--mode", _D, "mode", {"choices": ["auto", "stream", "poll"]}),
    SettingOption("--batch-size", _D, "batch_size", {"type": int, "metavar": "N"}),
    SettingOption("--max-batch-records", _D, "max_batch_records", {"type": int, "metavar": "N"}),
    SettingOption("--pacing-ms", _D, "pacing_ms", {"type": _F, "metavar": _S}),
    SettingOption("--poll-interval-ms", _D, "poll_interval_ms", {"type": _F, "metavar": _S}),
    SettingOption("--sweep-interval", _D, "sweep_interval_s", {"type": _F, "metavar": _N}),
    SettingOption("--lease-ttl", _D, "lease_ttl_s", {"type": _F, "metavar": _N}),
    SettingOption("--takeover-grace", _D, "takeover_grace_s", {"type": _F, "metavar": _N}),
    SettingOption("--instance-id", _D, "instance_id", {"metavar": "NAME"}),
    SettingOption("--effect-concurrency", _D, "effect_concurrency",
                  {"type": int, "metavar": "N"}),
    SettingOption("--effect-collection", _D, "effect_collection", {"metavar": "NAME"}),
    SettingOption("--backoff-initial-ms", _D, "backoff_initial_ms", {"type": _F, "metavar": _S}),
    SettingOption("--backoff-max-ms", _D, "backoff_max_ms", {"type": _F, "metavar": _S}),
    SettingOption("--shutdown-timeout", _D, "shutdown_timeout_s", {"type": _F, "metavar": _N}),
    SettingOption("--metrics-port", _D, "metrics_port", {"type": int, "metavar": "PORT"}),
    SettingOption("--metrics-host", _D, "metrics_host", {"metavar": "ADDRESS"}),
    SettingOption("--unhealthy-after", _D, "unhealthy_after_s", {"type": _F, "metavar": _N}),
    SettingOption("--once-timeout", _D, "once_timeout_s", {"type": _F, "metavar": _N}),
    SettingOption("--json-logs", _D, "log_json", {"action": "store_const", "const": True}),
    SettingOption("--mongodb-uri", _A, "mongodb_uri", {"metavar": "URI"}),
    SettingOption("--database", _A, "database", {"metavar": "NAME"}),
    SettingOption("--dead-letter-collection", _A, "dead_letter_collection",
                  {"metavar": "NAME"}),
]
_SECTIONS: dict[str, type[SectionSettings]] = {"dispatcher": _D, "aggbox": _A}


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
    """``python -m aggbox.commands.dispatch``: the same options as ``aggbox dispatch``, plus
    the logging options of ``aggbox`` (standalone, so the daemon does not import the other
    sub-commands)."""
    import logging
    import sys

    from aggregates.core.errors import AggboxError

    parser = argparse.ArgumentParser(
        prog="python -m aggbox.commands.dispatch", description=_DESCRIPTION, epilog=_EPILOG,
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
    add_setting_options(parser, _OPTIONS)
    parser.set_defaults(func=run)


def _overrides(args: argparse.Namespace, section: str) -> dict[str, Any]:
    """The settings of ``section`` (``dispatcher`` or ``aggbox``) given as options."""
    return overrides(args, _SECTIONS[section], _OPTIONS)


def run(args: argparse.Namespace) -> int:
    import asyncio
    import sys

    from aggbox.servers import mongodb_uri
    from dispatcher.daemon import Dispatcher

    settings = DispatcherSettings.load(config_file=args.config,
                                       **_overrides(args, "dispatcher"))
    store = AggboxSettings.load(config_file=args.config, **_overrides(args, "aggbox"))
    if settings.log_json:
        from aggbox.logs import configure

        configure(level=getattr(args, "log_level", "INFO"), json_logs=True)
    if not store.mongodb_uri:  # the one place where "no URI" becomes the local server
        store = store.model_copy(update={"mongodb_uri": mongodb_uri()})
    dispatcher = Dispatcher(settings, store=store)
    rc = asyncio.run(dispatcher.run(once=args.once, install_signal_handlers=True))
    if args.once and (settings.log_json or getattr(args, "log_json", False)):
        # stderr is JSON lines (--log-json or --json-logs): the summary is one of them
        import logging

        logging.getLogger("aggbox.dispatch").info(
            once_summary(dispatcher.metrics.registry, dispatcher.once_left))
    elif args.once:  # the records themselves go to stdout with --publisher stdout
        print(once_summary(dispatcher.metrics.registry, dispatcher.once_left),
              file=sys.stderr if settings.publisher == "stdout" else sys.stdout)
    return rc


#: ``--once``'s summary: (label, counter) in the dispatcher's metrics registry.
_SUMMARY = (("published", "aggbox_dispatcher_published"),
            ("timers fired", "aggbox_dispatcher_timers_fired"),
            ("effects done", "aggbox_effect_results"),
            ("dead-lettered", "aggbox_dispatcher_dead_lettered"))


#: Per collection: (label, counter), labelled by ``collection``.
_PER_COLLECTION = (("published", "aggbox_dispatcher_published"),
                   ("timers fired", "aggbox_dispatcher_timers_fired"))


def once_summary(registry: Any, left: Mapping[str, tuple[int, int]] | None = None) -> str:
    """One line: what ``--once`` did, from its counters (all collections), then per
    collection what it published and fired and what is left (``left``: collection →
    pending entries, due timers; every partition), e.g. ``…; orders: published 2, timers
    fired 1, left 0 entries and 0 due timers``."""
    totals = {name: 0.0 for _, name in _SUMMARY}
    per: dict[str, dict[str, float]] = {}
    wanted = {name for _, name in _PER_COLLECTION}
    for metric in registry.collect():
        if metric.name not in totals:
            continue
        for sample in metric.samples:
            if sample.name != f"{metric.name}_total":
                continue
            totals[metric.name] += sample.value
            coll = sample.labels.get("collection")
            if metric.name in wanted and coll is not None:
                mine = per.setdefault(coll, {})
                mine[metric.name] = mine.get(metric.name, 0.0) + sample.value
    counts = ", ".join(f"{label} {int(totals[name]):,}" for label, name in _SUMMARY)
    parts = [f"aggbox dispatch --once: {counts}"]
    for coll in sorted(set(per) | set(left or {})):
        done = ", ".join(f"{label} {int(per.get(coll, {}).get(name, 0)):,}"
                         for label, name in _PER_COLLECTION)
        if left is not None and coll in left:
            entries, due = left[coll]
            done += f", left {entries:,} entries and {due:,} due timers"
        parts.append(f"{coll}: {done}")
    return "; ".join(parts)


if __name__ == "__main__":
    import sys

    sys.exit(main())
