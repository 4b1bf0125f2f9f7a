"""Reading a recipe from TOML: tables filled into the section dataclasses, unknown keys and wrong
types refused as a ``ConfigError`` naming the key.

>>> from streamtrace.recipe.sections import ModelConfig
>>> fill_section(ModelConfig(), {"n_in": 3}, "model.").n_in
3
"""
from __future__ import annotations

import tomllib
from dataclasses import fields, is_dataclass
from pathlib import Path

from .errors import ConfigError
from .quantities import QUANTITY_KEYS
from .sections import StreamConfig

__all__ = ["read_toml", "fill", "fill_section", "stream_section", "renamed", "RENAMED"]

_KIND = {"int": "an integer", "float": "a number", "str": "a string", "bool": "true or false"}
# sections renamed: the old name is still read, with a warning
RENAMED = {"signal": "transform"}


def renamed(data: dict) -> dict:
    """``data`` with each old section name (:data:`RENAMED`) read as its new one, warning once
    per file (``FutureWarning``); both names at once is a ``ConfigError``.

    >>> import warnings
    >>> with warnings.catch_warnings(record=True) as caught:
    ...     warnings.simplefilter("always")
    ...     renamed({"signal": {"normalise": True}}), str(caught[0].message)
    ({'transform': {'normalise': True}}, '[signal] is now called [transform]; please rename it (read as [transform])')
    """
    if not any(old in data for old in RENAMED):
        return data
    import warnings
    out = dict(data)
    for old, new in RENAMED.items():
        if old in out:
            if new in out:
                raise ConfigError(old, f"[{old}] is the old name of [{new}]: give one of them")
            warnings.warn(f"[{old}] is now called [{new}]; please rename it (read as [{new}])", FutureWarning,
                          stacklevel=3)
            out[new] = out.pop(old)
    return out


def fill(obj, data: dict, where: str = "", quantities=QUANTITY_KEYS) -> set:
    """Set the fields of dataclass ``obj`` (nested dataclasses are tables) from ``data``.

    Parameters
    ----------
    obj : dataclass instance
        Filled in place.
    data : dict
        Parsed TOML (a table).
    where : str
        The prefix of the keys named in errors (``"model."``; ``""`` at the top).
    quantities : set of str
        The ``"section.key"`` names that may hold a quantity string (``"20 ms"``), converted
        later by ``quantities.resolve`` (default: the recipe's).

    Returns
    -------
    set of str
        The ``"section.key"`` names ``data`` set.
    """
    names = {f.name for f in fields(obj)}
    given = set()
    if not where:
        data = renamed(data)
    for key, value in data.items():
        if key not in names:
            what = "section" if not where else "key"
            raise ConfigError(f"{where}{key}", f"unknown {what}; known: {', '.join(sorted(names))}")
        current = getattr(obj, key)
        if is_dataclass(current):
            if not isinstance(value, dict):
                raise ConfigError(f"{where}{key}", f"must be a table ([{where}{key}]); got {value!r}")
            given |= fill(current, value, f"{where}{key}.", quantities)
            continue
        given.add(f"{where}{key}")
        setattr(obj, key, _typed(current, value, f"{where}{key}", quantities))
    return given


def _typed(current, value, key: str, quantities):
    want = type(current)
    if isinstance(value, str) and want in (int, float) and key in quantities:
        return value                 # a quantity ("20 ms"): converted by validate()
    if want is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if want is list and isinstance(value, (int, float)) and not isinstance(value, bool):
        value = [value]      # one value where a list of them is allowed (readout.delta)
    if not isinstance(value, want) or (want is int and isinstance(value, bool)):
        raise ConfigError(key, f"must be {_KIND.get(want.__name__, want.__name__)}; got {value!r}")
    return value


def read_toml(path: str | Path) -> dict:
    """The parsed TOML file ``path``; a missing, unreadable or invalid file is a ``ConfigError``
    naming ``--config``."""
    try:
        return tomllib.loads(Path(path).read_text())
    except FileNotFoundError:
        raise ConfigError("--config", f"file {path} not found") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError("--config", f"cannot read {path}: {e}") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError("--config", f"{path}: invalid TOML: {e}") from None


def fill_section(obj, data: dict, where: str, quantities=QUANTITY_KEYS):
    """Set the fields of dataclass ``obj`` from ``data``, refusing unknown keys and wrong types
    as ``ConfigError`` naming ``where``+key (for sections other modules own, e.g. bridges).
    Returns ``obj``."""
    if not isinstance(data, dict):
        raise ConfigError(where.rstrip("."), f"must be a table ([{where.rstrip('.')}]); got {data!r}")
    fill(obj, data, where, quantities)
    return obj


def stream_section(data: dict) -> StreamConfig:
    """``[stream]`` of a parsed TOML ``data`` (absent: nothing declared), its rate in hertz and its
    units checked; a bad value is a ``ConfigError`` naming the key. What the bridges read of the
    serve config (the engine reads it with the rest).

    >>> stream_section({"stream": {"rate": "2 kHz", "units": ["mV"]}})
    StreamConfig(rate=2000.0, units=['mV'])
    """
    from ..units import UnitError
    from .quantities import resolve_stream
    stream = fill_section(StreamConfig(), data.get("stream", {}), "stream.")
    try:
        return resolve_stream(stream)
    except UnitError as e:
        raise ConfigError(e.key, e.problem) from None
