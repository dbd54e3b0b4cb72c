"""The configuration reference, generated from the settings models.

``config/aggbox.toml`` (every setting with its default, valid as a config file) and
``docs/configuration.md`` are rendered from the models' field descriptions; a test checks
that the committed files equal what the models say. Regenerate them with ``aggbox config
--write`` in the checkout: ``--write [DIR]`` writes ``config/aggbox.toml`` and
``docs/configuration.md`` under DIR, by default the current folder — never into the installed
package (issue 44, item 7).
"""

from __future__ import annotations

import argparse
import json
import textwrap
from pathlib import Path
from typing import Any

from pydantic.fields import FieldInfo

from aggregates.core.settings import AggboxSettings, SectionSettings

ROOT = Path(__file__).resolve().parents[1]
TOML_PATH = ROOT / "config" / "aggbox.toml"
DOC_PATH = ROOT / "docs" / "configuration.md"


def section_models() -> list[type[SectionSettings]]:
    """Every settings section, in file order. Components that are not installed are left out."""
    models: list[type[SectionSettings]] = [AggboxSettings]
    try:
        from spark.settings import SparkSettings

        models.append(SparkSettings)
    except ImportError:  # pragma: no cover - spark extra not installed
        pass
    from dispatcher.core.settings import DispatcherSettings

    models.append(DispatcherSettings)
    return models


def _env_name(model: type[SectionSettings], name: str) -> str:
    prefix = str(model.model_config.get("env_prefix", ""))
    return (prefix + name).upper()


def _default(info: FieldInfo) -> Any:
    if info.default_factory is not None:
        return info.default_factory()  # type: ignore[call-arg]
    return info.default


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{k} = {_toml_value(v)}" for k, v in value.items()) + " }"
    raise TypeError(f"cannot render {value!r} as TOML")


def render_toml() -> str:
    out = [
        "# aggbox configuration: every setting with its default.",
        "# Generated from the settings models by `aggbox config --write`; do not edit by hand.",
        "# Pass a file like this with --config FILE (or AGGBOX_CONFIG=FILE). Environment",
        "# variables (named on each setting) override the file; command-line options override",
        "# both.",
    ]
    for model in section_models():
        out += ["", f"[{model.section}]"]
        for name, info in model.model_fields.items():
            out.append("")
            for line in textwrap.wrap(info.description or "", 88):
                out.append(f"# {line}")
            out.append(f"# env: {_env_name(model, name)}")
            value = _default(info)
            if value is None:
                out.append(f"# {name} =   (unset by default)")
            else:
                out.append(f"{name} = {_toml_value(value)}")
    return "\n".join(out) + "\n"


def render_markdown() -> str:
    out = [
        "# Configuration reference",
        "",
        "Generated from the settings models (`aggbox config --write`); a test keeps it in step.",
        "",
        "Precedence, lowest to highest: the defaults below, a TOML file (`--config FILE` or",
        "`AGGBOX_CONFIG`), environment variables, command-line options. "
        "`config/aggbox.toml` lists every",
        "setting with its default and is itself a valid config file.",
    ]
    for model in section_models():
        doc = (model.__doc__ or "").strip().splitlines()[0]
        out += ["", f"## `[{model.section}]`", "", doc, "",
                "| setting | default | environment | meaning |", "|---|---|---|---|"]
        for name, info in model.model_fields.items():
            value = _default(info)
            shown = "unset" if value is None else f"`{_toml_value(value)}`"
            desc = (info.description or "").replace("|", "\\|")
            out.append(f"| `{name}` | {shown} | `{_env_name(model, name)}` | {desc} |")
    return "\n".join(out) + "\n"


def register(sub: Any) -> None:
    p = sub.add_parser("config", help="print or regenerate the configuration reference",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--write", nargs="?", const=".", metavar="DIR",
                   help=f"write {TOML_PATH.relative_to(ROOT)} and {DOC_PATH.relative_to(ROOT)} "
                   "under DIR (default: the current folder)")
    p.add_argument("--markdown", action="store_true", help="print the Markdown reference")
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    if args.write:
        toml, doc = (Path(args.write).resolve() / p.relative_to(ROOT)
                     for p in (TOML_PATH, DOC_PATH))
        toml.parent.mkdir(parents=True, exist_ok=True)
        doc.parent.mkdir(parents=True, exist_ok=True)
        toml.write_text(render_toml())
        doc.write_text(render_markdown())
        print(f"wrote {toml} and {doc}")
    else:
        print(render_markdown() if args.markdown else render_toml(), end="")
    return 0
