"""Reading a recorded CSV / NPY / Parquet file: the one reader behind ``streamtrace evaluate FILE``
(:func:`streamtrace.evaluation.tasks.file_task`) and ``streamtrace replay FILE``.

:func:`read_table` keeps every cell as the file has it (strings for CSV, numbers or None for
Parquet) with where each row is, so that a caller can say which row is bad; the helpers below
turn cells into numbers, and :func:`choose_columns` decides which columns are inputs, targets
and time for both commands. Errors are :class:`FileError`, which each command re-raises as its own.
"""
from __future__ import annotations

import csv
import math
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import numpy as np

__all__ = ["FileError", "Table", "Columns", "read_table", "load_npy", "parquet_columns", "number", "timestamp",
           "is_gap", "numbers", "is_time_like", "split_names", "pick", "choose_columns"]


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


# ---- which columns are what --------------------------------------------------------------------
@dataclass
class Columns:
    """The columns a command uses: ``inputs`` (sent as x / forecast), ``targets`` (supervised y;
    empty for a forecast), ``time`` (the column named as time, or None) and ``time_like``: numeric
    columns that look like a clock (see :func:`is_time_like`), left out of the default inputs."""
    inputs: list[str]
    targets: list[str]
    time: str | None = None
    time_like: list[str] = field(default_factory=list)

    @property
    def note(self) -> str:
        """One line saying which columns were left out as time-like ("" when none were)."""
        if not self.time_like:
            return ""
        names = ", ".join(repr(n) for n in self.time_like)
        return (f"column {names} looks like time (strictly increasing, even steps): left out of the inputs; "
                f"name the inputs with --columns to keep it")


TIME_LIKE_MIN = 10        # fewer rows than this are too few to tell a clock from data


def numbers(cells) -> np.ndarray:
    """Cells as float64 numbers, NaN where a cell is not one.

    Example: ``numbers(["1", "x", 2.5])`` is ``array([1. , nan, 2.5])``."""
    return np.array([number(c) for c in cells], np.float64)


def is_time_like(values) -> bool:
    """Whether a numeric column looks like a clock or a row counter rather than data: at least
    ``TIME_LIKE_MIN`` values, all finite, strictly increasing, and every value within half a step of the straight
    line from the first to the last (even steps, allowing timestamps rounded when written).

    Example: ``is_time_like(0.004 * np.arange(20))`` is True; ``is_time_like([0, 1, 3, 4] * 5)`` is False."""
    v = np.asarray(values, np.float64)
    if v.ndim != 1 or len(v) < TIME_LIKE_MIN or not np.all(np.isfinite(v)):
        return False
    steps = np.diff(v)
    if not np.all(steps > 0):
        return False
    step = (v[-1] - v[0]) / (len(v) - 1)
    line = v[0] + step * np.arange(len(v))
    return bool(np.max(np.abs(v - line)) <= 0.5 * step)


def split_names(text: str | None) -> list[str] | None:
    """A comma-separated list of column names or positions, as --columns / --target take it
    (None when not given).

    Example: ``split_names("a, b,")`` is ["a", "b"]."""
    return [c.strip() for c in text.split(",") if c.strip()] if text else None


def pick(table: Table, names, flag: str) -> list[str]:
    """Columns named (or given by position: "0", "1", ...) with ``flag``; FileError for one the
    file does not have.

    Example: for a table with columns ["t", "a"], ``pick(table, ["1"], "--columns")`` is ["a"]."""
    out = []
    for n in names:
        n = str(n).strip()
        if n not in table.columns and n.isdigit() and int(n) < len(table.names):
            n = table.names[int(n)]        # a column by position
        if n not in table.columns:
            raise FileError(f"{flag}: no column {n!r}; the file has {table.names}")
        if n in out:
            raise FileError(f"{flag}: column {n!r} is named twice")
        out.append(n)
    return out


def choose_columns(table: Table, columns=None, targets=None, time_column: str | None = None) -> Columns:
    """Inputs, targets and time of ``table``: ``columns`` / ``targets`` / ``time_column`` as the
    user named them (``--columns``, ``--target``, ``--time-column``). Without ``columns`` the
    inputs are every mostly-numeric column (more than half its cells numbers) that is not the
    time or a target, and not time-like (:func:`is_time_like`) while another column is left;
    those left out are in ``Columns.time_like`` (say ``Columns.note`` to the user).

    Example: a CSV ``t,a`` with rows ``0,0.3``, ``1,-0.2``, ``2,0.9``, ... (10 or more) gives
    inputs ["a"] and time_like ["t"]."""
    targets = pick(table, targets or [], "--target")
    times = pick(table, [time_column], "--time-column") if time_column else []
    if columns:
        inputs = pick(table, columns, "--columns")
        clash = [n for n in inputs if n in targets + times]
        if clash:
            raise FileError(f"--columns: {clash[0]!r} is also the " +
                            ("target" if clash[0] in targets else "time column"))
        return Columns(inputs, targets, times[0] if times else None)
    numeric = {}
    for n in table.names:
        if n not in targets + times:
            v = numbers(table.columns[n])
            if np.isfinite(v).sum() > len(v) / 2:
                numeric[n] = v
    clock = [n for n, v in numeric.items() if is_time_like(v)]
    if len(clock) == len(numeric):           # nothing else to use: a clock-like column is the data
        clock = []
    inputs = [n for n in numeric if n not in clock]
    if not inputs:
        raise FileError(f"no numeric columns to use as inputs in {table.names}; name them with --columns")
    return Columns(inputs, targets, times[0] if times else None, clock)
