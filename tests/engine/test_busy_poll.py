"""Busy polling after traffic (engine.busy_poll_us): the window's arithmetic, and the engine
loop polling without sleeping inside it (and only there), answers unchanged."""
import threading

import numpy as np
import pytest
import zmq

from streamtrace.transport import SensorClient
from streamtrace.engine import load_config
from streamtrace.engine.server import Engine
from streamtrace.engine.spin import IDLE_MS, SHORT_US, BusyPoll
from configs import ipc_sockets  # noqa: E402


def test_window_after_traffic():
    b = BusyPoll(1000, cpus=2)
    assert b.timeout_ms(5.0, pending=False) == IDLE_MS        # nothing happened yet: sleep
    b.busy(10.0)
    assert b.timeout_ms(10.0009, pending=False) == 0 and b.active(10.0009)
    assert b.timeout_ms(10.0011, pending=False) == IDLE_MS and not b.active(10.0011)
    assert b.timeout_ms(99.0, pending=True) == 0               # queued work never waits


def test_polls_through_gaps_up_to_the_window_and_briefly_after_longer_ones():
    b = BusyPoll(5000, cpus=2)
    short = SHORT_US / 1e6
    b.busy(10.0)                      # the first traffic after idle: the short poll only
    assert b.active(10.0 + 0.9 * short) and not b.active(10.0 + 1.1 * short)
    b.busy(10.004)                    # 4 ms after the last: the sender is fast, poll the window
    assert b.active(10.0089) and not b.active(10.0091)
    b.busy(10.0085)
    assert b.active(10.0134) and b.timeout_ms(10.0134, pending=False) == 0
    b.busy(10.030)                    # 21.5 ms later: a slow sender, back to the short poll
    assert b.active(10.030 + 0.9 * short) and not b.active(10.030 + 1.1 * short)
    assert b.timeout_ms(10.030 + 1.1 * short, pending=False) == IDLE_MS
    assert b.timeout_ms(99.0, pending=True) == 0               # queued work never waits


@pytest.mark.parametrize("window_us,cpus", [(0, 2), (1000, 1)], ids=["off", "one-cpu"])
def test_never_spins_when_off_or_on_one_cpu(window_us, cpus):
    b = BusyPoll(window_us, cpus=cpus)
    b.busy(10.0)
    assert b.timeout_ms(10.0, pending=False) == IDLE_MS and not b.active(10.0)
    assert b.timeout_ms(10.0, pending=True) == 0


def _serve(tmp_path, window_us, monkeypatch):
    """An engine thread whose polls are recorded as (timeout, got a message); ten forecast
    steps from one sensor, one at a time."""
    polls = []
    real = zmq.Poller.poll

    def poll(self, timeout=None):
        events = real(self, timeout)
        if threading.current_thread().name == "engine":     # not the sensor's own polls
            polls.append((timeout, bool(events)))
        return events
    monkeypatch.setattr(zmq.Poller, "poll", poll)
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {0, 1})   # as on a 2-CPU machine
    cfg = load_config(None, {"model": {"stack": "gru", "n_hidden": 4}, "engine": {"slots": 1, "busy_poll_us": window_us},
                             "sockets": ipc_sockets(tmp_path)})
    eng = Engine(cfg)
    th = threading.Thread(target=eng.run, kwargs={"install_signals": False, "max_seconds": 60},
                          daemon=True, name="engine")
    th.start()
    preds = []
    with SensorClient(eng.endpoints["router"], stream="s", timeout_s=20) as c:
        for t in range(10):
            preds.append(c.step(np.array([np.sin(0.3 * t)], np.float32))["pred"])
    eng.stop()
    th.join(10)
    # the poll right after each one that brought a message: the loop has stepped and replied
    after = [polls[i + 1][0] for i in range(len(polls) - 1) if polls[i][1]]
    return after, np.array(preds)


def test_engine_polls_without_sleeping_only_inside_the_window(tmp_path, monkeypatch):
    (tmp_path / "a").mkdir(), (tmp_path / "b").mkdir()
    spun, p1 = _serve(tmp_path / "a", 1_000_000, monkeypatch)   # 1 s: covers the sensor's turn
    slept, p0 = _serve(tmp_path / "b", 0, monkeypatch)
    # after a message was answered the loop polls on without sleeping inside the window, and
    # sleeps in its poll without one (nothing is queued after the step)
    assert len(spun) >= 9 and len(slept) >= 9      # the last one may meet the stop
    assert spun.count(0) >= 0.8 * len(spun)
    assert slept.count(IDLE_MS) == len(slept)
    assert np.array_equal(p1, p0)                   # the answers do not depend on the polling
