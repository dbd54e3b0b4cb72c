"""Optional dependencies of the notebook helpers, imported only when needed."""

from __future__ import annotations

import importlib
from collections.abc import Mapping, Sequence
from types import ModuleType
from typing import TYPE_CHECKING, Any

from aggregates.core.errors import AggboxError

if TYPE_CHECKING:
    import pandas as pd


class MissingDependency(AggboxError, ImportError):
    """An optional package is not installed; the message says what to install."""


def require_pandas(feature: str) -> ModuleType:
    """``import pandas``, or raise :class:`MissingDependency` naming ``feature``."""
    try:
        return importlib.import_module("pandas")
    except ImportError:
        raise MissingDependency(
            f"{feature} needs pandas, which is not installed; install the notebook extras "
            "with `pip install aggbox[notebook]` (or `pip install pandas`)"
        ) from None


def make_frame(feature: str, records: Sequence[Mapping[str, Any]], columns: Sequence[str]
               ) -> pd.DataFrame:
    """A DataFrame of ``records`` with ``columns`` in this order (pandas imported here)."""
    pandas = require_pandas(feature)
    frame: pd.DataFrame = pandas.DataFrame(list(records), columns=list(columns))
    return frame
