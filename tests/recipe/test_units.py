"""Physical quantities in settings (streamtrace.units, engine.quantities, the [stream] section).

Oracles: values converted by hand (20 ms at 250 Hz is 5 steps; 3.3 V is 3300 mV; a leak of
dt / tau with tau = 20 ms at 250 Hz is 4 ms / 20 ms = 0.2), and the same config written with
bare numbers, loaded through the real loader.
"""
import subprocess
import sys

import pytest

from streamtrace.engine import ConfigError, load_config
from streamtrace.engine.quantities import QUANTITY_KEYS
from streamtrace.units import UnitError, conversion_factor, in_unit, parse_unit, to_hz, to_seconds, to_steps


@pytest.mark.parametrize("text,rate,steps", [
    ("20 ms", 250.0, 5.0), ("2 s", 100.0, 200.0), ("1.5 min", 10.0, 900.0), ("250 us", 8000.0, 2.0),
    ("1 ms", 250.0, 0.25), (" 4e-3   s ", 250.0, 1.0),
])
def test_durations_become_steps_at_the_stream_rate(text, rate, steps):
    assert to_steps(text, key="k", rate_hz=rate) == pytest.approx(steps, rel=1e-12)


def test_bare_numbers_keep_their_meaning():
    assert to_steps(7, key="k", rate_hz=None) == 7.0          # steps, no rate needed
    assert to_steps(7, key="k", rate_hz=250.0) == 7.0         # not seconds
    assert to_hz(250, key="k") == 250.0
    assert to_seconds(1.5, key="k") == 1.5
    assert in_unit(3.3, key="k", unit="mV") == 3.3            # already in the channel's unit
    assert in_unit(-2, key="k", unit="") == -2.0


@pytest.mark.parametrize("text,hz", [("250 Hz", 250.0), ("2.5 kHz", 2500.0), ("0.5 Hz", 0.5), ("1 MHz", 1e6)])
def test_frequencies_in_hertz(text, hz):
    assert to_hz(text, key="k") == pytest.approx(hz, rel=1e-12)


@pytest.mark.parametrize("text,unit,value", [
    ("3.3 V", "mV", 3300.0), ("-500 mV", "V", -0.5), ("250 uV", "mV", 0.25), ("0 V", "uV", 0.0),
    ("2 kV", "V", 2000.0), ("1.2 mV", "microvolts", 1200.0), ("9.81 m / s^2", "m / s^2", 9.81),
])
def test_values_in_the_channel_unit(text, unit, value):
    assert in_unit(text, key="k", unit=unit) == pytest.approx(value, rel=1e-12)


def test_lsl_spellings_of_units():
    assert parse_unit("microvolts", key="k") == parse_unit("uV", key="k")
    assert parse_unit("µV", key="k") == parse_unit("uV", key="k")
    assert parse_unit("millivolt", key="k") == parse_unit("mV", key="k")
    assert conversion_factor("microvolts", "V", key="k") == pytest.approx(1e-6, rel=1e-12)
    assert conversion_factor("kHz", "Hz", key="k") == pytest.approx(1e3, rel=1e-12)


@pytest.mark.parametrize("call,words", [
    (lambda: to_steps("250 Hz", key="learning.label_delay", rate_hz=250.0),
     ["learning.label_delay: '250 Hz' is a frequency", "a duration is needed"]),
    (lambda: to_hz("4 ms", key="stream.rate"), ["stream.rate: '4 ms' is a duration", "a frequency"]),
    (lambda: in_unit("2 s", key="screen.range", unit="V"), ["screen.range: '2 s' is a duration", "'V' (a voltage)"]),
    (lambda: in_unit("2 V", key="screen.range", unit=""), ["screen.range", "declares none"]),
    (lambda: to_seconds("3 V", key="engine.park_s"), ["engine.park_s: '3 V' is a voltage"]),
    (lambda: conversion_factor("V", "A", key="ch 1"), ["ch 1: 'V' is a voltage, 'A' is a current"]),
    (lambda: to_hz("3 furlongs", key="stream.rate"), ["stream.rate: 'furlongs' is not a unit"]),
    (lambda: to_hz("fast", key="stream.rate"), ["stream.rate: 'fast' is neither a number nor a quantity"]),
    (lambda: to_hz(True, key="stream.rate"), ["stream.rate: must be a number"]),
])
def test_wrong_dimension_or_text_is_refused_naming_the_key(call, words):
    with pytest.raises(UnitError) as e:
        call()
    for w in words:
        assert w in str(e.value)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("rate", [None, 0.0])
def test_a_duration_without_a_rate_is_refused(rate):
    with pytest.raises(UnitError, match=r"learning.horizon: '20 ms' is a duration: converting it to steps needs "
                                        r"the stream's sample rate; declare it \(\[stream\] rate"):
        to_steps("20 ms", key="learning.horizon", rate_hz=rate)


# ---- through the config loader ------------------------------------------------------------------
WITH_QUANTITIES = """
[stream]
rate = "250 Hz"
units = ["V", "mV"]
[model]
stack = "reservoir"
n_in = 2
n_out = 2
[reservoir]
leak = "20 ms"
[transform]
normalise = true
normalise_warmup = "2 s"
normalise_rate = "0.75 Hz"
[readout]
kind = "rls"
lam = "40 s"
change_lam = "4 s"
change_hold = "4 s"
change_fast = "200 ms"
change_slow = "2 s"
[learning]
horizon = "12 ms"
learn_every = "8 ms"
[combine]
experts = true
period = "1 s"
window = "2 s"
[engine]
idle_timeout_s = "2 min"
park_s = "1 h"
busy_poll_us = "2 ms"
[publish]
weights_every = "1 min"
stats_every_s = "500 ms"
[checkpoint]
every = "10 s"
[metrics]
window = "4 s"
"""

# the same config with every quantity converted by hand (250 Hz: 4 ms a step)
BY_HAND = """
[stream]
rate = 250
units = ["V", "mV"]
[model]
stack = "reservoir"
n_in = 2
n_out = 2
[reservoir]
leak = 0.2
[transform]
normalise = true
normalise_warmup = 500
normalise_rate = 0.003
[readout]
kind = "rls"
lam = 0.9999
change_lam = 0.999
change_hold = 1000
change_fast = 50
change_slow = 500
[learning]
horizon = 3
learn_every = 2
[combine]
experts = true
period = 250
window = 500
[engine]
idle_timeout_s = 120
park_s = 3600
busy_poll_us = 2000
[publish]
weights_every = 15000
stats_every_s = 0.5
[checkpoint]
every = 2500
[metrics]
window = 1000
"""


def _sections(cfg):
    from dataclasses import asdict
    return asdict(cfg)


def test_a_config_of_quantities_loads_as_the_same_config_in_steps(tmp_path):
    (tmp_path / "q.toml").write_text(WITH_QUANTITIES)
    (tmp_path / "n.toml").write_text(BY_HAND)
    q, n = load_config(tmp_path / "q.toml"), load_config(tmp_path / "n.toml")
    got, want = _sections(q), _sections(n)
    for section in want:
        for key, value in want[section].items():
            if isinstance(value, float):
                assert got[section][key] == pytest.approx(value, rel=1e-12), f"{section}.{key}"
            else:
                assert got[section][key] == value, f"{section}.{key}"
                assert type(got[section][key]) is type(value), f"{section}.{key}"


def test_every_quantity_key_is_a_field_and_converts():
    """Each key of the table takes a duration (or a frequency) and ends up a number."""
    freq = {"stream.rate"}
    for key in QUANTITY_KEYS:
        section, name = key.split(".")
        value = "250 Hz" if key in freq else "40 ms"
        over = {section: {name: value}, "stream": {"rate": 250}} if section != "stream" else {section: {name: value}}
        try:
            cfg = load_config(overrides=over)
        except ConfigError as e:      # a value the key's own checks refuse (e.g. 10 steps of label_delay)
            assert e.key == key and "'40 ms'" not in str(e), str(e)
            continue
        assert isinstance(getattr(getattr(cfg, section), name), (int, float)), key


@pytest.mark.parametrize("key", sorted(QUANTITY_KEYS))
def test_a_quantity_of_the_wrong_dimension_is_refused_naming_the_key(key):
    section, name = key.split(".")
    with pytest.raises(ConfigError) as e:
        load_config(overrides={section: {name: "3.3 V"}, **({} if section == "stream" else {"stream": {"rate": 100}})})
    assert e.value.key == key
    assert str(e.value).startswith(f"{key}: '3.3 V' is a voltage")


@pytest.mark.parametrize("key", sorted(k for k, kind in QUANTITY_KEYS.items()
                                       if kind in ("steps", "per-step rate", "forgetting factor")))
def test_a_duration_in_steps_without_a_declared_rate_is_refused(key):
    section, name = key.split(".")
    with pytest.raises(ConfigError, match="the stream's sample rate") as e:
        load_config(overrides={section: {name: "20 s"}})
    assert e.value.key == key


@pytest.mark.parametrize("over,match", [
    ({"stream": {"units": ["V", "V"]}}, "stream.units: gives 2 units for model.n_in = 1"),
    ({"stream": {"units": ["bananas"]}}, r"stream.units\[0\]: 'bananas' is not a unit"),
    ({"stream": {"units": [3]}}, "stream.units: must be a list of unit names"),
    ({"stream": {"rate": -5}}, "stream.rate: must be a sample rate > 0"),
    ({"stream": {"rate": 250}, "metrics": {"window": "1 ms"}}, "metrics.window: '1 ms' is 0.25 steps at 250 Hz"),
    ({"metrics": {"window": "20"}}, "metrics.window: '20' has no unit"),
    ({"model": {"n_in": "2 V"}}, "model.n_in: must be an integer"),    # not a quantity key
    ({"stream": {"rate": 250}, "readout": {"lam": "2 ms"}}, "readout.lam: '2 ms' is a memory of 0.5 steps"),
])
def test_stream_section_and_rounding_refusals(over, match):
    with pytest.raises(ConfigError, match=match):
        load_config(overrides=over)


def test_bare_numbers_load_as_before():
    plain = load_config(overrides={"learning": {"horizon": 3}, "metrics": {"window": 77}})
    assert (plain.learning.horizon, plain.metrics.window, plain.stream.rate, plain.stream.units) == (3, 77, 0.0, [])


def test_serve_refuses_a_bad_quantity_in_one_line_exit_2(tmp_path):
    p = tmp_path / "bad.toml"
    p.write_text('[stream]\nrate = "250 Hz"\n[learning]\nhorizon = "3 V"\n')
    r = subprocess.run([sys.executable, "-m", "streamtrace", "serve", "--config", str(p)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert lines == ["config error: learning.horizon: '3 V' is a voltage; a duration is needed (e.g. '20 ms') "
                     "or a number of steps"], r.stderr


def test_the_docstring_examples_run():
    import doctest

    import streamtrace.adapters.stream_units
    import streamtrace.engine.quantities
    import streamtrace.units
    for module in (streamtrace.units, streamtrace.engine.quantities, streamtrace.adapters.stream_units):
        result = doctest.testmod(module)
        assert result.attempted > 0 and result.failed == 0, module.__name__


# ---- screen.range in the channels' declared units ----------------------------------------------------
def test_screen_range_quantities_are_converted_into_each_channels_unit():
    cfg = load_config(overrides={"stream": {"rate": 250, "units": ["V", "mV"]},
                                 "model": {"stack": "gru", "n_in": 2, "n_out": 2},
                                 "screen": {"range": [["0 V", "3.3 V"], ["-500 uV", 2]], "rate": "4 s"}})
    # by hand: 3.3 V in V; -500 uV = -0.5 mV, a bare 2 is mV already; rate: 1 / (4 s * 250 Hz)
    assert cfg.screen.range == [[0.0, pytest.approx(3.3, rel=1e-12)], [pytest.approx(-0.5, rel=1e-12), 2.0]]
    assert cfg.screen.rate == pytest.approx(1e-3, rel=1e-12)
    one = load_config(overrides={"stream": {"units": ["mV", "V"]}, "model": {"stack": "gru", "n_in": 2, "n_out": 2},
                                 "screen": {"range": ["-1 V", "1 V"]}})
    assert one.screen.range == [[-1000.0, 1000.0], [-1.0, 1.0]]      # one pair, each channel in its unit
    bare = load_config(overrides={"screen": {"range": [-5, 5]}})
    assert bare.screen.range == [-5, 5]                                # bare numbers: as before


@pytest.mark.parametrize("over,match", [
    ({"screen": {"range": ["0 V", "3.3 V"]}},
     "screen.range: channel 0: '0 V' has a unit, but the channel declares none"),
    ({"stream": {"units": ["V"]}, "screen": {"range": ["0 s", "1 V"]}},
     r"screen.range: channel 0: '0 s' is a duration; the channel's unit is 'V' \(a voltage\)"),
    ({"stream": {"units": ["V"]}, "screen": {"range": ["2 V", "1 V"]}}, "screen.range: must be .lo, hi. with lo < hi"),
])
def test_screen_range_refusals_name_the_key_and_channel(over, match):
    with pytest.raises(ConfigError, match=match) as e:
        load_config(overrides=over)
    assert e.value.key == "screen.range"
