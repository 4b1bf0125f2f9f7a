"""Streams spread evenly over workers: 20 streams over 3 real workers on a real nats-server,
each worker's stream count as ``cluster status`` shows it."""
from __future__ import annotations

import time

import pytest

pytest.importorskip("nats", reason="pip install 'streamtrace[cluster]' (make test installs it)")

from streamtrace.cluster import ClusterClient, NatsServer             # noqa: E402
from streamtrace.cluster.nats_server import find_server_binary             # noqa: E402
from streamtrace.cluster.status import format_status                  # noqa: E402

import cluster_harness as H                                            # noqa: E402


@pytest.mark.slow
def test_twenty_streams_spread_over_three_workers(tmp_path):
    """16 partitions (the default): the busiest worker ends with at most 1.5x the streams of the
    least busy, every stream on exactly one, every step answered; status lists each live worker
    with its heartbeat age and stream count."""
    find_server_binary()
    cfg = H.config(tmp_path, slots=24)
    srv = NatsServer(store_dir=str(tmp_path / "store")).start()
    workers = [H.start_worker(srv.url, cfg, "--partitions", "16", wait=False) for _ in range(3)]
    client = None
    try:
        ids = [H.wait_joined(w) for w in workers]
        H.wait_balanced(srv.url, 3)
        data = H.signals(20, 12)
        client = ClusterClient(srv.url, timeout_s=30)
        H.send_steps(client, data, 0, 6)
        H.collect(client, {(n, t) for n in data for t in range(6)})
        deadline, counts = time.monotonic() + 30, {}
        while time.monotonic() < deadline:
            st = H.status(srv.url)
            counts = {w: v["streams"] for w, v in st["workers"].items()}
            if len(counts) == 3 and sum(counts.values()) == 20 and max(counts.values()) <= 1.5 * min(counts.values()):
                break
            time.sleep(0.5)
        assert sorted(counts) == sorted(ids) and sum(counts.values()) == 20, counts
        assert max(counts.values()) <= 1.5 * min(counts.values()), counts
        print(f"streams per worker: {sorted(counts.values())}")
        text = format_status(st)
        for w in ids:
            assert f"{w}: heartbeat " in text and f"{counts[w]} streams" in text.split(f"{w}: heartbeat ")[1]
        H.send_steps(client, data, 6, 12)         # still answered after the partitions moved
        H.collect(client, {(n, t) for n in data for t in range(6, 12)})
    finally:
        if client is not None:
            client.close()
        assert H.terminate(workers) == [0, 0, 0]
        srv.kill()
