"""CURVE authentication for remote sensors, and the Prometheus endpoint."""
import socket
import threading
import time
import urllib.request

import numpy as np
import pytest
import zmq
import zmq.auth

from streamtrace.transport import PushClient, SensorClient
from streamtrace.engine import Engine, load_config
from configs import ipc_sockets  # noqa: E402


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _engine(tmp_path, **overrides):
    sections = {"model": {"stack": "gru", "n_hidden": 4}, "engine": {"slots": 2},
                "sockets": ipc_sockets(tmp_path),
                "publish": {"stats_every_s": 0.2}}
    for k, v in overrides.items():
        sections.setdefault(k, {}).update(v)
    eng = Engine(load_config(None, sections))
    th = threading.Thread(target=eng.run, kwargs={"install_signals": False, "max_seconds": 60}, daemon=True)
    th.start()
    return eng, th


def test_curve_lets_authorised_clients_in_and_keeps_others_out(tmp_path):
    keys, allowed = tmp_path / "keys", tmp_path / "allowed"
    keys.mkdir()
    allowed.mkdir()
    server_public, server_secret = zmq.auth.create_certificates(keys, "server")
    client_public, client_secret = zmq.auth.create_certificates(keys, "client")
    _, stranger_secret = zmq.auth.create_certificates(keys, "stranger")
    (allowed / "client.key").write_bytes((keys / "client.key").read_bytes())
    eng, th = _engine(tmp_path, security={"curve_secret_key_file": str(server_secret),
                                          "curve_authorized_dir": str(allowed)})
    server_key, _ = zmq.auth.load_certificate(server_public)
    try:
        with SensorClient(eng.endpoints["router"], stream="ok", server_public_key=server_key,
                          client_keys=str(client_secret), timeout_s=20) as c:
            r = c.step(np.zeros(1, np.float32))
            assert r["type"] == "prediction" and r["seq"] == 0
        for keyfile in (str(stranger_secret), None):   # unknown key / no key at all
            with SensorClient(eng.endpoints["router"], stream="intruder", server_public_key=server_key,
                              client_keys=keyfile, timeout_s=1.5) as c:
                with pytest.raises(TimeoutError):
                    c.step(np.zeros(1, np.float32))
        with SensorClient(eng.endpoints["router"], stream="plain", timeout_s=1.5) as c:   # no CURVE
            with pytest.raises(TimeoutError):
                c.step(np.zeros(1, np.float32))
        assert eng.core.metrics.counters["accepted"] == 1
    finally:
        eng.stop()
        th.join(10)


def _in_thread(fn, limit_s=20.0):
    """fn()'s exception (or None), run in a thread: an fn that blocks for good fails the test
    after limit_s instead of holding it."""
    out = []

    def run():
        try:
            fn()
            out.append(None)
        except BaseException as e:   # noqa: BLE001 - handed to the test
            out.append(e)
    th = threading.Thread(target=run, daemon=True)
    th.start()
    th.join(limit_s)
    assert not th.is_alive(), f"still blocked after {limit_s} s"
    return out[0]


def _until_refused(send, seq, tries=50):
    """Sends until one cannot be handed over: every attempt ends within the timeout (none
    blocks), that one raises TimeoutError naming the cause, and it uses no sequence number."""
    for _ in range(tries):
        before = seq()
        err = _in_thread(send)
        if isinstance(err, TimeoutError) and "could not hand a message" in str(err):
            assert "authorised" in str(err) and seq() == before
            return
        assert err is None or isinstance(err, TimeoutError), err    # queued; no answer comes
        time.sleep(0.1)
    raise AssertionError(f"every one of {tries} sends was queued: the refused connection was never noticed")


def test_a_client_whose_key_the_engine_refused_times_out_instead_of_blocking(tmp_path):
    """Once the engine has turned a CURVE key down (within milliseconds of connecting) ZeroMQ
    has no connection left to queue a message on, and a plain send waits forever (how the CI
    run of the test above once hung). The clients' sends wait at most their timeout, raise
    TimeoutError naming the likely cause, and use no sequence number."""
    keys, allowed = tmp_path / "keys", tmp_path / "allowed"
    keys.mkdir()
    allowed.mkdir()
    server_public, server_secret = zmq.auth.create_certificates(keys, "server")
    zmq.auth.create_certificates(keys, "client")
    _, stranger_secret = zmq.auth.create_certificates(keys, "stranger")
    (allowed / "client.key").write_bytes((keys / "client.key").read_bytes())
    eng, th = _engine(tmp_path, security={"curve_secret_key_file": str(server_secret),
                                          "curve_authorized_dir": str(allowed)},
                      sockets={"pull": f"ipc://{tmp_path}/p"})
    server_key, _ = zmq.auth.load_certificate(server_public)
    try:
        with SensorClient(eng.endpoints["router"], stream="turned-away", server_public_key=server_key,
                          client_keys=str(stranger_secret), timeout_s=0.3) as c:
            # the first messages may still be queued while the handshake runs (then no answer
            # comes); once it has failed a send has nowhere to go
            _until_refused(lambda: c.step(np.zeros(1, np.float32)), lambda: c.seq)
        with PushClient(eng.endpoints["pull"], stream="pushed-away", server_public_key=server_key,
                        client_keys=str(stranger_secret), timeout_s=0.3) as p:
            _until_refused(lambda: p.send(np.zeros(1, np.float32)), lambda: p.seq)
        assert eng.core.metrics.counters["received"] == 0
    finally:
        eng.stop()
        th.join(10)


def test_prometheus_metrics_are_served_on_loopback(tmp_path):
    port = _free_port()
    eng, th = _engine(tmp_path, metrics={"prometheus_port": port})
    try:
        with SensorClient(eng.endpoints["router"], stream="p", timeout_s=20) as c:
            for _ in range(5):
                c.step(np.zeros(1, np.float32))
            c.send(np.zeros(3, np.float32))            # a bad shape: counted as an error
            assert c.recv(raise_errors=False)["code"] == "bad_shape"
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
        assert 'streamtrace_events_total{event="accepted"} 5.0' in text
        assert 'streamtrace_errors_total{code="bad_shape"} 1.0' in text
        assert "streamtrace_latency_seconds_count 5.0" in text
    finally:
        eng.stop()
        th.join(10)
