"""The dashboard without a browser: what the feed makes of the engine's publications, the
server's thinning, its token gate and that it only reads."""
from __future__ import annotations

import asyncio
import json
import threading
import time
import urllib.error
import urllib.request

import numpy as np
import pytest
import zmq

pytest.importorskip("starlette", reason="the dashboard extra (streamtrace[dashboard]) is not installed")

from dashboard_helpers import free_port  # noqa: E402
from streamtrace import wire  # noqa: E402
from streamtrace.commands.cli import main  # noqa: E402
from streamtrace.dashboard.access import DashboardError, check_exposure, connect_address  # noqa: E402
from streamtrace.dashboard.feed import Feed, decimate  # noqa: E402
from streamtrace.dashboard.web import _clean, make_app  # noqa: E402

ENC = wire.PredictionEncoder()


def pred(stream, seq, p, signal=None):
    return ENC(stream, seq, np.float32([p, 9.0]), 0.1, seq, 1, 0.0, None if signal is None else np.float32([signal]))


def stats(uptime, mode="forecast", **extra):
    return wire.encode({"type": "stats", "uptime_s": uptime, "steps_per_s": 100.0, "mode": mode,
                        "latency_us": {"p50": 50.0, "p99": 90.0}, "errors_by_code": {"bad_shape": 2},
                        "stream_metrics": {"a": {"mse": 0.5, "mae": 0.4, "nrmse": float("nan"), "n": 3}}, **extra})


@pytest.mark.parametrize("n, m", [(0, 10), (5, 10), (10, 10), (11, 10), (2000, 300), (1001, 7)])
def test_decimate_keeps_the_ends_and_at_most_the_limit(n, m):
    idx = decimate(n, m)
    assert len(idx) == min(n, m) and len(set(idx.tolist())) == len(idx)
    if n:
        assert idx[0] == 0 and idx[-1] == n - 1 and np.all(np.diff(idx) > 0)
    if n > m:       # evenly spread: no step more than twice another
        steps = np.diff(idx)
        assert steps.max() <= 2 * max(steps.min(), 1) + 1


def test_feed_aligns_forecasts_counts_gaps_and_notices_restarts():
    feed = Feed("ipc:///nonexistent", points=5)
    feed._take(b"stats", stats(10.0))
    for seq, (p, s) in enumerate([(0.5, 1.0), (0.6, 2.0), (0.7, 3.0)]):
        feed._take(b"pred/a", pred("a", seq, p, s))
    feed._take(b"pred/a", pred("a", 7, 0.8, 4.0))        # 4 publications never arrived here
    v = feed.view(["a", "unknown"], max_points=10)
    a = v["streams"]["a"]
    assert list(v["streams"]) == ["a"]
    assert a["seq"] == [0, 1, 2, 7] and a["signal"] == [1.0, 2.0, 3.0, 4.0]
    # a forecast made at seq t is drawn at t + 1, beside the value it forecast (first channel)
    assert a["pred"] == [None, pytest.approx(0.5), pytest.approx(0.6), pytest.approx(0.7)]
    assert a["missed"] == 4 and v["dashboard"]["missed"] == 4 and a["last_seq"] == 7
    assert v["engine"]["connected"] and v["engine"]["errors_by_code"] == {"bad_shape": 2}
    for seq in range(8, 20):                              # only the last `points` kept
        feed._take(b"pred/a", pred("a", seq, 0.0, 0.0))
    assert feed.view(["a"])["streams"]["a"]["seq"] == [15, 16, 17, 18, 19]
    feed._take(b"stats", stats(0.5, mode="supervised"))   # uptime went back: a new engine
    v = feed.view(["a"])
    assert v["engine"]["restarts"] == 1 and v["streams"]["a"]["pred"][0] == 0.0   # supervised: no shift
    feed._take(b"pred/a", pred("a", 3, 1.0))              # the stream started over: old points go
    assert feed.view(["a"])["streams"]["a"]["seq"] == [3] and feed.view(["a"])["streams"]["a"]["signal"] == [None]
    feed._take(b"error", wire.encode({"type": "error", "code": "gap", "message": "m", "stream": "a", "seq": 9}))
    feed._take(b"pred/x", b"\xc1 not msgpack")
    v = feed.view([])
    assert v["recent_errors"][-1]["code"] == "gap" and v["dashboard"]["bad"] == 1
    assert feed.names("a") == {"total": 1, "matched": 1, "names": ["a"]} and feed.names("zz")["matched"] == 0
    # JSON carries no NaN: the page gets null
    text = json.dumps(_clean(feed.view(["a"])), allow_nan=False)
    assert '"nrmse":null' in text.replace(" ", "")


def test_exposure_needs_a_token_beyond_loopback():
    for host in ("127.0.0.1", "localhost", "::1"):
        check_exposure(host, None, False)
    with pytest.raises(DashboardError, match="--token"):
        check_exposure("0.0.0.0", None, False)
    check_exposure("0.0.0.0", "secret", False)
    said = []
    check_exposure("10.1.2.3", None, True, announce=said.append)
    assert "WITHOUT A TOKEN" in said[0]
    assert connect_address("tcp://0.0.0.0:5557") == "tcp://127.0.0.1:5557"
    assert connect_address("tcp://*:9") == "tcp://127.0.0.1:9" and connect_address("ipc:///a/b") == "ipc:///a/b"


def test_serve_refuses_an_open_dashboard_before_starting_the_engine(capsys):
    assert main(["serve", "--dashboard", "0.0.0.0:0"]) == 2
    assert "--token" in capsys.readouterr().err


@pytest.fixture
def served(tmp_path):
    """The app on a real port (uvicorn in a thread), its feed reading a PUB the test binds."""
    import uvicorn
    ctx = zmq.Context.instance()
    pub = ctx.socket(zmq.PUB)
    pub.setsockopt(zmq.LINGER, 0)
    pub.setsockopt(zmq.SNDHWM, 0)      # a burst of test messages is never dropped on the way
    endpoint = f"ipc://{tmp_path}/pub"
    pub.bind(endpoint)
    feed = Feed(endpoint).start()
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(make_app(feed, token="s3cret", rate_hz=20), host="127.0.0.1", port=port,
                                           log_level="warning", lifespan="off", timeout_graceful_shutdown=1))
    thread = threading.Thread(target=lambda: asyncio.run(server.serve()), daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.05)
    yield pub, feed, f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(5)
    feed.close()
    pub.close(0)


def get(url, method="GET", headers=None, read=None):
    req = urllib.request.Request(url, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, (r.read(read) if read else r.read()).decode()
    except urllib.error.HTTPError as e:
        return e.code, ""


def events(url, n: int) -> list[dict]:
    """The first n SSE data events of /events."""
    out = []
    with urllib.request.urlopen(url, timeout=10) as r:
        for line in r:
            if line.startswith(b"data: "):
                out.append(json.loads(line[6:]))
                if len(out) == n:
                    return out
    return out


def test_server_gates_by_token_thins_and_only_reads(served):
    pub, feed, base = served
    assert get(base + "/")[0] == 401 and get(base + "/api/streams?token=wrong")[0] == 401
    assert get(base + "/static/uPlot.iife.min.js")[0] == 200          # the library is public
    status, page = get(base + "/?token=s3cret")
    assert status == 200 and "uPlot" in page
    assert get(base + "/api/streams", headers={"Authorization": "Bearer s3cret"})[0] == 200
    for method in ("POST", "PUT", "DELETE"):                          # nothing can change anything
        assert get(base + "/events?token=s3cret", method=method)[0] == 405
        assert get(base + "/api/streams?token=s3cret", method=method)[0] == 405
    deadline = time.monotonic() + 30
    while not feed.stats and time.monotonic() < deadline:           # until the feed's subscription lands
        pub.send_multipart([b"stats", stats(5.0)])
        time.sleep(0.05)
    for seq in range(2000):
        pub.send_multipart([b"pred/a", pred("a", seq, np.sin(seq / 50), np.cos(seq / 50))])
    while (feed.streams.get("a") is None or feed.streams["a"].last_seq != 1999) and time.monotonic() < deadline:
        time.sleep(0.05)
    got = events(base + "/events?token=s3cret&streams=a,nope&points=100", 6)
    assert len(got) == 6
    a = got[-1]["streams"]["a"]
    assert len(a["seq"]) == 100 and a["seq"][-1] == 1999 and a["last_seq"] == 1999
    assert list(got[-1]["streams"]) == ["a"]
    assert got[-1]["engine"]["steps_per_s"] == 100.0


def test_hundreds_of_streams_reach_the_page_thinned():
    feed = Feed("ipc:///nonexistent", points=400)
    for k in range(500):
        for seq in range(400):
            feed._take(b"pred/", pred(f"s{k:03d}", seq, 0.0, 1.0))
    listed = feed.names(limit=200)
    assert listed["total"] == 500 and len(listed["names"]) == 200 and listed["names"][0] == "s000"
    assert feed.names("s49")["names"] == [f"s49{i}" for i in range(10)]
    v = feed.view([f"s{k:03d}" for k in range(12)], max_points=50)
    assert len(v["streams"]) == 12 and all(len(s["seq"]) == 50 and s["seq"][-1] == 399 for s in v["streams"].values())
    assert len(json.dumps(_clean(v))) < 100_000      # what one update weighs, whatever the stream count


@pytest.mark.slow
def test_serve_with_a_dashboard_starts_and_stops_both(tmp_path):
    import subprocess
    import sys
    import tempfile
    from pathlib import Path

    from dashboard_helpers import engine_config
    sock_dir = Path(tempfile.mkdtemp(prefix="st-sd-", dir="/tmp"))
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "streamtrace", "serve", "--config",
                             str(engine_config(tmp_path, sock_dir)), "--dashboard", f"127.0.0.1:{port}"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        lines = []
        for line in proc.stdout:
            lines.append(line)
            if line.startswith("streamtrace engine:"):
                break
        assert any(f"streamtrace dashboard: http://127.0.0.1:{port}/" in x for x in lines), lines
        status, body = get(f"http://127.0.0.1:{port}/api/streams")
        assert status == 200 and json.loads(body)["total"] == 0
    finally:
        proc.terminate()
        assert proc.wait(30) == 0
    with pytest.raises(urllib.error.URLError):      # the dashboard went with the engine
        urllib.request.urlopen(f"http://127.0.0.1:{port}/api/streams", timeout=2)


@pytest.mark.parametrize("argv, option", [(["--rate", "0"], "--rate"), (["--points", "1"], "--points"),
                                          (["--listen", "0.0.0.0:0"], "--token")])
def test_dashboard_refuses_bad_options_naming_them(argv, option, capsys):
    assert main(["dashboard", "--pub", "ipc:///nonexistent", *argv]) == 2
    assert option in capsys.readouterr().err
