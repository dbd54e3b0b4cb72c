"""Keys derived from user strings are unambiguous (``aggregates/core/keys.py``): the encoders as
properties, the collisions they fixed through the store writer, the dead-letter identity of
raw input lines, and ``aggbox migrate keys`` on stored data of the old format."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from aggbox.migrate import MOVED, migrate_keys
from aggregates import AggboxSettings
from aggregates.core.fieldnames import escape_key
from aggregates.core.ids import raw_message_id
from aggregates.core.keys import (
    archive_key,
    dead_letter_key,
    decode_hw_key,
    hw_key,
    hw_label,
    legacy_path,
    parked_key,
    read_hw,
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


@FAST
@given(parts=TRIPLE)
def test_keys_without_slash_or_percent_are_the_old_ones(parts: tuple[str, str, str]) -> None:
    """Stored data whose parts had no '/' or '%' needs no migration."""
    if not any("/" in p or "%" in p for p in parts):
        assert parked_key(*parts) == legacy_path(*parts) == dead_letter_key(*parts)
    t, i = parts[:2]
    if "/" not in t + i and "\x00" not in t + i:
        old = escape_key(f"{t}/{i}")  # how hw keys were written
        assert hw_key(t, i) == old and read_hw({old: 4}) == {old: 4}


def test_legacy_hw_key_with_several_slashes_marks_every_possible_source() -> None:
    old = escape_key("Shop/x/w.eb")
    assert read_hw({old: 5, hw_key("Shop/x", "w.eb"): 7}) == {
        hw_key("Shop", "x/w.eb"): 5, hw_key("Shop/x", "w.eb"): 7}
    assert decode_hw_key(old) is None and hw_label(old) == "Shop/x/w.eb"


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


# -- the migration (local server) ---------------------------------------------------------------
T0 = datetime(2026, 1, 1, tzinfo=UTC)


def old_dead_letter(mid: str, agg: str, *, attempts: int = 1, atype: str = "Counter"
                    ) -> dict[str, Any]:
    m = msg(mid, 1, agg=agg, atype=atype, mtype="Boom")
    return {"_id": legacy_path(atype, agg, mid), "message_id": mid, "aggregate_type": atype,
            "aggregate_id": agg, "message": m.to_dict(), "raw": None,
            "reason": Reason.HANDLER_ERROR,
            "status": "open", "attempts": attempts, "first_seen": T0, "last_seen": T0}


def old_raw_letter(line: str) -> dict[str, Any]:
    return {"_id": raw_message_id(repr(line)), "message_id": None, "message": None, "raw": line,
            "reason": Reason.INVALID_ENVELOPE, "status": "open", "attempts": 1, "first_seen": T0,
            "last_seen": T0}


def old_parked(mid: str, agg: str, seq: int) -> dict[str, Any]:
    m = msg(mid, seq, agg=agg, atype="Seq", source=("Up", "u", seq))
    return {"_id": legacy_path("seqs", agg, mid), "collection": "seqs", "aggregate_type": "Seq",
            "aggregate_id": agg, "message_id": mid, "message": m.to_dict(),
            "reason": Reason.SEQUENCE_GAP, "detail": "gap", "parked_at": T0, "last_seen": T0,
            "attempts": 1}


def seed_old_data(db: Any) -> None:
    db.aggbox_dead_letters.insert_many([
        old_dead_letter("z", "x/y", attempts=2),     # re-keyed
        old_dead_letter("m1", "o-1"),                # unchanged
        old_dead_letter("p%1", "o-2"),               # re-keyed: '%' is escaped now
        old_raw_letter('{"message_id": "r-1", "type": 1}'),
        old_raw_letter("{not json"),
        {**old_raw_letter("x" * 10 + "… (99 chars, truncated)"), "_id": "raw:feedface"},
    ])
    # A dead letter written again after the upgrade, before the migration: merged.
    db.aggbox_dead_letters.insert_one({**old_dead_letter("p%1", "o-2", attempts=3),
                                       "_id": dead_letter_key("Counter", "o-2", "p%1"),
                                       "first_seen": T0 + timedelta(days=1),
                                       "last_seen": T0 + timedelta(days=2)})
    db.aggbox_parked.insert_many([old_parked("z", "x/y", 2), old_parked("m2", "plain", 2)])
    db.monos.insert_one({"_id": "a1", "_v": 4, "state": {"total": 1, "items": [1]},
                         "hw": {escape_key("Shop/x/w.eb"): 5, "Up/u1": 2}})


@pytest.mark.mongo
def test_migrate_keys_rewrites_old_keys_idempotently(db: Any) -> None:
    seed_old_data(db)
    before = sorted(map(str, db.aggbox_dead_letters.find()))

    dry = migrate_keys(db, collections=["monos"], dry_run=True)
    assert sorted(map(str, db.aggbox_dead_letters.find())) == before  # nothing changed
    res = migrate_keys(db, collections=["monos"])
    assert {**dry.as_dict(), "dry_run": False} == res.as_dict()
    assert (res.dead_letters, res.raw_dead_letters, res.raw_left, res.parked, res.merged) == \
        (2, 2, 1, 1, 1)
    assert (res.hw_documents, res.hw_legacy_keys, res.hw_conflicts) == (1, 1, 0)

    letters = {d["_id"]: d for d in db.aggbox_dead_letters.find()}
    assert sorted(letters) == sorted([
        "Counter/x%2Fy/z", "Counter/o-1/m1", "Counter/o-2/p%251", "raw:feedface",
        raw_message_id('{"message_id": "r-1", "type": 1}'), raw_message_id("{not json")])
    assert letters["Counter/x%2Fy/z"]["attempts"] == 2
    merged = letters["Counter/o-2/p%251"]
    assert merged["attempts"] == 4 and merged[MOVED] == ["Counter/o-2/p%1"]
    assert merged["first_seen"].replace(tzinfo=UTC) == T0
    assert merged["last_seen"].replace(tzinfo=UTC) == T0 + timedelta(days=2)
    store = DeadLetterStore(db)
    for line, mid in [('{"message_id": "r-1", "type": 1}', "r-1"), ("{not json", None)]:
        [doc] = store.get([outcome_id(line, mid)])
        assert doc["raw"] == line and doc["_id"] == raw_message_id(line)

    assert sorted(d["_id"] for d in db.aggbox_parked.find()) == ["seqs/plain/m2",
                                                                 "seqs/x%2Fy/z"]
    doc = db.monos.find_one({"_id": "a1"})
    assert doc["hw"] == {"Up/u1": 2, hw_key("Shop", "x/w.eb"): 5, hw_key("Shop/x", "w.eb"): 5}
    assert doc["_v"] == 5

    # Idempotent: a second run finds nothing to do and changes nothing.
    snapshot = {c: sorted(map(str, db[c].find())) for c in
                ("aggbox_dead_letters", "aggbox_parked", "monos")}
    again = migrate_keys(db, collections=["monos"])
    assert (again.dead_letters, again.raw_dead_letters, again.parked, again.merged,
            again.hw_documents) == (0, 0, 0, 0, 0)
    assert snapshot == {c: sorted(map(str, db[c].find())) for c in snapshot}

    # The writer carries on with the migrated data: the parked message is released once.
    out = writer(db).process([msg("s1", 1, agg="x/y", atype="Seq", source=("Up", "u", 1))])
    assert sorted((o.message_id, o.outcome) for o in out) == [("s1", "applied"),
                                                              ("z", "applied")]
    assert db.aggbox_parked.count_documents({"aggregate_id": "x/y"}) == 0


@pytest.mark.mongo
def test_migrate_keys_resumes_after_an_interrupted_move(db: Any) -> None:
    # Interrupted after the copy, before the delete: attempts are not added twice.
    old = old_dead_letter("z", "x/y", attempts=2)
    new_id = dead_letter_key("Counter", "x/y", "z")
    db.aggbox_dead_letters.insert_many([old, {**old, "_id": new_id, MOVED: [old["_id"]]}])
    migrate_keys(db)
    [doc] = db.aggbox_dead_letters.find()
    assert doc["_id"] == new_id and doc["attempts"] == 2


@pytest.mark.mongo
def test_unmigrated_data_is_read_compatibly(db: Any) -> None:
    """Before `aggbox migrate keys` runs: old hw keys still deduplicate (conservatively),
    an old parked document is released and deleted."""
    seed_old_data(db)
    w = writer(db)
    out = w.process([msg("h1", 1, atype="Mono", source=("Shop/x", "w.eb", 5)),
                     msg("h2", 1, atype="Mono", source=("Shop", "x/w.eb", 5)),
                     msg("h3", 1, atype="Mono", source=("Up", "u1", 2)),
                     msg("h4", 1, atype="Mono", source=("Shop/x", "w.eb", 6))])
    assert kinds(out) == ["duplicate", "duplicate", "duplicate", "applied"]
    out = w.process([msg("s1", 1, agg="x/y", atype="Seq", source=("Up", "u", 1))])
    assert sorted((o.message_id, o.outcome) for o in out) == [("s1", "applied"),
                                                              ("z", "applied")]
    assert db.aggbox_parked.count_documents({"aggregate_id": "x/y"}) == 0


# -- the command --------------------------------------------------------------------------------


@pytest.mark.mongo
def test_aggbox_migrate_keys_command(db: Any, cli: Run) -> None:
    seed_old_data(db)
    rc, out, _ = cli("migrate", "keys", "--collection", "monos", "--dry-run")
    assert rc == 0 and "dry run: nothing changed" in out and "would be re-keyed: 2" in out
    assert db.aggbox_parked.find_one({"_id": "seqs/x/y/z"}) is not None
    rc, out, _ = cli("migrate", "keys", "--collection", "monos", "--json")
    counts = json.loads(out)
    assert rc == 0 and counts["dead_letters"] == 2 and counts["parked"] == 1
    assert counts["hw_legacy_keys"] == 1
    rc, out, _ = cli("migrate", "keys")
    assert rc == 0 and "re-keyed: 0 of messages" in out and "hw maps not checked" in out
    # The dead letter of a raw line is shown by the id its outcome reported.
    line = '{"message_id": "r-1", "type": 1}'
    rc, out, _ = cli("deadletters", "show", "r-1")
    assert rc == 0 and line in out
    rc, out, _ = cli("deadletters", "show", raw_message_id("{not json"))
    assert rc == 0 and "{not json" in out
