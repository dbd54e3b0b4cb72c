"""The reason-code reference, generated from :class:`aggregates.core.reasons.Reason`.

``docs/reasons.md`` is rendered from :data:`aggregates.core.reasons.REASON_DOCS`; a test checks
that the committed file equals what the enum says. Regenerate it with ``aggbox reasons
--write`` in the checkout: ``--write [DIR]`` writes ``docs/reasons.md`` under DIR, by default
the current folder — never into the installed package (issue 44, item 7).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from aggregates.core.reasons import REASON_DOCS, Reason

__all__ = ["DOC_PATH", "register", "render_markdown"]

ROOT = Path(__file__).resolve().parents[1]
DOC_PATH = ROOT / "docs" / "reasons.md"


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def render_markdown() -> str:
    out = [
        "# Reason codes",
        "",
        "Generated from `aggregates.core.reasons.Reason` (`aggbox reasons --write`); a test",
        "keeps it in step. Every message aggbox does not simply apply gets one of these codes:",
        "in its outcome, its dead letter or parked entry, and the metrics. The values are stable",
        "(they are stored); in code, use the members (`Reason.SEQUENCE_GAP`, equal to the",
        "string `\"sequence_gap\"`). How to list, replay and release: docs/debugging.md.",
        "",
        "| reason | outcome | when | what to do |",
        "|---|---|---|---|",
    ]
    for reason in Reason:
        doc = REASON_DOCS[reason]
        out.append(f"| `{reason.value}` | {_cell(doc.outcome)} | {_cell(doc.when)} "
                   f"| {_cell(doc.action)} |")
    return "\n".join(out) + "\n"


def register(sub: Any) -> None:
    p = sub.add_parser("reasons", help="print or regenerate the reason-code reference",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--write", nargs="?", const=".", metavar="DIR",
                   help=f"write {DOC_PATH.relative_to(ROOT)} under DIR (default: the current "
                   "folder)")
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    if args.write:
        doc = Path(args.write).resolve() / DOC_PATH.relative_to(ROOT)
        doc.parent.mkdir(parents=True, exist_ok=True)
        doc.write_text(render_markdown())
        print(f"wrote {doc}")
    else:
        print(render_markdown(), end="")
    return 0
