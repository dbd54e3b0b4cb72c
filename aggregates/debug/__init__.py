"""Notebook debugging helpers: read-only (no Spark needed; pandas only for the functions that
return DataFrames — ``pip install aggbox[notebook]``).

- :func:`load_aggregate` → :class:`AggregateView`: state, ``_v``, inbox, high-water marks,
  pending outbox, ``_blocked`` and parked messages of one aggregate.
- :func:`replay` / :func:`replay_steps`: fold messages one at a time in memory, one row per
  outcome with the state changes; nothing is written.
- :func:`trace`: a message's causation chain through the outcome audit log; its
  ``diagram()`` (and a Scenario timeline's, :func:`timeline_diagram`) is a sequence diagram in
  SVG, :func:`outcome_chart` the outcomes by reason per run as a bar chart.
- :func:`dead_letters`, :func:`parked_messages`: listings as DataFrames.

Nothing here writes. The operations that do (``replay_dead_letters``,
``release_aggregate``, the dead-letter and parked stores) are in :mod:`aggregates.ops`.
"""

from aggregates.debug._deps import MissingDependency
from aggregates.debug.chart import OutcomeChart, outcome_chart
from aggregates.debug.diagram import SequenceDiagram, timeline_diagram, trace_diagram
from aggregates.debug.diff import MISSING, state_diff
from aggregates.debug.listing import (
    DEAD_LETTER_COLUMNS,
    PARKED_COLUMNS,
    dead_letter_record,
    dead_letters,
    parked_messages,
    parked_record,
)
from aggregates.debug.replay import REPLAY_COLUMNS, ReplayRun, ReplayStep, replay, replay_steps
from aggregates.debug.trace import Trace, trace
from aggregates.debug.view import AggregateView, InboxEntry, load_aggregate

__all__ = [
    "DEAD_LETTER_COLUMNS",
    "MISSING",
    "PARKED_COLUMNS",
    "REPLAY_COLUMNS",
    "AggregateView",
    "InboxEntry",
    "MissingDependency",
    "OutcomeChart",
    "ReplayRun",
    "ReplayStep",
    "SequenceDiagram",
    "Trace",
    "dead_letter_record",
    "dead_letters",
    "load_aggregate",
    "outcome_chart",
    "parked_messages",
    "parked_record",
    "replay",
    "replay_steps",
    "state_diff",
    "timeline_diagram",
    "trace",
    "trace_diagram",
]
