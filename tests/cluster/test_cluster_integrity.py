"""End-to-end integrity of the cluster's log and checkpoints: a hole in a stream's steps is
replayed once, then refused to its client and counted, never learned around; a checkpoint
whose bytes were damaged after it was committed (one byte flipped) is caught by its SHA-256
and the previous checkpoint plus a longer replay used instead. Oracle: one engine fed the same
steps (tests/cluster_harness.py), bit for bit."""
from __future__ import annotations

import asyncio
import json
import time

import pytest

pytest.importorskip("nats", reason="pip install 'streamtrace[cluster]' (make test installs it)")

from streamtrace import wire                                            # noqa: E402
from streamtrace.cluster import ClusterClient, NatsServer               # noqa: E402
from streamtrace.cluster import log as L                                # noqa: E402
from streamtrace.cluster.lease import lease_key                         # noqa: E402
from streamtrace.cluster.server import find_server_binary               # noqa: E402

import cluster_harness as H                                             # noqa: E402


@pytest.fixture
def server(tmp_path):
    find_server_binary()
    srv = NatsServer(store_dir=str(tmp_path / "store")).start()
    yield srv
    srv.kill()


def _counters(url: str) -> dict:
    (w,) = H.status(url)["workers"].values()
    return w["counters"]


@pytest.mark.slow
def test_a_hole_in_a_stream_is_refused_and_counted_not_learned_around(server, tmp_path):
    cfg = H.config(tmp_path)
    data = H.signals(1, 4)
    ref_preds, _ = H.reference(cfg, data)
    xs = data["s0"]
    worker = H.start_worker(server.url, cfg)
    try:
        with ClusterClient(server.url, stream="s0", timeout_s=30) as c:
            got = {t: c.step(xs[t]) for t in range(2)}
            c.send_raw(wire.data_message("s0", 3, xs[3]), stream="s0")      # step 2 never reaches the log
            err = c.recv(30, raise_errors=False)                               # returned, not raised
            assert (err["type"], err["code"], err["seq"], err["expected"]) == ("error", "gap", 3, 2), err
            for t in (2, 3):                                                 # resent in order: learned
                c.send_raw(wire.data_message("s0", t, xs[t]), stream="s0")
            got.update({a["seq"]: a for a in (c.recv(30), c.recv(30))})
            assert sorted(got) == [0, 1, 2, 3]
        time.sleep(1.0)                                                    # a heartbeat with the counters
        counters = _counters(server.url)
        assert (counters["hole_replays"], counters["log_holes"]) == (1, 1), counters
        assert H.terminate([worker]) == [0]
    finally:
        H.terminate([worker])
    for t in range(4):       # the state never skipped step 2: every prediction is one engine's
        assert got[t]["pred"].tobytes() == ref_preds[("s0", t)].tobytes()


async def _damage_newest_checkpoint(url: str) -> tuple[int, str]:
    """Flip the last byte of a partition's committed checkpoint (one that has a previous one)."""
    nc = await L.connect(url)
    js = nc.jetstream()
    kv, obj = await js.key_value(L.LEASES), await js.object_store(L.CHECKPOINTS)
    for k in range(H.P):
        v = json.loads((await kv.get(lease_key(k))).value)
        if v.get("ckpt") and (v.get("prev") or {}).get("ckpt"):
            raw = bytearray((await obj.get(v["ckpt"])).data)
            raw[-1] ^= 0x01
            await obj.put(v["ckpt"], bytes(raw))
            await nc.close()
            return k, v["ckpt"]
    await nc.close()
    raise AssertionError("no partition has two checkpoints")


@pytest.mark.slow
def test_a_damaged_checkpoint_falls_back_to_the_previous_one(server, tmp_path):
    cfg = H.config(tmp_path)
    data = H.signals(4, 30)
    ref_preds, ref_states = H.reference(cfg, data)
    ckpt = ("--checkpoint-every", "5", "--checkpoint-interval", "600")
    workers = [H.start_worker(server.url, cfg, *ckpt)]
    client = ClusterClient(server.url, timeout_s=30)
    try:
        got = {}
        for t0 in (0, 10):        # two halves: a partition's steps fetched in one batch make one checkpoint
            H.send_steps(client, data, t0, t0 + 10)
            got.update(H.collect(client, {(n, t) for n in data for t in range(t0, t0 + 10)}))
        assert H.terminate(workers) == [0]                 # final checkpoints committed, leases released
        k, name = asyncio.run(_damage_newest_checkpoint(server.url))
        workers.append(H.start_worker(server.url, cfg, *ckpt))
        H.send_steps(client, data, 20, 30)
        got.update(H.collect(client, {(n, t) for n in data for t in range(20, 30)}))
        time.sleep(1.0)
        counters = _counters(server.url)
        assert counters["checkpoints_damaged"] == 1, counters
        assert client.duplicates > 0                        # the longer replay answered old steps again
        assert H.terminate(workers[1:]) == [0]
        states = H.final_states(server.url, cfg)
    finally:
        client.close()
        H.terminate(workers)
    H.assert_same(got, ref_preds, states, ref_states)
