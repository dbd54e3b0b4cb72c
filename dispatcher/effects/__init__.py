"""The effect runner: executes outbox entries whose type has a registered effect instead of
publishing them (docs/design.md "Side effects").

Modules: :mod:`~dispatcher.effects.attempts` (the attempt records in MongoDB),
:mod:`~dispatcher.effects.runner` (one entry: attempt → call → result → reply),
:mod:`~dispatcher.effects.router` (the publisher that routes effect entries to the runner and
the rest to the broker), :mod:`~dispatcher.effects.builtin` (effects from configuration:
:mod:`~dispatcher.effects.http` webhooks and :mod:`~dispatcher.effects.smtp` e-mail, with
:mod:`~dispatcher.effects.templates`). Imports ``core``, ``publishers`` and ``observe``.
"""

from __future__ import annotations
