"""The ``aggbox`` command. Each component registers its own sub-commands:

- ``spark.cli.register``       — ``aggbox run``, ``aggbox stream``
- ``dispatcher.cli.register``  — ``aggbox dispatch``
- ``aggbox.admin.register``    — ``aggbox deadletters …``, ``aggbox parked …``, ``aggbox indexes``
- ``aggbox.demo.register``     — ``aggbox demo``

A sub-command module exposes ``register(subparsers) -> None``; each parser it adds sets
``func=<callable(args) -> int>`` with ``set_defaults``. Heavy imports (pyspark,
confluent_kafka) happen inside ``func`` so ``aggbox --help`` stays fast.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Sequence

from aggregates.errors import AggboxError

SUBCOMMAND_MODULES = (
    "spark.cli", "dispatcher.cli", "aggbox.admin", "aggbox.demo", "aggbox.configref",
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
    except Exception:
        logging.basicConfig(level=args.log_level.upper())
    try:
        rc: int = args.func(args)
        return rc
    except AggboxError as exc:
        print(f"aggbox: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
