"""Hot-path helpers shared by the fold and the pipeline's executor (pure, no I/O).

:func:`slot_builder` makes a function that builds an instance of a frozen, slotted dataclass
by filling its slots directly: the same object its ``__init__`` would build (equal, same
slots), without one ``object.__setattr__`` call per field (about 2 µs for nine fields, 0.7 µs
this way). :func:`storable_text` / :func:`utf8_encodable` are the one test of "a string MongoDB can
store"."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["slot_builder", "storable_text", "utf8_encodable"]

T = TypeVar("T")


def slot_builder(cls: type[T], expected: tuple[str, ...]) -> Callable[..., T]:
    """A function taking every field of ``cls`` positionally, in ``expected`` order (which
    must be the dataclass's field order: checked here, so a changed class fails at import,
    not with swapped values), returning the instance. Only for frozen, slotted dataclasses
    without ``__post_init__`` (nothing would run it)."""
    if not dataclasses.is_dataclass(cls) or "__slots__" not in cls.__dict__:
        raise TypeError(f"{cls.__name__} is not a slotted dataclass")
    if hasattr(cls, "__post_init__"):
        raise TypeError(f"{cls.__name__} has __post_init__, which slot_builder would skip")
    names = tuple(f.name for f in dataclasses.fields(cls))
    if names != expected:
        raise TypeError(f"{cls.__name__}'s fields are {names}, not {expected}")
    ns: dict[str, Any] = {"_new": object.__new__, "_cls": cls}
    for i, n in enumerate(names):
        ns[f"_s{i}"] = cls.__dict__[n].__set__
    args = ", ".join(f"a{i}" for i in range(len(names)))
    body = "".join(f"    _s{i}(o, a{i})\n" for i in range(len(names)))
    exec(f"def build({args}):\n    o = _new(_cls)\n{body}    return o\n", ns)
    build: Callable[..., T] = ns["build"]
    build.__qualname__ = build.__name__ = f"build_{cls.__name__}"
    return build


def utf8_encodable(value: str) -> bool:
    """``value`` encodes as UTF-8 (holds no lone surrogate): what MongoDB can store."""
    if value.isascii():
        return True
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def storable_text(value: object) -> bool:
    """A non-empty ``str`` MongoDB can store (:func:`utf8_encodable`)."""
    return isinstance(value, str) and value != "" and utf8_encodable(value)
