"""Effects from configuration, no code: the tables under ``[dispatcher.effects]``, one per
message type, each with a ``kind`` — ``"http"`` (:mod:`~dispatcher.effects.http`) or
``"smtp"`` (:mod:`~dispatcher.effects.smtp`)::

    [dispatcher.effects.BookShipment]
    kind = "http"
    url = "https://shipping.example/shipments"
    on_success = "ShipmentBooked"
    on_failure = "ShipmentFailed"
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Final

from aggregates.core.errors import ConfigurationError
from aggregates.domain.effects import Effect, Effects
from dispatcher.effects.http import http_effect
from dispatcher.effects.smtp import smtp_effect

__all__ = ["KINDS", "builtin_effects"]

#: The built-in kinds: ``kind`` → the function building the effect from its settings.
KINDS: Final[Mapping[str, Callable[..., Effect]]] = {"http": http_effect, "smtp": smtp_effect}


def builtin_effects(config: Mapping[str, Mapping[str, Any]]) -> Effects:
    """The effects configured in ``config`` (``{message_type: {"kind": …, …}}``, as the TOML
    table ``[dispatcher.effects]`` gives it); :class:`ConfigurationError` naming the setting
    (``effects.<type>.<setting>``) for anything wrong."""
    if not isinstance(config, Mapping):
        raise ConfigurationError(f"effects: must be a table of message types, got "
                                 f"{type(config).__name__}")
    effects = Effects()
    for message_type, settings in config.items():
        prefix = f"effects.{message_type}"
        if not isinstance(message_type, str) or not message_type:
            raise ConfigurationError(f"{prefix}: a message type must be a non-empty string")
        if not isinstance(settings, Mapping):
            raise ConfigurationError(f"{prefix}.kind: {prefix} must be a table with a kind "
                                     f"({' or '.join(sorted(KINDS))}), got {settings!r}")
        kind = settings.get("kind")
        build = KINDS.get(kind) if isinstance(kind, str) else None
        if build is None:
            raise ConfigurationError(
                f"{prefix}.kind: unknown effect kind {kind!r}; use one of "
                f"{', '.join(repr(k) for k in sorted(KINDS))} (effects written in Python are "
                "registered with aggregates.domain.effects.Effects)")
        effects.add(build(message_type, settings, setting_prefix=prefix))
    return effects
