"""Reading a recorded CSV / NPY / Parquet file: the one reader behind ``streamtrace evaluate FILE``
(:func:`streamtrace.tasks.load_file`) and ``streamtrace replay FILE``.

:func:`read_table` keeps every cell as the file has it (strings for CSV, numbers or None for
Parquet) with where each row is, so that a caller can say which row is bad; the helpers below
turn cells into numbers. Errors are :class:`FileError`, which each command re-raises as its own.
"""
from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import numpy as np

__all__ = ["FileError", "Table", "read_table", "load_npy", "parquet_columns", "number", "timestamp", "is_gap"]


class FileError(ValueError):
    """A file that cannot be read as a table of time steps."""


@dataclass
class Table:
    names: list[str]
    columns: dict[str, list]  # name -> raw cells (strings for CSV, numbers or None otherwise)
    where: list[str]          # per row, where it is in the file ("line 7", "row 3")

    def __len__(self):
        return len(self.where)


def is_gap(cell) -> bool:
    """An empty or not-a-number cell (``""``, ``nan``, ``na``, a Parquet null, a NaN)."""
    if cell is None:
        return True
    if isinstance(cell, str):
        return cell.strip().lower() in ("", "nan", "na")
    return isinstance(cell, (float, np.floating)) and math.isnan(cell)


def number(cell) -> float:
    """A cell as a float; NaN when it is not one (text, empty, null)."""
    if cell is None or isinstance(cell, bool):
        return math.nan
    if isinstance(cell, (int, float, np.integer, np.floating)):
        return float(cell)
    try:
        return float(str(cell).strip())
    except ValueError:
        return math.nan


def timestamp(cell) -> float:
    """Seconds: a number as it is, a date-time (Parquet), or an ISO 8601 string; NaN when neither."""
    if isinstance(cell, datetime):
        return cell.timestamp()
    t = number(cell)
    if not math.isnan(t) or not isinstance(cell, str):
        return t
    try:
        return datetime.fromisoformat(cell.strip()).timestamp()
    except ValueError:
        return math.nan


def _is_value(cell: str) -> bool:
    """Data rather than a column name: a number, a gap or a date-time."""
    return is_gap(cell) or not math.isnan(timestamp(cell))


def load_npy(path: str | Path) -> np.ndarray:
    """A 1-D or 2-D numeric .npy file as a (time, channels) float64 array (no pickles)."""
    try:
        x = np.load(path, allow_pickle=False)
    except ValueError as e:
        raise FileError(f"{path}: not a numeric .npy array ({e})") from None
    if x.dtype.kind not in "fiu" or x.ndim not in (1, 2):
        raise FileError(f"{path}: need a 1-D or 2-D numeric array; got {x.dtype} of shape {x.shape}")
    return x.reshape(len(x), -1).astype(np.float64)


def parquet_columns(path: str | Path) -> dict[str, list]:
    """A Parquet file's columns by name, as Python lists (pyarrow is optional: only this needs it)."""
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise FileError(f"{path}: reading Parquet needs pyarrow (pip install pyarrow), "
                        "or convert the file to CSV / NPY") from None
    try:
        return pq.read_table(path).to_pydict()
    except Exception as e:   # pyarrow raises several kinds for a damaged file
        raise FileError(f"{path}: not a readable Parquet file ({e})") from None


def _read_csv(path: Path) -> Table:
    try:
        with open(path, newline="") as fh:
            reader = csv.reader(fh)
            rows = [(reader.line_num, r) for r in reader if r and any(c.strip() for c in r)]
    except (UnicodeDecodeError, csv.Error) as e:
        raise FileError(f"{path}: not a readable CSV file ({e})") from None
    if not rows:
        raise FileError(f"{path}: empty file")
    header = not all(_is_value(c) for c in rows[0][1])
    body = rows[1:] if header else rows
    width = max([len(rows[0][1])] + [len(r) for _, r in body])
    names = [c.strip() for c in rows[0][1]] if header else []
    names += [str(j) for j in range(len(names), width)]
    if len(set(names)) != len(names):
        raise FileError(f"{path}: the header names a column twice: {names}")
    columns = {n: [r[j] if j < len(r) else "" for _, r in body] for j, n in enumerate(names)}
    return Table(names, columns, [f"line {line}" for line, _ in body])


def read_table(path: str | Path) -> Table:
    """The named columns of a CSV (header row optional: a first row with a cell that is not a
    number, gap or date-time names the columns; else "0", "1", ...), NPY (columns "0", "1", ...)
    or Parquet file, cells kept as they are so that bad ones can be reported row by row."""
    path = Path(path)
    if not path.is_file():
        raise FileError(f"{path}: no such file")
    suffix = path.suffix.lower()
    if suffix == ".parquet":
        cols = parquet_columns(path)
        n = len(next(iter(cols.values()), []))
        return Table(list(cols), {str(k): list(v) for k, v in cols.items()}, [f"row {i + 1}" for i in range(n)])
    if suffix == ".npy":
        a = load_npy(path)
        names = [str(j) for j in range(a.shape[1])]
        return Table(names, {n: a[:, j] for j, n in enumerate(names)}, [f"row {i + 1}" for i in range(len(a))])
    return _read_csv(path)
