"""Secrets of built-in effects, named in the configuration and read from the environment
(a password or token never goes in a configuration file): checked when the effect is loaded,
read again at every call (a restarted process picks up a rotated value)."""

from __future__ import annotations

import os
import re
from typing import Final

from aggregates.core.errors import ConfigurationError
from aggregates.core.reasons import Reason
from aggregates.domain.effects import PermanentEffectError

__all__ = ["check_env_secret", "read_env_secret"]

_ENV_NAME: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
#: Characters a secret may not hold when it goes into a protocol line (header injection).
_LINE_BREAKS: Final = ("\r", "\n", "\x00")


def check_env_secret(name: str, *, setting: str, what: str = "the secret",
                     one_line: bool = False) -> None:
    """Raise :class:`ConfigurationError` unless ``name`` is a valid environment variable
    name that is set (and, with ``one_line``, holds no line break)."""
    if not _ENV_NAME.fullmatch(name):
        raise ConfigurationError(f"{setting}: must be the NAME of an environment variable "
                                 f"holding {what}, got {name!r}")
    value = os.environ.get(name)
    if value is None:
        raise ConfigurationError(f"{setting}: the environment variable {name} is not set")
    if one_line and any(c in value for c in _LINE_BREAKS):
        raise ConfigurationError(f"{setting}: the environment variable {name} holds a line "
                                 "break; a header value must be one line")


def read_env_secret(name: str, *, setting: str, one_line: bool = False) -> str:
    """The value of ``name`` at call time; a variable gone (or, with ``one_line``, holding a
    line break) fails the call permanently, naming the setting."""
    value = os.environ.get(name)
    if value is None:
        raise PermanentEffectError(Reason.EFFECT_REJECTED,
                                   f"the environment variable {name} ({setting}) is not set")
    if one_line and any(c in value for c in _LINE_BREAKS):
        raise PermanentEffectError(Reason.EFFECT_REJECTED,
                                   f"the environment variable {name} ({setting}) holds a "
                                   "line break")
    return value
