"""The ``_raw`` column of one Arrow batch, parsed by the native core without a Python
string per row (docs/design.md "The hot path").

:class:`RawColumn` is :attr:`spark.records.Rows.raw` when
:data:`aggregates.message.fastbatch.NATIVE_PROVE` is set: :meth:`RawColumn.prove` hands the
column's Arrow buffers to the native parse, which builds the message of each row it proves;
a row's text (``str``) exists only for the rows it does not prove — the exact path and the
dead letters read them (``rows.raw[row]``), as they read the list of the Python path. The
text of any other row is decoded from the batch when asked for. Rows that are not valid
UTF-8 are kept with ``\\xNN`` escapes and named in :attr:`RawColumn.bad_encoding`, as the
Python path keeps them (:func:`decode_record`).
"""

from __future__ import annotations

from typing import Any

from aggregates.message.envelope import Message
from aggregates.message.fastbatch import native_prove

__all__ = ["RawColumn", "decode_record", "native_column"]


def decode_record(b: bytes) -> tuple[str, str | None]:
    """A record's text and, when it is not valid UTF-8, why (the ``invalid_encoding``
    detail; the text then has ``\\xNN`` escapes: distinct bytes stay distinct)."""
    try:
        return b.decode("utf-8"), None
    except UnicodeDecodeError as exc:
        return b.decode("utf-8", "backslashreplace"), (
            f"the record is not valid UTF-8: byte 0x{b[exc.start]:02x} at byte offset "
            f"{exc.start} ({exc.reason}); fix the producer's encoding")


def native_column(batch: Any) -> RawColumn | None:
    """The batch's ``_raw`` column for the native parse, or None where the Python path
    reads it (no native parse, not a record batch's string column)."""
    import pyarrow as pa

    from aggregates.message.fastbatch import NATIVE_PROVE

    if NATIVE_PROVE is None or not isinstance(batch, pa.RecordBatch):
        return None
    arr = batch.column("_raw")
    if pa.types.is_string(arr.type) or pa.types.is_large_string(arr.type):
        return RawColumn(arr, pa.types.is_large_string(arr.type))
    return None


class RawColumn:
    """The ``_raw`` column: ``column[row]`` is the row's text (None: a null row), as in
    the Python path's list."""

    def __init__(self, arr: Any, large: bool) -> None:
        self._arr = arr
        self._large = large
        self._count = len(arr)
        self._binary: Any = None
        #: Each row's text where the native parse gave it (rows it did not prove).
        self._texts: list[str | None] | None = None
        self._bad: dict[int, str] | None = None

    def __len__(self) -> int:
        return self._count

    def __getitem__(self, row: int) -> Any:
        texts = self._texts
        if texts is not None:
            text = texts[row]
            if text is not None:
                return text
        b = self._bytes()[row].as_py()
        return None if b is None else decode_record(b)[0]

    def _bytes(self) -> Any:
        if self._binary is None:
            import pyarrow as pa

            self._binary = self._arr.view(pa.large_binary() if self._large else pa.binary())
        return self._binary

    @property
    def bad_encoding(self) -> dict[int, str]:
        """The rows that are not valid UTF-8 → the ``invalid_encoding`` detail."""
        if self._bad is None:  # not parsed yet: every row decoded here
            bad: dict[int, str] = {}
            for row, b in enumerate(self._bytes().to_pylist()):
                detail = None if b is None else decode_record(b)[1]
                if detail is not None:
                    bad[row] = detail
            self._bad = bad
        return self._bad

    def prove(self, max_payload: int, skip: list[bool] | None) -> list[Message | None]:
        """Each row's message where the native parse, or the Python fast path after it,
        proves one (:func:`aggregates.message.fastbatch.native_prove`); rows whose
        ``skip`` is true are not parsed."""
        arr = self._arr
        if self._count == 0:  # (an empty array may come without an offsets buffer)
            self._texts, self._bad = [], {}
            return []
        validity, offsets, data = arr.buffers()
        proven, texts, bad, _ = native_prove(data, offsets, validity, arr.offset, self._count,
                                             self._large, max_payload, skip)
        self._texts = texts
        if self._bad is None:
            self._bad = {row: str(decode_record(b)[1]) for row, b in bad}
        return proven
