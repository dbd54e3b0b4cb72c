"""The hot-path forms of the payload hash and the uuid5 ids give exactly what their
definitions give (issue 13: ids and hashes are a published contract)."""

from __future__ import annotations

import hashlib
import json
import uuid
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aggregates.core.ids import AGGBOX_NAMESPACE, _default, emitted_message_id, payload_hash, uuid5
from tests.hypo import examples


def _definition_hash(payload: Any) -> str:
    canon = json.dumps(payload, sort_keys=True, separators=(",", ":"), default=_default)
    return hashlib.blake2b(canon.encode(), digest_size=6).hexdigest()


_scalars = (st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True)
            | st.text() | st.binary(max_size=8)
            | st.datetimes(timezones=st.just(UTC)) | st.decimals(allow_nan=False))
_values = st.recursive(
    _scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner,
                                                                 max_size=4),
    max_leaves=12,
)


@settings(max_examples=examples(400), deadline=None)
@given(st.dictionaries(st.text(), _values, max_size=8))
def test_payload_hash_is_the_definition(payload: dict[str, Any]) -> None:
    assert payload_hash(payload) == _definition_hash(payload)


def test_payload_hash_known_values_and_errors() -> None:
    p = {"b": 1, "a": [1.5, True, None, "é\u2028"], "t": datetime(2026, 1, 2, tzinfo=UTC),
         "x": b"\x01"}
    assert payload_hash(p) == _definition_hash(p)
    circular: dict[str, Any] = {}
    circular["self"] = circular
    _fails_twice_as_a_cycle(payload_hash, circular)
    assert payload_hash({"a": 1}) == _definition_hash({"a": 1})


def _fails_twice_as_a_cycle(encode: Any, value: Any) -> None:
    """The same error as json's, twice: nothing left behind by the first failure."""
    for _ in range(2):
        with pytest.raises(ValueError, match="Circular reference"):
            encode(value)


@settings(max_examples=examples(400), deadline=None)
@given(st.text(), st.text(), st.text(), st.integers(min_value=0, max_value=10_000))
def test_emitted_id_is_uuid5(t: str, a: str, c: str, i: int) -> None:
    try:
        name = f"{len(t)}:{t}{len(a)}:{a}{len(c)}:{c}{i}"
        name.encode()
    except UnicodeEncodeError:
        return  # lone surrogates: uuid.uuid5 cannot encode them either
    assert emitted_message_id(t, a, c, i) == str(uuid.uuid5(AGGBOX_NAMESPACE, name))
    other = uuid.UUID("12345678-1234-5678-1234-567812345678")
    assert uuid5(other, name) == str(uuid.uuid5(other, name))


_bson_values = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-2**63, max_value=2**63 - 1)
    | st.floats() | st.text(max_size=10),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
        st.text(max_size=5).filter(lambda k: "\x00" not in k), inner, max_size=3),
    max_leaves=10,
)
_docs = st.dictionaries(st.text(max_size=6).filter(lambda k: "\x00" not in k), _bson_values,
                        max_size=5)


@settings(max_examples=examples(300), deadline=None)
@given(_docs, st.lists(_docs, min_size=1, max_size=3))
def test_one_encoding_gives_both_sizes(state: dict[str, Any], entries: list[Any]) -> None:
    # The identity the fold's fast size check (_Folder._fast_size) relies on.
    import bson

    from aggregates.fold.handler_result import entries_size
    both = len(bson.encode({"e": entries, "s": state})) - 3
    assert both == entries_size(entries) + len(bson.encode(state))


def test_slot_builder_builds_what_the_constructor_builds() -> None:
    from dataclasses import dataclass

    import pytest

    from aggregates.core.fastbuild import slot_builder, storable_text, utf8_encodable
    from aggregates.message.outcomes import Outcome, new_outcome

    args = ("m", "T", "a", "applied", None, None, ("e",), 2, True)
    built, made = new_outcome(*args), Outcome(*args)  # type: ignore[arg-type]
    assert built == made and type(built) is Outcome and repr(built) == repr(made)

    @dataclass(frozen=True, slots=True)
    class P:
        a: int
        b: str

    with pytest.raises(TypeError, match=r"fields are \('a', 'b'\)"):
        slot_builder(P, ("b", "a"))  # a reordered class fails at import, not silently

    @dataclass(frozen=True, slots=True)
    class Q:
        a: int

        def __post_init__(self) -> None:
            pass

    with pytest.raises(TypeError, match="__post_init__"):
        slot_builder(Q, ("a",))
    assert [storable_text(v) for v in ("x", "", "\ud800", 3, "é")] == [
        True, False, False, False, True]
    assert utf8_encodable("") and not utf8_encodable("a\udfff")
