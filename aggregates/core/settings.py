"""Settings: documented defaults, overridden by a TOML config file, overridden by
``AGGBOX_*`` environment variables (highest priority after explicit arguments).

The config file is ``--config`` on the command line, else ``$AGGBOX_CONFIG``; sections are
``[aggbox]`` (this module), ``[spark]`` and ``[dispatcher]``. ``config/aggbox.toml`` lists
every setting with its default and is checked against these models by the test suite.
"""

from __future__ import annotations

import contextvars
import difflib
import json
import os
import re
import tomllib
from pathlib import Path
from typing import Any, ClassVar, Literal, TypeVar

from pydantic import Field, ValidationError
from pydantic.fields import FieldInfo
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    SettingsError,
)

from aggregates.core.errors import ConfigurationError

_config_file: contextvars.ContextVar[Path | None] = contextvars.ContextVar(
    "aggbox_config_file", default=None
)

T = TypeVar("T", bound="SectionSettings")


def read_config_file(path: Path | str | None) -> dict[str, Any]:
    """The parsed TOML file, ``{}`` when no file is given. A missing or invalid file is an
    error that names it."""
    if path is None:
        env = os.environ.get("AGGBOX_CONFIG")
        if not env:
            return {}
        path = env
    p = Path(path)
    try:
        with p.open("rb") as fh:
            return tomllib.load(fh)
    except FileNotFoundError:
        raise ConfigurationError(f"config file {p} does not exist") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigurationError(f"config file {p} is not valid TOML: {exc}") from None


def _unknown_settings(section: str, unknown: list[str], known: list[str]) -> str:
    """One line per misspelt setting: the closest known name, or the known ones when none
    is close."""
    hints = []
    for name in unknown:
        close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
        hints.append(f"{name!r} (did you mean {close[0]!r}?)" if close else repr(name))
    text = f"config section [{section}]: unknown setting {', '.join(hints)}"
    if all("did you mean" in h for h in hints):
        return text
    return f"{text}; known: {', '.join(known)}"


class _FileSource(PydanticBaseSettingsSource):
    def __init__(self, settings_cls: type[BaseSettings]) -> None:
        super().__init__(settings_cls)
        section = getattr(settings_cls, "section", "aggbox")
        data = read_config_file(_config_file.get())
        values = data.get(section, {})
        if not isinstance(values, dict):
            raise ConfigurationError(f"config section [{section}] must be a table")
        unknown = sorted(set(values) - set(settings_cls.model_fields))
        if unknown:
            raise ConfigurationError(_unknown_settings(section, unknown,
                                                       sorted(settings_cls.model_fields)))
        self._values = values

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        return self._values.get(field_name), field_name, False

    def __call__(self) -> dict[str, Any]:
        return dict(self._values)


class SectionSettings(BaseSettings):
    """Base for a settings section; ``load()`` applies file then environment."""

    section: ClassVar[str] = "aggbox"

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (init_settings, env_settings, _FileSource(settings_cls))

    @classmethod
    def load(cls: type[T], *, config_file: Path | str | None = None, **overrides: Any) -> T:
        token = _config_file.set(Path(config_file) if config_file else None)
        try:
            return cls(**overrides)
        except ValidationError as exc:
            origins = [cls._origin(e["loc"], overrides) for e in exc.errors()]
            problems = "; ".join(
                f"{'.'.join(str(p) for p in e['loc'])}{f' (from {o})' if o else ''}: "
                f"{e['msg'].removeprefix('Value error, ')}"
                for e, o in zip(exc.errors(), origins, strict=True))
            where = (" or ".join(dict.fromkeys(origins)) if all(origins) else
                     f"the config file, the environment variable "
                     f"({cls.model_config.get('env_prefix', '')}<NAME>) or the option")
            raise ConfigurationError(
                f"invalid [{cls.section}] setting(s): {problems}. Fix {where}."
            ) from None
        except SettingsError as exc:  # an environment variable that is not valid JSON
            raise ConfigurationError(cls._env_json_problem(exc)) from None
        finally:
            _config_file.reset(token)

    @classmethod
    def env_name(cls, field: str) -> str:
        """The environment variable of a setting, e.g. ``AGGBOX_SPARK_PY_FILES``."""
        return f"{cls.model_config.get('env_prefix', '')}{field}".upper()

    @classmethod
    def _env_value(cls, field: str) -> str | None:
        name = cls.env_name(field)
        return next((v for k, v in os.environ.items() if k.upper() == name), None)

    @classmethod
    def _origin(cls, loc: tuple[int | str, ...], overrides: dict[str, Any]) -> str:
        """Where a value came from: the option, ``AGGBOX_X`` or "" (file or unknown)."""
        field = str(loc[0]) if loc else ""
        if field in overrides:
            return "the command-line option"
        if field in cls.model_fields and cls._env_value(field) is not None:
            return cls.env_name(field)
        return ""

    @classmethod
    def _env_json_problem(cls, exc: SettingsError) -> str:
        m = re.search(r'field "(\w+)"', str(exc))
        if m is None or m.group(1) not in cls.model_fields:
            return f"invalid [{cls.section}] setting from the environment: {exc}"
        field = m.group(1)
        name = cls.env_name(field)
        value = cls._env_value(field) or ""
        if "dict" in str(cls.model_fields[field].annotation):
            shape, example = "a JSON object", '{"key": "value"}'
        else:
            items = [v.strip() for v in value.split(",") if v.strip()] or ["value"]
            shape, example = "a JSON list", json.dumps(items)
        return (f"[{cls.section}] {field}: environment variable {name} is not valid JSON; "
                f"set it to {shape}, e.g. {name}='{example}', or unset it")


class AggboxSettings(SectionSettings):
    """Store and writer settings (section ``[aggbox]``, environment ``AGGBOX_<NAME>``)."""

    model_config = SettingsConfigDict(env_prefix="AGGBOX_", extra="forbid")
    section: ClassVar[str] = "aggbox"

    mongodb_uri: str | None = Field(
        None,
        description="MongoDB connection string. Unset: a local server is started "
        "(mongod on PATH, else mongo-java-server).",
    )
    database: str = Field("aggbox", description="Database holding aggregates, dead letters, "
                          "parked messages and dispatcher checkpoints.")
    dead_letter_collection: str = Field("aggbox_dead_letters",
                                        description="Collection of dead letters.")
    parked_collection: str = Field("aggbox_parked", description="Collection of parked messages.")
    chunk_aggregates: int = Field(500, ge=1, description="Aggregates per find + bulk_write.")
    chunk_messages: int = Field(5000, ge=1, description="Messages buffered per chunk at most.")
    slice_messages: int = Field(1000, ge=1, description="Messages of one aggregate per write; "
                                "a hot aggregate is written in several slices.")
    pipeline_depth: int = Field(2, ge=1, le=8, description="Chunks processed concurrently "
                                "(disjoint aggregates only): handlers of one chunk run while "
                                "another waits for MongoDB. 1 = strictly sequential.")
    tracing: Literal["messages", "chunks"] = Field(
        "messages", description="OpenTelemetry spans of the writer, when a tracer provider "
        "is configured in its process: messages = a span per chunk and one per applied "
        "message, whose context the emitted entries carry; chunks = only the span per chunk "
        "(links to its messages, events for those not applied), entries carry the input's "
        "own trace context — for pipelines where a span per message costs too much.")
    max_conflict_retries: int = Field(10, ge=0, description="Re-read/re-apply rounds after "
                                      "version conflicts before the messages are parked.")
    conflict_backoff_ms: float = Field(5.0, ge=0, description="First backoff after a conflict; "
                                       "doubles per round, with jitter.")
    conflict_backoff_max_ms: float = Field(500.0, ge=0, description="Backoff ceiling.")
    max_document_bytes: int = Field(8 * 1024 * 1024, ge=64 * 1024, le=15 * 1024 * 1024,
                                    description="Size budget per aggregate document (MongoDB's "
                                    "hard limit is 16 MiB).")
    max_payload_bytes: int = Field(512 * 1024, ge=1024, description="Largest accepted payload "
                                   "(BSON bytes); larger messages are dead-lettered.")
