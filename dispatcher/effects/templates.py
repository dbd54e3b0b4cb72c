"""Safe templates for the built-in effects (:mod:`~dispatcher.effects.http`,
:mod:`~dispatcher.effects.smtp`): a URL, a header or a mail subject built from an effect entry.

Placeholders: ``{aggregate_id}``, ``{aggregate_type}``, ``{type}``, ``{idempotency_key}``,
``{correlation_id}`` (empty when the entry has none), ``{attempt}`` and ``{payload.a.b}`` (a
path into the entry's payload; a list element by its index: ``{payload.items.0.sku}``).
``{{`` and ``}}`` are literal braces. Templates are parsed with a regular expression, never
with :meth:`str.format`, so no attribute or index lookups can reach Python objects.

:func:`parse_template` checks a template when the configuration is loaded (an unknown
placeholder is a :class:`~aggregates.core.errors.ConfigurationError` naming the setting);
:func:`render_template` fills it in for one :class:`~aggregates.domain.effects.EffectCall`, passing
every substituted value through an *escape* function: :func:`url_escape` (percent-encodes
everything, so a value stays one path segment or query value), :func:`header_escape`
(refuses CR/LF) or :func:`text_escape` (as-is). A payload path that is missing or does not
lead to a str/int/float/bool is a :class:`~aggregates.domain.effects.PermanentEffectError`
(``effect_rejected``): the same entry would fail the same way on every attempt.

:func:`load_spec` validates a kind's settings table into its pydantic model, turning
validation errors into one :class:`~aggregates.core.errors.ConfigurationError` that names each
setting (``effects.BookShipment.method: …``).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, TypeAlias, TypeVar
from urllib.parse import quote

from pydantic import BaseModel, ValidationError

from aggregates.core.errors import ConfigurationError
from aggregates.core.reasons import Reason
from aggregates.domain.effects import EffectCall, PermanentEffectError

__all__ = [
    "PLACEHOLDERS",
    "Escape",
    "Template",
    "header_escape",
    "load_spec",
    "parse_template",
    "render_template",
    "text_escape",
    "url_escape",
]

#: The placeholders taken from the call itself (plus ``payload.<path>``).
PLACEHOLDERS: Final = ("aggregate_id", "aggregate_type", "type", "idempotency_key",
                       "correlation_id", "attempt")

#: An escape function: the substituted value in, the text to insert out. It raises
#: :class:`ValueError` for a value it cannot insert safely.
Escape: TypeAlias = Callable[[str], str]

_TOKEN: Final = re.compile(r"\{\{|\}\}|\{([^{}]*)\}|[{}]")
_SEGMENT: Final = re.compile(r"[^\s{}.$]+")
_MAX_PATH: Final = 20

_Spec = TypeVar("_Spec", bound=BaseModel)


@dataclass(frozen=True, slots=True)
class _Placeholder:
    name: str                     # as written, e.g. "payload.address.zip"
    path: tuple[str, ...] = ()    # the payload path (empty for call fields)


_Part: TypeAlias = "str | _Placeholder"


@dataclass(frozen=True, slots=True)
class Template:
    """A parsed template (see :func:`parse_template`). ``setting`` names where it came from,
    for error messages."""

    text: str
    setting: str
    parts: tuple[_Part, ...]

    @property
    def placeholders(self) -> tuple[str, ...]:
        """The placeholder names, in order of appearance."""
        return tuple(p.name for p in self.parts if isinstance(p, _Placeholder))

    @property
    def literal_prefix(self) -> str:
        """The literal text before the first placeholder (all of it if there is none)."""
        prefix: list[str] = []
        for part in self.parts:
            if isinstance(part, _Placeholder):
                break
            prefix.append(part)
        return "".join(prefix)

    def literals(self) -> str:
        """All literal text, placeholders left out."""
        return "".join(p for p in self.parts if isinstance(p, str))

    def render(self, call: EffectCall, *, escape: Escape) -> str:
        """Same as :func:`render_template`."""
        return render_template(self, call, escape=escape)


def parse_template(text: object, *, setting: str) -> Template:
    """Parse and check ``text``; :class:`ConfigurationError` naming ``setting`` if it is not a
    string, has an unknown placeholder or an unmatched brace."""
    if not isinstance(text, str):
        raise ConfigurationError(f"{setting}: must be a string (a template), got {text!r}")
    parts: list[_Part] = []
    literal: list[str] = []
    pos = 0
    for match in _TOKEN.finditer(text):
        literal.append(text[pos:match.start()])
        pos = match.end()
        token = match.group(0)
        if token == "{{":
            literal.append("{")
        elif token == "}}":
            literal.append("}")
        elif match.group(1) is None:
            raise ConfigurationError(
                f"{setting}: unmatched {token!r} at position {match.start()} in {text!r}; "
                "write {{ or }} for a literal brace")
        else:
            if literal:
                parts.append("".join(literal))
                literal = []
            parts.append(_placeholder(match.group(1), setting))
    literal.append(text[pos:])
    if "".join(literal):
        parts.append("".join(literal))
    return Template(text, setting, tuple(parts))


def _placeholder(name: str, setting: str) -> _Placeholder:
    if name in PLACEHOLDERS:
        return _Placeholder(name)
    if name.startswith("payload."):
        path = tuple(name[len("payload."):].split("."))
        if len(path) <= _MAX_PATH and all(_SEGMENT.fullmatch(s) for s in path):
            return _Placeholder(name, path)
        raise ConfigurationError(
            f"{setting}: invalid payload path in placeholder {{{name}}}; write "
            "{payload.field} or {payload.field.sub} (field names without spaces, '$' or "
            f"braces, at most {_MAX_PATH} levels)")
    known = ", ".join("{" + p + "}" for p in (*PLACEHOLDERS, "payload.<path>"))
    raise ConfigurationError(f"{setting}: unknown placeholder {{{name}}}; use one of {known}")


def render_template(template: Template, call: EffectCall, *, escape: Escape) -> str:
    """``template`` filled in from ``call``, each value passed through ``escape``.

    :class:`PermanentEffectError` (``effect_rejected``) when a payload path is missing or not
    a scalar, or ``escape`` refuses a value; the message names the placeholder and setting."""
    out: list[str] = []
    for part in template.parts:
        if isinstance(part, str):
            out.append(part)
            continue
        value = _value(part, call, template.setting)
        try:
            out.append(escape(value))
        except ValueError as exc:
            raise PermanentEffectError(
                Reason.EFFECT_REJECTED,
                f"{template.setting}: placeholder {{{part.name}}}: {exc}") from None
    return "".join(out)


def _value(part: _Placeholder, call: EffectCall, setting: str) -> str:
    if not part.path:
        if part.name == "attempt":
            return str(call.attempt)
        if part.name == "correlation_id":
            return call.correlation_id or ""
        return str(getattr(call, part.name))
    current: Any = call.payload
    for i, key in enumerate(part.path):
        if isinstance(current, Mapping) and key in current:
            current = current[key]
        elif (isinstance(current, Sequence) and not isinstance(current, str | bytes)
              and key.isdigit() and int(key) < len(current)):
            current = current[int(key)]
        else:
            where = "payload." + ".".join(part.path[:i + 1])
            raise PermanentEffectError(
                Reason.EFFECT_REJECTED,
                f"{setting}: placeholder {{{part.name}}}: the payload has no {where}")
    return _scalar(current, part.name, setting)


def _scalar(value: Any, name: str, setting: str) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return value
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float) and math.isfinite(value):
        return repr(value)
    raise PermanentEffectError(
        Reason.EFFECT_REJECTED,
        f"{setting}: placeholder {{{name}}}: the payload value is a "
        f"{type(value).__name__}, not a string, number or boolean")


def url_escape(value: str) -> str:
    """Percent-encode every character that is not unreserved, so the value stays one path
    segment or one query value (``/``, ``?``, ``#``, ``$``, ``&``, spaces included). ``.``
    and ``..`` are refused: they are path navigation, not names."""
    if value in (".", ".."):
        raise ValueError(f"{value!r} is not allowed in a URL (a relative path segment)")
    return quote(value, safe="")


def header_escape(value: str) -> str:
    """The value as-is; :class:`ValueError` if it contains CR, LF or NUL (header
    injection)."""
    if "\r" in value or "\n" in value or "\x00" in value:
        raise ValueError("the value contains a line break or NUL, which would inject a header")
    return value


def text_escape(value: str) -> str:
    """The value as-is (mail body and other free text)."""
    return value


def load_spec(model: type[_Spec], settings: Mapping[str, Any], *, setting_prefix: str,
              hints: Mapping[str, str] | None = None) -> _Spec:
    """``settings`` validated into ``model`` (a pydantic model with ``extra="forbid"``);
    :class:`ConfigurationError` naming every wrong setting as ``{setting_prefix}.{field}``.
    ``hints`` adds advice for settings that are not fields (e.g. ``password``)."""
    if not isinstance(settings, Mapping):
        raise ConfigurationError(f"{setting_prefix}: must be a table of settings, got "
                                 f"{type(settings).__name__}")
    try:
        return model.model_validate(dict(settings))
    except ValidationError as exc:
        known = ", ".join(sorted(model.model_fields))
        problems: list[str] = []
        for error in exc.errors():
            loc = ".".join(str(x) for x in error["loc"])
            name = f"{setting_prefix}.{loc}" if loc else setting_prefix
            if error["type"] == "extra_forbidden":
                hint = (hints or {}).get(loc, "")
                problems.append(f"{name}: not a setting{hint}; known settings: {known}")
            elif error["type"] == "missing":
                problems.append(f"{name}: required")
            else:
                message = str(error["msg"]).removeprefix("Value error, ")
                problems.append(f"{name}: {message} (got {error.get('input')!r})")
        raise ConfigurationError("; ".join(problems)) from None
