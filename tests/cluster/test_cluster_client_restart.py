"""Restarts through the cluster (a real nats-server, a worker in a child process): a worker
restart (the same ClusterClient goes on), a sensor restart (a fresh ClusterClient at seq 0:
its first step is not taken for a resend of the old client's seq 0, is refused as ``repeat``
and resynced) and both. No exception, every sample answered once with the engine's number,
and every prediction bit-identical to one engine fed each stream once, in order."""
from __future__ import annotations

import logging

import numpy as np
import pytest

pytest.importorskip("nats", reason="pip install 'streamtrace[cluster]' (make test installs it)")

from streamtrace.cluster import ClusterClient, NatsServer              # noqa: E402
from streamtrace.cluster.nats_server import find_server_binary              # noqa: E402

import cluster_harness as H                                             # noqa: E402
from doc_examples import docstring_example                              # noqa: E402

K = 15          # steps per phase


@pytest.mark.slow
def test_cluster_client_survives_worker_and_sensor_restarts(tmp_path, caplog):
    find_server_binary()      # fails with what to install when the binary is missing
    caplog.set_level(logging.WARNING, logger="streamtrace.client")
    cfg = H.config(tmp_path)
    data = H.signals(3, 2 * K)       # s0: the worker restarts; s1: the sensor restarts; s2: both
    ref, _ = H.reference(cfg, data)
    replies = {name: [] for name in data}

    def run(client, name, t0, t1):
        for t in range(t0, t1):
            replies[name].append(client.step(data[name][t], stream=name))

    srv = NatsServer(store_dir=str(tmp_path / "store")).start()
    worker, clients = None, []
    try:
        worker = H.start_worker(srv.url, cfg)
        first = ClusterClient(srv.url, timeout_s=60)
        clients.append(first)
        for name in data:
            run(first, name, 0, K)
        sensor = ClusterClient(srv.url, timeout_s=60)        # s1's sensor restarted: seq 0 again
        clients.append(sensor)
        run(sensor, "s1", K, 2 * K)
        assert H.terminate([worker]) == [0]                  # the worker restarts (SIGTERM: commits, leaves)
        worker = H.start_worker(srv.url, cfg)
        run(first, "s0", K, 2 * K)                           # the same client goes on
        both = ClusterClient(srv.url, timeout_s=60)          # s2: worker and sensor restarted
        clients.append(both)
        run(both, "s2", K, 2 * K)
        assert [c.resyncs for c in clients] == [0, 1, 1]
        scope = {}                                           # ClusterClient's docstring example, as written
        exec(docstring_example(ClusterClient, "nats://127.0.0.1:4222", srv.url), scope)
        assert (scope["reply"]["stream"], scope["other"]["stream"]) == ("imu-7", "imu-8")
    finally:
        for c in clients:
            c.close()
        H.terminate([worker] if worker else [])
        srv.kill()
    resynced = [r.getMessage() for r in caplog.records if "resynced" in r.getMessage()]
    assert len(resynced) == 2 and all(f"expects seq {K}" in m for m in resynced), resynced
    for name, got in replies.items():
        assert [(r["type"], r["stream"], r["seq"]) for r in got] == [("prediction", name, t) for t in range(2 * K)]
        for t, r in enumerate(got):
            assert r.pred.tobytes() == np.asarray(ref[(name, t)]).tobytes(), (name, t, r.pred, ref[(name, t)])
