"""Physical quantities in settings: ``"20 ms"``, ``"250 Hz"``, ``"3.3 V"``, parsed and checked by saiunit.

A setting may be a bare number (it keeps the meaning it always had: steps, seconds, hertz or
the channel's own unit) or a string ``"<number> <unit>"`` in any unit saiunit knows
(``ms``, ``s``, ``min``, ``Hz``, ``kHz``, ``uV``, ``mV``, ``V``, ``m / s^2``, ...; the spellings
of LSL metadata such as ``"microvolts"`` too). Each function returns a plain float in the unit
the caller works in, or raises :class:`UnitError` naming the setting (``key``) when the text is
not a quantity or is one of the wrong dimension (a frequency where a duration is needed).

>>> to_steps("20 ms", key="learning.label_delay", rate_hz=250.0)
5.0
>>> to_hz("2 kHz", key="stream.rate")
2000.0
>>> in_unit("3.3 V", key="screen.range", unit="mV")
3300.0
"""
from __future__ import annotations

import math
import re
from functools import cache

__all__ = ["UnitError", "parse_unit", "parse_quantity", "to_seconds", "to_steps", "to_hz", "in_unit",
           "conversion_factor", "dimension_name"]

_NUMBER = re.compile(r"^\s*([-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)\s*(.*?)\s*$")
# unit words as LSL / XDF metadata writes them ("microvolts"): prefix + base, plural or not
_WORD = re.compile(r"^(nano|micro|milli|centi|kilo|mega)?(volt|hertz|second|ampere|amp|meter|metre|gram|"
                   r"tesla|pascal|newton|ohm|kelvin)s?$")
_PREFIX = {None: "", "nano": "n", "micro": "u", "milli": "m", "centi": "c", "kilo": "k", "mega": "M"}
_BASE = {"volt": "V", "hertz": "Hz", "second": "s", "ampere": "A", "amp": "A", "meter": "m", "metre": "m",
         "gram": "g", "tesla": "T", "pascal": "Pa", "newton": "N", "ohm": "ohm", "kelvin": "K"}


@cache
def _saiunit():
    """saiunit, imported at the first quantity (it imports jax: the CLI's parsers stay light)."""
    import saiunit
    return saiunit


@cache
def _dimensions():
    u = _saiunit()
    return (("a duration", u.second), ("a frequency", u.hertz), ("a voltage", u.volt), ("a current", u.amp),
            ("a length", u.meter), ("a mass", u.kilogram), ("a pressure", u.pascal),
            ("a temperature", u.kelvin), ("a force", u.newton), ("a magnetic field", u.tesla),
            ("a resistance", u.ohm), ("an acceleration", u.meter / u.second ** 2))


class UnitError(ValueError):
    """A setting that is not a quantity of the dimension it needs; reads ``key: problem``.

    >>> str(UnitError("stream.rate", "is a duration"))
    'stream.rate: is a duration'
    """

    def __init__(self, key: str, problem: str):
        self.key, self.problem = key, problem
        super().__init__(f"{key}: {problem}")


def parse_unit(name: str, *, key: str):
    """The saiunit unit a name stands for (``"mV"``, ``"m / s^2"``, ``"microvolts"``, ``"µV"``).

    >>> parse_unit("microvolts", key="stream.units") == parse_unit("uV", key="stream.units")
    True
    """
    text = str(name).strip().replace("µ", "u").replace("μ", "u")
    word = _WORD.match(text.lower())
    if word:
        text = _PREFIX[word.group(1)] + _BASE[word.group(2)]
    try:
        return _saiunit().parse_unit(text)
    except ValueError:
        raise UnitError(key, f"{name!r} is not a unit saiunit knows (e.g. 'ms', 'Hz', 'mV', 'V', "
                             "'m / s^2')") from None


def parse_quantity(text: str, *, key: str):
    """``"<number> <unit>"`` as a saiunit Quantity; a string without a unit is refused here (the
    callers take a bare number as it is).

    >>> parse_quantity("20 ms", key="k").to_decimal(parse_unit("s", key="k"))
    0.02
    """
    m = _NUMBER.match(text) if isinstance(text, str) else None
    if not m:
        raise UnitError(key, f"{text!r} is neither a number nor a quantity such as '20 ms', '250 Hz' or '3.3 V'")
    value = float(m.group(1))
    if not m.group(2):
        raise UnitError(key, f"{text!r} has no unit: write a number without quotes, or add a unit ('20 ms')")
    return value * parse_unit(m.group(2), key=key)


def dimension_name(unit) -> str:
    """Words for a saiunit unit's dimension ("a duration", "a voltage", ...).

    >>> dimension_name(parse_unit("kHz", key="k"))
    'a frequency'
    """
    for words, ref in _dimensions():
        if unit.dim == ref.dim:
            return words
    return "dimensionless" if unit.dim == _saiunit().UNITLESS.dim else f"a quantity of dimension {unit.dim}"


def _convert(value, key: str, unit, want: str):
    """``value`` (bare number: None) or the quantity in ``unit``, refusing another dimension."""
    if isinstance(value, bool):
        raise UnitError(key, f"must be a number or a quantity; got {value!r}")
    if isinstance(value, (int, float)):
        return None
    if not isinstance(value, str):
        raise UnitError(key, f"must be a number or a quantity such as '20 ms'; got {value!r}")
    if _NUMBER.match(value) and not _NUMBER.match(value).group(2):
        return None                   # "20": a bare number written as a string
    q = parse_quantity(value, key=key)
    got = _saiunit().get_unit(q)
    if got.dim != unit.dim:
        raise UnitError(key, f"{value!r} is {dimension_name(got)}; {want}")
    return float(q.to_decimal(unit))


def _bare(value) -> float:
    return float(value)     # a number, or a string holding only one


def to_seconds(value, *, key: str) -> float:
    """A duration in seconds: a bare number is seconds already.

    >>> to_seconds("2 min", key="engine.park_s")
    120.0
    """
    s = _convert(value, key, _saiunit().second, "a duration is needed (e.g. '30 s')")
    return _bare(value) if s is None else s


def to_steps(value, *, key: str, rate_hz: float | None) -> float:
    """A number of steps (samples): a bare number is steps already; a duration is converted with
    the stream's sample rate ``rate_hz``, which it needs (None or 0: refused, naming ``key``).
    The result may be fractional: rounding is the caller's choice.

    >>> to_steps("2 s", key="metrics.window", rate_hz=250.0)
    500.0
    >>> to_steps(7, key="learning.horizon", rate_hz=None)
    7.0
    """
    s = _convert(value, key, _saiunit().second, "a duration is needed (e.g. '20 ms') or a number of steps")
    if s is None:
        return _bare(value)
    if not rate_hz:
        raise UnitError(key, f"{value!r} is a duration: converting it to steps needs the stream's sample rate; "
                             "declare it ([stream] rate = \"250 Hz\") or give a number of steps")
    return s * float(rate_hz)


def to_hz(value, *, key: str) -> float:
    """A frequency in hertz: a bare number is hertz already.

    >>> to_hz("250 Hz", key="stream.rate")
    250.0
    """
    s = _convert(value, key, _saiunit().hertz, "a frequency is needed (e.g. '250 Hz')")
    return _bare(value) if s is None else s


def in_unit(value, *, key: str, unit: str) -> float:
    """A value in ``unit`` (a unit name; "" for a channel without a declared unit, where only bare
    numbers are accepted): a bare number is in ``unit`` already.

    >>> in_unit("250 uV", key="screen.range", unit="mV")
    0.25
    """
    if not unit:
        if isinstance(value, str) and _NUMBER.match(value) and _NUMBER.match(value).group(2):
            raise UnitError(key, f"{value!r} has a unit, but the channel declares none: declare the stream's "
                                 "channel units ([stream] units) or give a bare number")
        s = _convert(value, key, _saiunit().UNITLESS, "")
        return _bare(value) if s is None else s
    target = parse_unit(unit, key=key)
    s = _convert(value, key, target, f"the channel's unit is {unit!r} ({dimension_name(target)})")
    return _bare(value) if s is None else s


def conversion_factor(source: str, target: str, *, key: str) -> float:
    """What a value in unit ``source`` is multiplied by to be in unit ``target``; refused when the
    two are of different dimensions.

    >>> conversion_factor("microvolts", "mV", key="channel 0")
    0.001
    """
    src, dst = parse_unit(source, key=key), parse_unit(target, key=key)
    if src.dim != dst.dim:
        raise UnitError(key, f"{source!r} is {dimension_name(src)}, {target!r} is {dimension_name(dst)}: "
                             "they cannot be converted")
    factor = float((1.0 * src).to_decimal(dst))
    if not (math.isfinite(factor) and factor > 0):
        raise UnitError(key, f"cannot convert {source!r} to {target!r}")
    return factor
