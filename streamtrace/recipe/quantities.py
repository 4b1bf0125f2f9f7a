"""Which settings accept physical quantities, and their conversion into what the learner and the
engine work in (steps, seconds, per-step rates), with the stream's declared sample rate
(``[stream]``).

A key in :data:`QUANTITY_KEYS` (the recipe's; the engine adds its own) may be written as a quantity string (``"20 ms"``); a bare number
keeps its old meaning. :func:`resolve` replaces every such string of a config with the plain
number, ``[stream]`` first (its rate converts the durations). Problems are
:class:`streamtrace.units.UnitError` naming the key (the config turns them into its errors).
"""
from __future__ import annotations

import math

from streamtrace import units

__all__ = ["QUANTITY_KEYS", "STEPS", "SECONDS", "MICROSECONDS", "resolve", "resolve_stream", "whole_steps", "convert",
           "screen_range"]

STEPS = "steps"              # a number of steps; a duration * rate
SECONDS = "seconds"          # a duration in seconds
MICROSECONDS = "microseconds"
PER_STEP = "per-step rate"   # a fraction per step: a frequency / rate, or one over a time constant's steps
MEMORY = "forgetting factor"  # 1 - 1 / (the memory's steps)
HZ = "hertz"

QUANTITY_KEYS = {
    "stream.rate": HZ,
    "reservoir.leak": PER_STEP,
    "transform.normalise_warmup": STEPS,
    "transform.normalise_rate": PER_STEP,
    "transform.feedback": STEPS,
    "readout.lam": MEMORY,
    "readout.change_lam": MEMORY,
    "readout.change_hold": STEPS,
    "readout.change_fast": STEPS,
    "readout.change_slow": STEPS,
    "learning.decay": MEMORY,
    "learning.learn_every": STEPS,
    "learning.horizon": STEPS,
    "learning.label_delay": STEPS,
    "combine.period": STEPS,
    "combine.max_period": STEPS,
    "combine.window": STEPS,
    "metrics.window": STEPS,
    "screen.rate": PER_STEP,
}


def whole_steps(value, *, key: str, rate_hz: float | None) -> int:
    """:func:`streamtrace.units.to_steps` rounded to the nearest step; a duration shorter than
    half a step is refused (it would silently become 0).

    >>> whole_steps("1 s", key="metrics.window", rate_hz=256.0)
    256
    >>> whole_steps(12, key="learning.horizon", rate_hz=None)
    12
    """
    steps = units.to_steps(value, key=key, rate_hz=rate_hz)
    if not isinstance(value, str):
        return value                  # a bare number: the config's range checks judge it
    n = round(steps)
    if steps > 0 and n == 0:
        raise units.UnitError(key, f"{value!r} is {steps:.3g} steps at {rate_hz:g} Hz: shorter than one step")
    return int(n)


def _per_step(value, key: str, rate_hz):
    """A fraction per step from a frequency (f / rate) or a time constant (1 / its steps)."""
    if not isinstance(value, str):
        return value
    try:
        hz = units.to_hz(value, key=key)
    except units.UnitError:
        steps = units.to_steps(value, key=key, rate_hz=rate_hz)   # a time constant, or the refusal
        return 1.0 / steps if steps > 0 else math.inf
    if not rate_hz:
        raise units.UnitError(key, f"{value!r} is a frequency: a rate per step needs the stream's sample rate; "
                                   "declare it ([stream] rate = \"250 Hz\") or give the fraction per step")
    return hz / rate_hz


def _memory(value, key: str, rate_hz):
    """A forgetting factor from a memory (1 - 1 / its steps); a bare number is the factor."""
    if not isinstance(value, str):
        return value
    steps = units.to_steps(value, key=key, rate_hz=rate_hz)
    if not steps >= 1:
        raise units.UnitError(key, f"{value!r} is a memory of {steps:.3g} steps; it must span at least one step")
    return 1.0 - 1.0 / steps


def convert(kind: str, value, *, key: str, rate_hz: float | None):
    """``value`` of one key as the number the engine takes (``kind``: a value of QUANTITY_KEYS).

    >>> convert(PER_STEP, "20 ms", key="reservoir.leak", rate_hz=250.0)
    0.2
    """
    if kind == STEPS:
        return whole_steps(value, key=key, rate_hz=rate_hz)
    if kind == SECONDS:
        return units.to_seconds(value, key=key)
    if kind == MICROSECONDS:
        us = units.in_unit(value, key=key, unit="us")
        return value if isinstance(value, int) else int(round(us))
    if kind == HZ:
        return units.to_hz(value, key=key)
    if kind == PER_STEP:
        return _per_step(value, key, rate_hz)
    return _memory(value, key, rate_hz)


def resolve(cfg, keys: dict | None = None) -> None:
    """Replace every quantity string among ``cfg``'s ``keys`` (default :data:`QUANTITY_KEYS`;
    ``cfg`` a ``Recipe`` or an ``EngineConfig``) with the number it stands for, ``stream.rate``
    first; then check ``stream.units``. Raises :class:`streamtrace.units.UnitError` naming the key."""
    stream = resolve_stream(cfg.stream)
    for key, kind in (QUANTITY_KEYS if keys is None else keys).items():
        section, name = key.split(".")
        obj = getattr(cfg, section)
        value = getattr(obj, name)
        if isinstance(value, str):
            units.parse_quantity(value, key=key)     # "20" (no unit) is refused: write 20
            setattr(obj, name, convert(kind, value, key=key, rate_hz=stream.rate or None))
    cfg.screen.range = screen_range(cfg.screen.range, stream.units, cfg.model.n_in)


def screen_range(value: list, channel_units: list, n_in: int) -> list:
    """``screen.range`` with its quantities ("3.3 V") in each channel's declared unit. A single
    ``[lo, hi]`` pair holding a quantity becomes one pair per channel (the channels' units may
    differ); anything not a quantity is left for the config's own checks.

    >>> screen_range(["0 V", "3.3 V"], ["mV", "V"], 2)
    [[0.0, 3300.0], [0.0, 3.3]]
    >>> screen_range([-1, 1], [], 3)
    [-1, 1]
    """
    if not value or not any(isinstance(v, str) for p in value for v in (p if isinstance(p, list) else [p])):
        return value
    pairs = value if isinstance(value[0], list) else [value] * n_in
    out = []
    for ch, pair in enumerate(pairs):
        unit = channel_units[ch] if ch < len(channel_units) else ""
        if not isinstance(pair, list):
            return value                  # malformed: the config's check names it
        try:
            out.append([units.in_unit(v, key="screen.range", unit=unit) for v in pair])
        except units.UnitError as e:
            raise units.UnitError("screen.range", f"channel {ch}: {e.problem}") from None
    return out


def resolve_stream(stream):
    """``[stream]`` (a ``StreamConfig``) with its rate in hertz and its units checked; what the
    bridges read of a config too. Returns ``stream``.

    >>> from streamtrace.recipe.sections import StreamConfig
    >>> resolve_stream(StreamConfig(rate="1 kHz", units=["uV"]))
    StreamConfig(rate=1000.0, units=['uV'])
    """
    if isinstance(stream.rate, str):
        stream.rate = units.to_hz(stream.rate, key="stream.rate")
    if not (math.isfinite(stream.rate) and stream.rate >= 0):
        raise units.UnitError("stream.rate", f"must be a sample rate > 0 (or 0: not declared); got {stream.rate}")
    for i, name in enumerate(stream.units):
        if not isinstance(name, str):
            raise units.UnitError("stream.units", f"must be a list of unit names (\"\": none); got {name!r}")
        if name:
            units.parse_unit(name, key=f"stream.units[{i}]")
    return stream
