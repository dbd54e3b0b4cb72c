"""The sub-commands of ``aggbox`` by the module that registers them, with their one-line help:
what ``aggbox --help`` lists and ``aggbox --version`` needs, known without importing a single
command module (issue 44, item 5: those start in well under half a second on a quiet machine,
measured by ``bench/cli_start.py``), and what lets a command import only its own module.

:func:`aggbox.cli.build_parser` with ``command=`` registers that command's module for real and
a placeholder (name and help, nothing else) for every other command.
tests/test_cli_start.py checks that this table says what the modules register.
"""

from __future__ import annotations

from typing import Any

__all__ = ["COMMANDS", "SUBCOMMAND_MODULES", "add_placeholders", "module_of"]

#: The modules that register sub-commands, in the order ``aggbox --help`` lists them.
SUBCOMMAND_MODULES = (
    "aggbox.commands.run", "aggbox.commands.dispatch", "aggbox.commands.dispatch_status",
    "aggbox.commands.check_store",
    "aggbox.admin", "aggbox.demo", "aggbox.configref",
    "aggbox.reasonref",
    "aggbox.local",
    "aggbox.migrate",
    "aggbox.commands.show",
    "aggbox.commands.trace",
)

#: module → ((command, one-line help), …), as each module's ``register`` adds them.
COMMANDS: dict[str, tuple[tuple[str, str], ...]] = {
    "aggbox.commands.run": (
        ("run", "apply message files to the aggregates with Spark (batch)"),
        ("stream", "apply a Kafka topic or a directory stream with Structured Streaming")),
    "aggbox.commands.dispatch": (
        ("dispatch", "run the outbox dispatcher daemon (change streams → Kafka / files / "
                     "stdout)"),),
    "aggbox.commands.dispatch_status": (
        ("dispatch-status", "show dispatcher instances, their partitions, lag per partition "
                            "and the last hand-over"),),
    "aggbox.commands.check_store": (
        ("check-store", "check that a MongoDB does what aggbox relies on (scratch database, "
                        "created and dropped)"),),
    "aggbox.admin": (
        ("deadletters", "list, show, replay and dismiss dead letters"),
        ("parked", "list parked messages, release blocked aggregates"),
        ("effects", "list the side effects' attempt records"),
        ("timers", "list pending timers (overdue ones first to look at)"),
        ("indexes", "create the indexes the writer needs (idempotent)")),
    "aggbox.demo": (
        ("demo", "run the Customers & Orders scenario end to end; PASS/FAIL per invariant"),),
    "aggbox.configref": (("config", "print or regenerate the configuration reference"),),
    "aggbox.reasonref": (("reasons", "print or regenerate the reason-code reference"),),
    "aggbox.local": (("local", "start/stop one local MongoDB that outlives commands"),),
    "aggbox.migrate": (
        ("migrate", "rewrite stored aggregate documents in place (layout changes)"),),
    "aggbox.commands.show": (
        ("show", "show one aggregate: state, inbox, outbox, timers, parked, dead letters"),),
    "aggbox.commands.trace": (
        ("trace", "follow a message through the audit log: its causes and effects (--svg: a "
                  "sequence diagram)"),
        ("outcomes", "count the audit log's outcomes by reason per run (--svg: a bar chart)")),
}


def module_of(command: str | None) -> str | None:
    """The module that registers ``command`` (None: no such command, or none given)."""
    for module, commands in COMMANDS.items():
        if any(name == command for name, _ in commands):
            return module
    return None


def add_placeholders(sub: Any, module: str) -> bool:
    """Add ``module``'s commands to ``sub`` by name and help only; False when the table does
    not know the module (it must then be registered for real)."""
    if module not in COMMANDS:
        return False
    for name, text in COMMANDS[module]:
        sub.add_parser(name, help=text, add_help=False)
    return True
