"""The configuration examples of docs/side-effects.md are valid built-in effects, with the
guarantee the page gives each of them."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from dispatcher.effects.builtin import builtin_effects
from tests.docs.markdown import fenced_blocks

PAGE = Path(__file__).resolve().parents[2] / "docs" / "side-effects.md"


def test_the_pages_effect_tables_load_with_the_documented_guarantees(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SMTP_PASSWORD", "secret")
    monkeypatch.setenv("CARRIER_AUTHORIZATION", "Bearer t0ken")
    tables = [tomllib.loads(b.source) for b in fenced_blocks(PAGE) if b.language == "toml"]
    assert len(tables) == 2
    effects = {}
    for table in tables:
        effects.update({e.type: e for e in builtin_effects(table["dispatcher"]["effects"])})
    assert effects["BookShipment"].kind == "http"
    assert effects["BookShipment"].guarantee == "once"  # idempotent = true
    assert effects["SendConfirmation"].kind == "smtp"
    assert effects["SendConfirmation"].guarantee == "at-least-once"
    assert effects["SendConfirmation"].query is None
