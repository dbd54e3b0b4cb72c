"""Keys derived from user strings are unambiguous (``aggregates/core/keys.py``): the encoders as
properties, the collisions they fixed through the store writer and the dead-letter identity of
raw input lines."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from aggregates import AggboxSettings
from aggregates.core.ids import raw_message_id
from aggregates.core.keys import (
    archive_key,
    dead_letter_key,
    decode_hw_key,
    hw_key,
    hw_label,
    parked_key,
    split_parts,
)
from aggregates.core.reasons import Reason
from aggregates.debug.view import load_aggregate
from aggregates.dedup.archive import archive_key as archive_key_reexported
from aggregates.fold import DeadLetter
from aggregates.store.deadletters import DeadLetterStore, dead_letter_id, raw_line_id
from aggregates.store.parking import parked_id
from aggregates.testing import memory_database
from tests.aggregates.cli import Run, migrate_cli  # noqa: F401 (the cli fixture)
from tests.aggregates.contract import NOW, kinds, writer
from tests.aggregates.domain import msg, registry
from tests.hypo import examples

# -- the encoders: distinct inputs, distinct keys ----------------------------------------------
#: Parts made of the characters that matter (separators, escapes, length prefixes), empty
#: strings and any unicode.
TRICKY = st.sampled_from([*"/$.%:0123456789aZ\x00", "%2F", "%25", "%2E", "%24", "é", "😀"])
PART = st.one_of(st.lists(TRICKY, max_size=6).map("".join), st.text(max_size=6))
PAIR = st.tuples(PART, PART)
TRIPLE = st.tuples(PART, PART, PART)
FAST = settings(max_examples=examples(400), deadline=None, suppress_health_check=list(HealthCheck))


@FAST
@given(a=PAIR, b=PAIR)
def test_archive_keys_are_unambiguous(a: tuple[str, str], b: tuple[str, str]) -> None:
    assert (archive_key(*a) == archive_key(*b)) == (a == b)
    assert archive_key_reexported is archive_key


@FAST
@given(a=TRIPLE, b=TRIPLE)
def test_parked_and_dead_letter_keys_are_unambiguous(a: tuple[str, str, str],
                                                     b: tuple[str, str, str]) -> None:
    assert (parked_key(*a) == parked_key(*b)) == (a == b)
    assert (dead_letter_key(*a) == dead_letter_key(*b)) == (a == b)
    assert split_parts(parked_key(*a)) == list(a)
    assert parked_id(*a) == parked_key(*a)


@FAST
@given(a=PAIR, b=PAIR)
def test_hw_keys_are_unambiguous_safe_field_names_and_decode(a: tuple[str, str],
                                                              b: tuple[str, str]) -> None:
    assert (hw_key(*a) == hw_key(*b)) == (a == b)
    key = hw_key(*a)
    assert "." not in key and not key.startswith("$") and "\x00" not in key and key
    assert decode_hw_key(key) == a
    assert split_parts(hw_label(key)) == list(a)  # readable and still unambiguous
    assert (hw_label(hw_key(*a)) == hw_label(hw_key(*b))) == (a == b)


# -- the collisions, through the writer ---------------------------------------------------------
@pytest.fixture
def mdb() -> Any:
    return memory_database("aggbox_keys")


def test_two_parked_messages_whose_ids_joined_alike_are_both_released(mdb: Any) -> None:
    w = writer(mdb)
    # seqs/x/y/z: aggregate "x/y" + message "z", and aggregate "x" + message "y/z".
    parked = w.process([msg("z", 2, agg="x/y", atype="Seq", source=("Up", "u", 2)),
                        msg("y/z", 3, agg="x", atype="Seq", source=("Up", "u", 2))])
    assert [(o.outcome, o.reason) for o in parked] == [("parked", Reason.SEQUENCE_GAP)] * 2
    assert mdb.aggbox_parked.count_documents({}) == 2
    out = w.process([msg("a", 1, agg="x/y", atype="Seq", source=("Up", "u", 1)),
                     msg("b", 1, agg="x", atype="Seq", source=("Up", "u", 1))])
    released = sorted((o.aggregate_id, o.message_id, o.outcome) for o in out if o.from_parked)
    assert released == [("x", "y/z", "applied"), ("x/y", "z", "applied")]
    assert mdb.aggbox_parked.count_documents({}) == 0
    assert {d["_id"]: d["state"]["total"] for d in mdb.seqs.find()} == {"x/y": 3, "x": 4}


def test_a_new_source_is_not_a_duplicate_of_one_whose_key_joined_alike(mdb: Any) -> None:
    w = writer(mdb)
    assert kinds(w.process([msg("m1", 1, atype="Mono", source=("Shop/x", "web", 5))])) == \
        ["applied"]
    assert kinds(w.process([msg("m2", 2, atype="Mono", source=("Shop", "x/web", 3))])) == \
        ["applied"]
    assert kinds(w.process([msg("m3", 2, atype="Mono", source=("Shop", "x/web", 3))])) == \
        ["duplicate"]
    doc = mdb.monos.find_one({"_id": "a1"})
    assert doc["hw"] == {"Shop%2Fx/web": 5, "Shop/x%2Fweb": 3}
    view = load_aggregate(mdb, registry, "Mono", "a1", settings=AggboxSettings())
    assert view.high_water == {"Shop%2Fx/web": 5, "Shop/x%2Fweb": 3}


def test_two_dead_letters_whose_ids_joined_alike_are_both_kept(mdb: Any) -> None:
    w = writer(mdb)
    out = w.process([msg("z", agg="x/y", mtype="Boom"), msg("y/z", agg="x", mtype="Boom")])
    assert [o.reason for o in out] == [Reason.HANDLER_ERROR] * 2
    docs = {d["message_id"]: d for d in mdb.aggbox_dead_letters.find()}
    assert sorted(docs) == ["y/z", "z"]
    assert docs["z"]["_id"] == "Counter/x%2Fy/z" and docs["y/z"]["_id"] == "Counter/x/y%2Fz"
    assert docs["z"]["aggregate_id"] == "x/y" and docs["y/z"]["aggregate_id"] == "x"


def test_ordinary_ids_read_as_before(mdb: Any) -> None:
    w = writer(mdb)
    w.process([msg("m1", agg="o-1", mtype="Boom")])
    assert mdb.aggbox_dead_letters.find_one()["_id"] == "Counter/o-1/m1"


# -- dead letters of raw input: one identity with the outcome --------------------------------
def outcome_id(line: str, mid: str | None) -> str:
    """What spark/executor.py reports as the outcome's message_id."""
    return mid or raw_message_id(line)


RAW_LINES = [
    ('{"message_id": "m-7", "type": "Add"}', "m-7"),   # invalid envelope, string id
    ('{"message_id": 7, "type": "Add"}', None),        # id not a string
    ('{"message_id": "", "type": "Add"}', None),       # empty id
    ('{"message_id": "m-8"', None),                    # not JSON
    ("[1, 2]", None),                                  # JSON, not an object
    ("", None),
]


@pytest.mark.parametrize(("line", "mid"), RAW_LINES)
def test_raw_dead_letter_is_found_by_its_outcome_id(mdb: Any, line: str, mid: str | None
                                                    ) -> None:
    store = DeadLetterStore(mdb)
    letter = DeadLetter(None, line, Reason.INVALID_ENVELOPE, "bad row")
    ident = outcome_id(line, mid)
    assert raw_line_id(line) == ident
    store.write([letter], now=NOW)
    store.write([letter], now=NOW)  # idempotent: one document
    [doc] = store.get([ident])
    assert doc["message_id"] == ident and doc["attempts"] == 2 and doc["raw"] == line
    assert doc["_id"] == dead_letter_id(letter) == raw_message_id(line)


def test_an_explicit_message_id_wins_and_other_raw_values_keep_none(mdb: Any) -> None:
    store = DeadLetterStore(mdb)
    store.write([DeadLetter(None, "{x", Reason.INVALID_ENVELOPE, "bad", message_id="given"),
                 DeadLetter(None, {"id": "corrupt"}, "invalid_outbox_entry", "bad")], now=NOW)
    assert store.get(["given"])[0]["raw"] == "{x"
    corrupt = mdb.aggbox_dead_letters.find_one({"reason": "invalid_outbox_entry"})
    assert corrupt["message_id"] is None
    assert corrupt["_id"] == raw_message_id(repr({"id": "corrupt"}))
