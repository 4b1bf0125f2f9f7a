"""``streamtrace bench --period-us``: round trips timed as a sampling sensor sends them, one
request at each tick, and a bad period refused before anything starts."""
import time

import numpy as np
import pytest

from streamtrace.commands.cli import main
from streamtrace.engine.launch import stop
from streamtrace.transport.echo import start_echo
from streamtrace.transport.timing import paced, roundtrips


def test_paced_calls_leave_at_their_ticks_and_time_only_the_call():
    starts = []

    def call():
        starts.append(time.perf_counter())
        time.sleep(0.002)

    took = paced(call, 6, 20_000)
    span = np.array(starts) - starts[0]
    # call i at its tick, i x 20 ms on (a late wake-up delays one call, never the schedule);
    # back to back, these 2 ms calls would be ~2 ms apart
    assert len(took) == 6 and np.all(span[1:] > np.arange(1, 6) * 0.020 - 0.005) and span[-1] < 0.2
    assert np.all(took >= 2000) and np.median(took) < 12_000    # the call's own microseconds, not the wait
    starts.clear()
    paced(call, 4, 0)                           # back to back: no waiting between calls
    assert starts[-1] - starts[0] < 0.05        # ~6 ms of calls, not the 60 ms of three ticks


def test_roundtrips_against_the_echo_at_a_sensor_rate(tmp_path):
    ep = f"ipc://{tmp_path}/echo"
    proc = start_echo(ep)
    try:
        t0 = time.perf_counter()
        lat = roundtrips(ep, 10, None, warmup=2, period_us=30_000)
        wall = time.perf_counter() - t0
    finally:
        stop(proc)
    assert lat.shape == (10,) and np.all(lat > 0)
    assert wall > 9 * 0.030                       # ten requests, a tick apart
    assert np.median(lat) < 30_000                # each round trip timed alone, without its wait


@pytest.mark.parametrize("extra", [[], ["--config", "engine.toml"]], ids=["echo table", "config"])
def test_a_bad_period_is_refused_naming_the_flag(extra, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "engine.toml").write_text('[model]\nstack = "gru"\nn_hidden = 4\n')
    assert main(["bench", "--period-us", "-5", *extra]) == 2
    err = capsys.readouterr().err
    assert "--period-us" in err and "-5" in err
