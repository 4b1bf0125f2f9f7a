"""A source's sample rate and channel units against what the engine's config declares (``[stream]``).

A sensor source may say what it sends: an LSL outlet its nominal rate and channel units, an MQTT
bridge's ``[bridge.mqtt] units``, a replayed file's ``--units``. :func:`conform` checks that
against ``[stream]`` of the serve config and gives the per-channel factors that turn the
source's values into the declared units (microvolts into ``mV``, say), so ranges and
predictions are in the units the config speaks. A source that cannot be made to match (another
rate, a unit of another dimension, another channel count) is refused with the reason; one that
says nothing is taken as it is.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from streamtrace.units import UnitError, conversion_factor

__all__ = ["Conversion", "conform", "declared_stream"]

RATE_TOLERANCE = 1e-6        # relative: 250 Hz and 250.0000001 Hz are one rate


@dataclass
class Conversion:
    """How a source's samples become the declared stream's: ``factors`` per channel (None: as
    they are), the ``units`` the forwarded values are in, and the source's own ``rate_hz`` and
    ``source_units`` (0 / []: not said).

    >>> c = conform(100.0, ["microvolts"], declared_rate=100.0, declared_units=["mV"], what="EEG")
    >>> c.apply(np.array([[2500.0]])).tolist(), c.units
    ([[2.5]], ['mV'])
    """
    factors: np.ndarray | None = None
    units: list = field(default_factory=list)
    rate_hz: float = 0.0
    source_units: list = field(default_factory=list)

    def apply(self, x):
        """The samples ``x`` (rows of channels) in the declared units."""
        return x if self.factors is None else np.asarray(x, np.float64) * self.factors


def conform(rate_hz: float, source_units, *, declared_rate: float, declared_units, what: str,
            tolerance: float = RATE_TOLERANCE) -> Conversion:
    """The :class:`Conversion` of a source (``rate_hz``, 0: irregular or not said; ``source_units``,
    one per channel, "" or []: not said) into the declared ``[stream]`` rate and units (0 / []:
    not declared; the rates may differ by ``tolerance``, relative). Raises :class:`UnitError`
    whose ``key`` is ``what`` (the source, in words) when they cannot match."""
    rate_hz = float(rate_hz or 0.0)
    src = [str(s or "") for s in (source_units or [])]
    if rate_hz > 0 and declared_rate and abs(rate_hz - declared_rate) > tolerance * declared_rate:
        raise UnitError(what, f"samples at {rate_hz:g} Hz; the config's stream.rate is {declared_rate:g} Hz "
                              "(its durations in time units are steps at that rate)")
    dst = list(declared_units or [])
    if not dst or not any(src):
        return Conversion(None, dst or src, rate_hz, src)
    if len(src) != len(dst):
        raise UnitError(what, f"has {len(src)} channels; stream.units declares {len(dst)}")
    factors = np.ones(len(dst))
    for i, (s, d) in enumerate(zip(src, dst)):
        if s and d and s != d:
            factors[i] = conversion_factor(s, d, key=f"{what}, channel {i}")
    return Conversion(None if np.all(factors == 1.0) else factors, dst, rate_hz, src)


def declared_stream(path):
    """``[stream]`` of the serve config at ``path`` (None: nothing declared), as a
    ``StreamConfig`` with its rate in hertz; a bad value is a ``ConfigError`` naming the key.

    >>> declared_stream(None)
    StreamConfig(rate=0.0, units=[])
    """
    from streamtrace.engine.config import read_toml, stream_section
    return stream_section(read_toml(path) if path else {})
