"""Settings models → command-line flags: the one mapping of ``aggbox run``, ``aggbox stream``
and ``aggbox dispatch``.

Each command lists its options as :class:`SettingOption` rows (flag, settings model, field,
argparse keyword arguments). The help of an option is the field's description followed by
its environment variable and default; a value given on the command line becomes an explicit
argument of ``SectionSettings.load``, so the precedence stays the documented one
(docs/configuration.md): defaults < config file < environment < option.

Why not pydantic-settings' own ``CliSettingsSource`` (evaluated with pydantic-settings
2.16): it derives every flag from the field name (``--outcomes-path``, ``--input-format``,
``--checkpoint-location``, ``--collections`` instead of the documented ``--outcomes``,
``--format``, ``--checkpoint``, ``--collection``), and renaming needs field aliases, which
also rename the environment variables; it adds *every* field of a model (``--app-name``,
``--chunk-messages``, …) unless the models are annotated; its ``--help`` shows type names as
metavars (``{str,null}``, ``dict[str,str]``) and never the environment variable; flags such
as ``--json-logs`` (store_const) or ``--kafka-option KEY=VALUE`` (repeatable, into
``kafka_config``) have no equivalent. Keeping the flags identical would have cost more code
than this module.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from aggregates.core.errors import ConfigurationError
from aggregates.core.settings import SectionSettings

__all__ = ["SettingOption", "add_setting_options", "comma_list", "key_values", "overrides",
           "setting_help"]


class SettingOption(NamedTuple):
    """One flag that overrides one setting."""

    flag: str
    model: type[SectionSettings]
    field: str
    kwargs: dict[str, Any]
    #: turns the parsed value into the setting's value (``(value, flag) -> value``)
    convert: Callable[[Any, str], Any] | None = None

    @property
    def dest(self) -> str:
        return f"opt_{self.model.section}_{self.field}"


def setting_help(model: type[SectionSettings], field: str, text: str | None = None) -> str:
    """The field's description (or ``text``: the option's own words, where the description
    shows the config file's form), its environment variable and its default."""
    info = model.model_fields[field]
    default = info.get_default(call_default_factory=True)
    text = (text or info.description or "").replace("%", "%%")
    return f"{text} [env {model.env_name(field)}; default: {default!r}]"


def add_setting_options(parser: argparse.ArgumentParser | Any,
                        options: Sequence[SettingOption]) -> None:
    """Add one flag per option to ``parser`` (or an argument group)."""
    for opt in options:
        kwargs = dict(opt.kwargs)
        text = kwargs.pop("help", None)
        parser.add_argument(opt.flag, dest=opt.dest,
                            help=setting_help(opt.model, opt.field, text), **kwargs)


def overrides(args: argparse.Namespace, model: type[SectionSettings],
              options: Sequence[SettingOption]) -> dict[str, Any]:
    """The settings of ``model`` given on the command line (converted), by field name."""
    out: dict[str, Any] = {}
    for opt in options:
        value = getattr(args, opt.dest, None)
        if opt.model is not model or value is None:
            continue
        out[opt.field] = opt.convert(value, opt.flag) if opt.convert else value
    return out


def key_values(items: Sequence[str] | None, flag: str) -> dict[str, str]:
    """Repeated ``KEY=VALUE`` arguments → a dict (a missing ``=`` is a usage error)."""
    out: dict[str, str] = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ConfigurationError(f"{flag} {item!r}: use KEY=VALUE")
        out[key.strip()] = value
    return out


def comma_list(items: Sequence[str], flag: str) -> list[str]:
    """Repeated arguments, each possibly comma-separated → one list."""
    return [p for item in items for p in item.split(",") if p]
