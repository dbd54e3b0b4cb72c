"""The generator: deterministic, the requested sizes, and order-insensitive by construction."""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from pathlib import Path

import pytest

from aggbox.demo.errors import DemoError
from aggbox.demo.generate import ScenarioSpec, generate, write_lines
from aggbox.demo.model import read_records


def test_same_seed_same_input_other_seed_other_input() -> None:
    spec = ScenarioSpec(customers=10, orders=50, seed=4)
    assert generate(spec).lines == generate(spec).lines
    assert generate(spec).lines != generate(ScenarioSpec(customers=10, orders=50, seed=5)).lines


def test_sizes_duplicates_and_bad_rows() -> None:
    sc = generate(ScenarioSpec(customers=10, orders=100, duplicate_rate=0.25, seed=1))
    assert len(sc.customers) == 10 and len(sc.orders) == 100
    assert len(sc.messages) == 110
    assert sc.duplicates == round(0.25 * 110)
    assert len(sc.lines) == 110 + sc.duplicates + 4
    assert {b.reason for b in sc.bad_rows} == {
        "invalid_json", "handler_error", "unknown_message_type", "unknown_aggregate_type"}
    valid = Counter(line for line in sc.lines if line not in {b.line for b in sc.bad_rows})
    assert len(valid) == 110  # every message at least once
    assert sum(valid.values()) - len(valid) == sc.duplicates  # copies are exact
    ids = {json.loads(line)["message_id"] for line in valid}
    assert len(ids) == 110


def test_normal_orders_always_fit_and_oversized_never_do() -> None:
    sc = generate(ScenarioSpec(customers=30, orders=400, seed=9))
    limit = {c.customer_id: c.credit_limit for c in sc.customers}
    normal_sum: dict[str, int] = defaultdict(int)
    for o in sc.orders:
        if o.oversized:
            assert o.amount > limit[o.customer_id]
        else:
            assert o.amount > 0
            normal_sum[o.customer_id] += o.amount
    assert all(normal_sum[c] <= limit[c] for c in limit)
    assert any(normal_sum[c] == limit[c] for c in normal_sum)  # the boundary is exercised
    assert 0 < sum(o.oversized for o in sc.orders) < len(sc.orders)


def test_without_reorder_valid_messages_keep_their_natural_order() -> None:
    sc = generate(ScenarioSpec(customers=5, orders=20, reorder=False, bad_rows=False, seed=2))
    natural = [json.dumps(m, separators=(",", ":")) for m in sc.messages]
    assert list(sc.lines[: len(natural)]) == natural
    shuffled = generate(ScenarioSpec(customers=5, orders=20, bad_rows=False, seed=2))
    assert list(shuffled.lines[: len(natural)]) != natural


def test_files_cover_every_line_in_order(tmp_path: Path) -> None:
    sc = generate(ScenarioSpec(customers=7, orders=33, files=3, seed=3))
    paths = write_lines(tmp_path, sc.files())
    assert [p.name for p in paths] == ["part-00.jsonl", "part-01.jsonl", "part-02.jsonl"]
    assert read_records([tmp_path]) == list(sc.lines)


@pytest.mark.parametrize("spec", [
    ScenarioSpec(customers=0),
    ScenarioSpec(orders=-1),
    ScenarioSpec(duplicate_rate=-0.1),
    ScenarioSpec(files=0),
])
def test_bad_specs_are_refused(spec: ScenarioSpec) -> None:
    with pytest.raises(DemoError):
        generate(spec)


def test_more_orders_per_customer_than_its_inbox_window_is_refused() -> None:
    with pytest.raises(DemoError, match="inbox window"):
        generate(ScenarioSpec(customers=1, orders=1000, seed=1))
