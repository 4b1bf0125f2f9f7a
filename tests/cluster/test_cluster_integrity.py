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
from streamtrace.cluster import jetstream as L                                # noqa: E402
from streamtrace.cluster.lease import lease_key                         # noqa: E402
from streamtrace.cluster.nats_server import find_server_binary               # noqa: E402

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


async def _log_with_a_consumer_that_already_delivered(url: str, data: dict, taken: int) -> int:
    """The log holding every step of the one stream in ``data``; the consumer its partition's first
    owner will create (epoch 1, from log seq 1) made already, ``taken`` of its messages delivered
    to a pull that went away (as an earlier owner's, whose delete then failed). Returns the partition."""
    from streamtrace.cluster.owner import consumer_config
    (name, xs), = data.items()
    nc = await L.connect(url)
    js = nc.jetstream()
    await L.ensure_log(js, H.P)
    for t in range(len(xs)):
        ack = await js.publish(L.in_subject(name), wire.data_message(name, t, xs[t]))
    k = int((await js.get_msg(L.LOG_STREAM, ack.seq)).subject.split(".")[2])
    await js.add_consumer(L.LOG_STREAM, consumer_config(k, 1, 1))
    sub = await js.pull_subscribe_bind(f"p{k}-e1", L.LOG_STREAM)
    assert len(await sub.fetch(taken, timeout=5)) == taken
    await nc.close()
    return k


def _worker_in_this_process(url: str, cfg_path):
    """A Worker run on a thread of its own: (worker, thread, stop)."""
    import threading

    from streamtrace.cluster.worker import Worker
    from streamtrace.engine.config import load_config
    w, ready = Worker(url, load_config(cfg_path), lease_ttl_s=H.TTL, partitions=H.P), threading.Event()
    loops = []

    def on_ready(_):
        loops.append(asyncio.get_running_loop())
        ready.set()
    th = threading.Thread(target=lambda: asyncio.run(w.run(on_ready=on_ready)), daemon=True)
    th.start()
    assert ready.wait(120), "the worker did not join"
    return w, th, lambda: loops[0].call_soon_threadsafe(w.request_stop)


async def _answers_of_a_worker_started_now(url: str, cfg_path, steps: int):
    """({(stream, seq): the first answer}, the worker as ``_worker_in_this_process``) for steps 0..steps-1 of s0."""
    from streamtrace.transport.client import decode_reply
    nc = await L.connect(url)
    got = {}

    async def on_answer(msg):
        a = decode_reply(msg.data)
        got.setdefault((a["stream"], a["seq"]), a)
    await nc.subscribe("st.out.s0", cb=on_answer)
    await nc.subscribe("st.err.s0", cb=on_answer)
    worker = await asyncio.to_thread(_worker_in_this_process, url, cfg_path)
    deadline = time.monotonic() + 60
    while len(got) < steps and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
    await nc.close()
    return got, worker


@pytest.mark.slow
def test_a_delivery_the_worker_never_saw_is_replayed_not_learned_around(server, tmp_path, monkeypatch):
    """The consumer's delete fails once (its answer lost) and its create finds the old consumer,
    which had delivered the stream's first 3 steps elsewhere: without a check the next step would
    start the stream afresh (a new stream's first step may have any seq), a prediction no engine
    makes. The gap in the consumer's delivery count sends the owner back to a new consumer."""
    from nats.js.client import JetStreamContext
    cfg = H.config(tmp_path)
    data = H.signals(1, 8)
    ref_preds, _ = H.reference(cfg, data)
    k = asyncio.run(_log_with_a_consumer_that_already_delivered(server.url, data, 3))
    real, failed = JetStreamContext.delete_consumer, []

    async def delete_fails_once(self, stream, consumer):
        if consumer == f"p{k}-e1" and not failed:
            failed.append(consumer)
            raise asyncio.TimeoutError("the answer to a delete was lost")
        return await real(self, stream, consumer)
    monkeypatch.setattr(JetStreamContext, "delete_consumer", delete_fails_once)
    got, (w, th, stop) = asyncio.run(_answers_of_a_worker_started_now(server.url, cfg, 8))
    stop()
    th.join(60)
    assert failed == [f"p{k}-e1"]
    assert set(got) == {("s0", t) for t in range(8)}, sorted(got)
    for t in range(8):
        assert got[("s0", t)]["type"] == "prediction", got[("s0", t)]
        assert got[("s0", t)]["pred"].tobytes() == ref_preds[("s0", t)].tobytes(), t
    assert w.metrics.counters["delivery_gaps"] >= 1
