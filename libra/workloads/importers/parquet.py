"""Parquet files (the form datasets of agent trajectories are published in) as records, one per row.

A file is Parquet when it starts with the format's magic bytes `PAR1`, whatever its name. Its rows are read in
batches with pyarrow (an optional dependency: `pip install 'libra[parquet]'`; without it a Parquet file is a
one-line error saying so) and handed to the importers as the JSON records a JSON Lines export of the same dataset
would hold: nested lists and structs as lists and objects, dates and times as ISO text, bytes as text. Errors name
the file and the row (counted from 1), where JSON Lines errors name the line.
"""

from __future__ import annotations

import base64
import datetime as dt
import decimal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from libra.workloads.trace import TraceError

MAGIC = b"PAR1"
_BATCH_ROWS = 256  # rows of nested messages can be large: a few hundred at a time bound the memory of a batch


def is_parquet(path: Path) -> bool:
    """Whether the file starts with Parquet's magic bytes (a file that cannot be opened is not: the reader names
    why)."""
    try:
        with path.open("rb") as f:
            return f.read(len(MAGIC)) == MAGIC
    except OSError:
        return False


def iter_rows(path: Path) -> Iterator[tuple[int, Any]]:
    """`(row, record)` for each row of a Parquet file, rows counted from 1."""
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        raise TraceError(
            path, None, None, "a Parquet file: reading it needs pyarrow (pip install 'libra[parquet]')"
        ) from None
    row = 0
    try:
        table = pq.ParquetFile(path)
        for batch in table.iter_batches(batch_size=_BATCH_ROWS):
            for record in batch.to_pylist():
                row += 1
                yield row, _plain(record)
    except (pa.ArrowException, OSError) as exc:
        where = f" after row {row}" if row else ""
        raise TraceError(path, None, None, f"not a whole Parquet file{where} ({exc})") from None
    if row == 0:
        raise TraceError(path, None, None, "file is empty (a Parquet file with no rows)")


def _plain(value: Any) -> Any:
    """A row's value as JSON would hold it."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        if value and all(isinstance(x, tuple) and len(x) == 2 for x in value):  # a Parquet map: (key, value) pairs
            return {str(k): _plain(v) for k, v in value}
        return [_plain(x) for x in value]
    if isinstance(value, dt.datetime | dt.date | dt.time):
        return value.isoformat()
    if isinstance(value, dt.timedelta):
        return value.total_seconds()
    if isinstance(value, decimal.Decimal):
        return float(value)
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError:
            return base64.b64encode(value).decode("ascii")
    return value
