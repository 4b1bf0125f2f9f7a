"""Scale-out on NATS JetStream: real nats-server processes on loopback, workers as child
processes, every prediction and every final state compared bit for bit with one engine."""
from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

pytest.importorskip("nats", reason="pip install 'streamtrace[cluster]' (make test installs it)")

from streamtrace import wire                                            # noqa: E402
from streamtrace.cluster import ClusterClient, NatsServer, assign      # noqa: E402
from streamtrace.cluster import jetstream as L                                # noqa: E402
from streamtrace.cluster.nats_server import find_server_binary, free_port   # noqa: E402

import cluster_harness as H                                             # noqa: E402


@pytest.fixture
def server(tmp_path):
    find_server_binary()      # fails with what to install when the binary is missing
    srv = NatsServer(store_dir=str(tmp_path / "store")).start()
    yield srv
    srv.kill()


# ---- assignment (no server) ---------------------------------------------------------------
@pytest.mark.parametrize("P,n", [(8, 3), (64, 3), (16, 4), (7, 7), (3, 5)])
def test_assignment_is_even_and_complete(P, n):
    workers = [f"w{i}" for i in range(n)]
    owner = assign(P, workers)
    assert sorted(owner) == list(range(P))
    counts = [sum(1 for w in owner.values() if w == x) for x in workers]
    assert max(counts) - min(counts) <= 1
    assert assign(P, list(reversed(workers))) == owner      # the same from every worker's view


def test_assignment_moves_few_partitions_when_one_joins():
    before = assign(64, ["a", "b", "c"])
    after = assign(64, ["a", "b", "c", "d"])
    moved = sum(1 for k in range(64) if before[k] != after[k])
    assert 16 <= moved <= 24          # d's share (16) plus a few to rebalance the quotas, not a reshuffle


# ---- leases (real server) -----------------------------------------------------------------
def test_lease_compare_and_set_fences_a_stale_owner(server):
    from streamtrace.cluster.lease import LeaseLost, LeaseTable

    async def main():
        nc = await L.connect(server.url)
        js = nc.jetstream()
        await L.ensure_log(js, 4)
        kv = await js.key_value(L.LEASES)
        clock = [0.0]
        a, b = LeaseTable(kv, "a", 2.0, lambda: clock[0]), LeaseTable(kv, "b", 2.0, lambda: clock[0])
        la = await a.try_acquire(0)
        assert la is not None and la.epoch == 1
        assert await b.try_acquire(0) is None              # held, and b has only just seen it
        clock[0] = 1.0
        assert await b.try_acquire(0) is None
        assert not la.valid(2.5)                           # a's own window closes before b's (2.0 after b saw it)
        clock[0] = 2.1
        lb = await b.try_acquire(0)
        assert lb is not None and lb.epoch == 2
        with pytest.raises(LeaseLost):                     # the zombie's commit is refused by the server
            await a.renew(la, ckpt="p0.e1.s99", seq=99)
        rev, val = await a.read(0)
        assert (val["owner"], val["epoch"], val["ckpt"]) == ("b", 2, None)
        await b.release(lb, ckpt="p0.e2.s5", seq=5)
        lc = await a.try_acquire(0)                        # released: free at once
        assert (lc.epoch, lc.ckpt, lc.seq) == (3, "p0.e2.s5", 5)
        await nc.close()
    asyncio.run(asyncio.wait_for(main(), 60))


def test_a_worker_leaving_after_a_broker_restart_releases_every_lease_it_holds(server):
    """Leaving just after a broker restart: the last commit failed (its lease write landed, the
    answer was lost), the first release's answer is lost too, and a takeover whose answer was
    lost left this worker's name on a lease it never held. Every lease naming it ends released,
    partition 0 with a final checkpoint of its state; the one another owner took stays theirs."""
    import nats.errors

    from streamtrace.cluster.lease import LeaseTable, lease_key
    from streamtrace.cluster.owner import PartitionOwner
    from streamtrace.cluster.worker import COUNTERS, Worker
    from streamtrace.engine.counters import EngineCounters

    class Stepper:             # the partition's state as bytes: all a hand-over's checkpoint needs
        def snapshot(self, names, seq, extra):
            return f"state@{seq}".encode()

        def drop(self, names):
            pass

    def value(owner, epoch):
        return json.dumps({"owner": owner, "epoch": epoch, "ckpt": None, "seq": 0}).encode()

    async def main():
        nc = await L.connect(server.url)
        js = nc.jetstream()
        await L.ensure_log(js, 4)
        kv = await js.key_value(L.LEASES)
        w = Worker(server.url, None, wid="w", lease_ttl_s=1.5, partitions=4)
        w.nc, w.js, w.P, w.stepper, w.metrics = nc, js, 4, Stepper(), EngineCounters()
        for name in COUNTERS:
            w.metrics.counters.setdefault(name, 0)
        w.leases = LeaseTable(kv, "w", 1.5)
        w.workers_kv, w.objects = await js.key_value(L.WORKERS), await js.object_store(L.CHECKPOINTS)
        stopped = asyncio.get_running_loop().create_future()
        stopped.set_result(None)                       # the owners' run() returned

        lease0 = await w.leases.try_acquire(0)
        o0 = PartitionOwner(w, lease0)
        o0.applied = o0.answered = 7                   # 7 steps since the last committed checkpoint
        await kv.update(lease_key(0), value("w", 1), last=lease0.revision)     # the commit that landed

        async def answer_lost():
            raise nats.errors.TimeoutError
        o0.commit = asyncio.ensure_future(answer_lost())
        release, calls = w.leases.release, []

        async def first_answer_lost(lease, *a, **kw):
            await release(lease, *a, **kw)
            calls.append(lease.partition)
            if len(calls) == 1:
                raise nats.errors.TimeoutError
        w.leases.release = first_answer_lost

        lease1 = await w.leases.try_acquire(1)
        await kv.update(lease_key(1), value("x", 2), last=lease1.revision)     # x took it over
        await w.leases.try_acquire(2)                  # named, never held
        w.owners = {0: (o0, stopped), 1: (PartitionOwner(w, lease1), stopped)}
        t0 = time.monotonic()
        await w._leave()
        took = time.monotonic() - t0

        nc = await L.connect(server.url)
        js = nc.jetstream()
        kv, obj = await js.key_value(L.LEASES), await js.object_store(L.CHECKPOINTS)
        leases = {k: json.loads((await kv.get(lease_key(k))).value) for k in range(3)}
        final = (await obj.get(leases[0]["ckpt"])).data if leases[0]["ckpt"] else None
        await nc.close()
        return w.metrics.counters, leases, final, took

    counters, leases, final, took = asyncio.run(asyncio.wait_for(main(), 60))
    assert [(v["owner"], v["epoch"]) for v in leases.values()] == [("", 1), ("x", 2), ("", 1)], leases
    assert (leases[0]["ckpt"], leases[0]["seq"], final) == ("p0.e1.s7", 7, b"state@7")
    assert (counters["released"], counters["leases_lost"]) == (1, 1)
    assert took < 5.0                  # retried while the broker did not answer, not waited out


def test_log_partitions_by_subject_transform(server):
    async def main():
        nc = await L.connect(server.url)
        js = nc.jetstream()
        assert await L.ensure_log(js, 4) == 4
        with pytest.raises(ValueError, match="created with 4 partitions"):
            await L.ensure_log(js, 8)
        for name in ("a", "b", "sensor-7"):
            await js.publish(L.in_subject(name), b"x")
        subjects = [(await js.get_msg(L.LOG_STREAM, seq)).subject for seq in (1, 2, 3)]
        await nc.close()
        return subjects
    subjects = asyncio.run(asyncio.wait_for(main(), 60))
    for s, name in zip(subjects, ("a", "b", "sensor-7")):
        _, _, k, stream = s.split(".", 3)
        assert stream == name and 0 <= int(k) < 4


def test_stream_ids_that_are_not_subject_tokens_are_refused():
    for bad in ("a.b", "a b", "a*", ">", ""):
        with pytest.raises(ValueError, match="subject token"):
            L.check_stream_id(bad)


# ---- end to end ---------------------------------------------------------------------------
def test_workers_match_one_engine_through_kill9_and_a_zombie(server, tmp_path):
    """3 workers; one is killed with SIGKILL mid-run, another paused (SIGSTOP) past its lease
    and resumed: every step answered once after de-duplication, every prediction and every
    final state bit-identical to one engine; the zombie publishes nothing as owner after it wakes."""
    cfg = H.config(tmp_path)
    data = H.signals(12, 36)
    ref_preds, ref_states = H.reference(cfg, data)
    # no checkpoint before the workers leave: a failover replays from the start, so it must answer again
    workers = [H.start_worker(server.url, cfg, "--checkpoint-every", "100000", "--checkpoint-interval", "600",
                              wait=False) for _ in range(3)]
    ids = [H.wait_joined(w) for w in workers]
    assert sorted(H.wait_balanced(server.url, 3).values()) == [2, 3, 3]
    client = ClusterClient(server.url, timeout_s=30)
    client.trace = []
    try:
        want = {(n, t) for n in data for t in range(36)}
        H.send_steps(client, data, 0, 12)
        got = H.collect(client, {(n, t) for n in data for t in range(12)})
        H.send_steps(client, data, 12, 24)
        workers[0].kill()                                    # kill -9 mid-run, steps in flight
        got.update(H.collect(client, {(n, t) for n in data for t in range(12, 24)}))
        os.kill(workers[1].pid, signal.SIGSTOP)              # the zombie: paused past its lease
        H.send_steps(client, data, 24, 30)
        got.update(H.collect(client, {(n, t) for n in data for t in range(24, 30)}))
        time.sleep(3 * H.TTL)
        os.kill(workers[1].pid, signal.SIGCONT)
        t_wake = time.monotonic()
        H.send_steps(client, data, 30, 36)
        got.update(H.collect(client, want - set(got)))
        time.sleep(2 * H.TTL)
        zombie = H.live_worker(server.url, ids[1])["counters"]
        assert zombie["leases_lost"] >= 1, zombie          # it found out by a refused compare-and-set
        codes = H.terminate(workers[1:])
        assert codes == [0, 0], codes
        # nothing from the zombie's old epochs once it had been awake a moment (its buffered
        # bytes from before the pause may still land in the first instants)
        late = [h for t, _, h in client.trace if t > t_wake + 0.5 and h.get("St-Worker") == ids[1]]
        epochs_after = {}
        for t, _, h in client.trace:
            if t > t_wake + 0.5:
                k = int(h["St-Partition"])
                epochs_after[k] = max(epochs_after.get(k, 0), int(h["St-Epoch"]))
        stale = [h for h in late if int(h["St-Epoch"]) < epochs_after[int(h["St-Partition"])]]
        assert not stale, f"the zombie published {len(stale)} answers as a stale owner"
        states = H.final_states(server.url, cfg)
    finally:
        client.close()
        H.terminate(workers)
    assert set(got) == want
    H.assert_same(got, ref_preds, states, ref_states)
    assert client.duplicates > 0        # the replays answered steps again; the caller saw each once


def test_join_leave_and_broker_restart_lose_nothing(tmp_path):
    """2 workers, a 3rd joins, one leaves by SIGTERM (exit 0), then nats-server is killed and
    restarted on its store: 0 steps lost, predictions and final states bit-identical."""
    cfg = H.config(tmp_path)
    data = H.signals(10, 32)
    ref_preds, ref_states = H.reference(cfg, data)
    port = free_port()
    srv = NatsServer(port=port, store_dir=str(tmp_path / "store")).start()
    workers = [H.start_worker(srv.url, cfg, wait=False) for _ in range(2)]
    for w in workers:
        H.wait_joined(w)
    assert sorted(H.wait_balanced(srv.url, 2).values()) == [4, 4]
    client = ClusterClient(srv.url, timeout_s=30)
    try:
        got = {}
        H.send_steps(client, data, 0, 8)
        got.update(H.collect(client, {(n, t) for n in data for t in range(8)}))
        workers.append(H.start_worker(srv.url, cfg))                  # joins mid-run
        H.send_steps(client, data, 8, 12)
        assert sorted(H.wait_balanced(srv.url, 3).values()) == [2, 3, 3]
        H.send_steps(client, data, 12, 16)
        got.update(H.collect(client, {(n, t) for n in data for t in range(8, 16)}))
        workers[0].terminate()                                         # leaves: checkpoint, release, exit 0
        assert workers[0].wait(60) == 0
        assert sorted(H.wait_balanced(srv.url, 2).values()) == [4, 4]
        H.send_steps(client, data, 16, 24)
        got.update(H.collect(client, {(n, t) for n in data for t in range(16, 24)}))
        srv.kill()                                                     # the broker dies and comes back
        srv = NatsServer(port=port, store_dir=str(tmp_path / "store")).start()
        H.send_steps(client, data, 24, 32)
        got.update(H.collect(client, {(n, t) for n in data for t in range(24, 32)}, deadline_s=90))
        for p in H.status(srv.url)["partitions"]:    # acked only what a committed checkpoint covers
            assert p["acked_seq"] is None or p["acked_seq"] <= p["checkpoint_seq"], p
        assert H.terminate(workers[1:]) == [0, 0]
        states = H.final_states(srv.url, cfg)
    finally:
        client.close()
        H.terminate(workers)
        srv.kill()
    H.assert_same(got, ref_preds, states, ref_states)


def test_bad_messages_are_refused_and_the_partition_keeps_flowing(tmp_path):
    """A token-protected server: a worker and a client without the token are turned away; bad
    messages through NATS get errors on st.err.<stream>, good ones around them are answered,
    and the workers' counters balance with what was sent."""
    cfg = H.config(tmp_path)
    srv = NatsServer(token="s3cret", store_dir=str(tmp_path / "store")).start()
    worker = None
    try:
        with pytest.raises(ConnectionError, match="Authorization"):
            ClusterClient(srv.url)
        intruder = H.start_worker(srv.url, cfg, wait=False)
        assert intruder.wait(120) == 2
        assert "Authorization" in intruder.stdout.read()
        prom = free_port()
        worker = H.start_worker(srv.url, cfg, "--token", "s3cret", "--prometheus-port", str(prom))
        with ClusterClient(srv.url, stream="good", timeout_s=30, creds=L.Credentials(token="s3cret")) as c:
            x = np.array([0.5], np.float32)
            assert c.step(x)["seq"] == 0
            bad = [b"\x00garbage", wire.data_message("good", 1, np.zeros(3, np.float32)),
                   wire.data_message("good", 1, np.array([np.nan], np.float32)),
                   wire.data_message("other", 1, x),                    # on good's subject
                   wire.encode({"type": "get_weights"})]
            for raw in bad:
                c.send_raw(raw, stream="good")
            codes = sorted(c.recv(raise_errors=False)["code"] for _ in bad)
            assert codes == sorted(["not_msgpack", "bad_shape", "not_finite", "bad_stream", "bad_type"])
            assert c.step(x)["seq"] == 1 and c.step(x)["seq"] == 2     # the partition keeps flowing
        time.sleep(1.0)                                                 # a heartbeat with the counters
        with ClusterClient(srv.url, stream="probe", creds=L.Credentials(token="s3cret")) as c:
            from streamtrace.cluster.status import gather
            st = c._call(gather(c.nc))
        counters = next(iter(st["workers"].values()))["counters"]
        assert (counters["published"], counters["refused"]) == (3, len(bad))     # before the replay below
        assert sum(1 for p in st["partitions"] if p["owner"] != "-") == H.P
        import urllib.request
        metrics = urllib.request.urlopen(f"http://127.0.0.1:{prom}/metrics", timeout=10).read().decode()
        assert 'streamtrace_events_total{event="published"} 3.0' in metrics
        out = subprocess.run([sys.executable, "-m", "streamtrace", "cluster", "status", "--nats", srv.url,
                              "--token", "s3cret"], capture_output=True, text=True, timeout=120)
        assert out.returncode == 0 and "1 worker(s)" in out.stdout and "published 3" in out.stdout, out
        csv = tmp_path / "rows.csv"
        csv.write_text("\n".join(str(v) for v in np.sin(np.arange(30) / 4)) + "\n")
        out = subprocess.run([sys.executable, "-m", "streamtrace", "replay", str(csv), "--nats",
                              srv.url.replace("nats://", "nats://s3cret@"), "--timeout", "30"],
                             capture_output=True, text=True, timeout=180)
        assert out.returncode == 0 and json.loads(out.stdout.splitlines()[-1])["steps"] == 30, out
        assert H.terminate([worker]) == [0]
    finally:
        H.terminate([worker] if worker else [])
        srv.kill()


def test_client_hands_each_answer_over_once(server):
    """A replayed answer (same stream and seq, higher epoch) reaches the caller once; an error
    and a later prediction for the same seq (a refused step resent) both do."""
    with ClusterClient(server.url, stream="d", timeout_s=10) as c:
        c.send_raw(b"", stream="d")          # subscribes to d's answers (nobody consumes the log here)
        pred = wire.PredictionEncoder()("d", 0, np.zeros(1, np.float32), 0.5, 1, 0, 0.0)
        err = wire.encode({"type": "error", "code": "bad_shape", "message": "x", "stream": "d", "seq": 1})
        for body, epoch in ((pred, 1), (pred, 2), (err, 1), (err, 2)):
            c._call(c.nc.publish(L.out_subject("d"), body, headers={"St-Epoch": str(epoch)}))
        got = [c.recv(5.0), c.recv(5.0, raise_errors=False)]
        assert [(a["type"], a["seq"], a["epoch"]) for a in got] == [("prediction", 0, 1), ("error", 1, 1)]
        with pytest.raises(TimeoutError):
            c.recv(0.5)
        assert c.duplicates == 2
        c._call(c.nc.publish(L.out_subject("d"), wire.PredictionEncoder()("d", 1, np.ones(1, np.float32), 0.1, 2, 0,
                                                                         0.0)))
        assert c.recv(5.0)["seq"] == 1        # the resent step's prediction is not a duplicate of its error


def test_a_server_beyond_loopback_needs_credentials():
    from streamtrace.cluster.nats_server import ServerError
    with pytest.raises(ServerError, match="without credentials"):
        NatsServer(host="0.0.0.0")
    NatsServer(host="0.0.0.0", token="t")                 # constructed, not started
    NatsServer(host="0.0.0.0", allow_anonymous=True)      # allowed, logged loudly


@pytest.mark.parametrize("seed", range(200))
def test_assignment_evens_out_streams_hashed_unevenly(seed):
    """20 streams land on 16 partitions at random (as the server's hash spreads names); after
    the swaps the busiest of 3 workers carries at most 1.5x the streams of the least busy,
    partition counts still within one, and every worker's view gives the same answer."""
    rng = np.random.default_rng(seed)
    weights = {}
    for k in rng.integers(0, 16, 20):
        weights[int(k)] = weights.get(int(k), 0) + 1
    owner = assign(16, ["w0", "w1", "w2"], weights)
    load = {w: sum(weights.get(k, 0) for k, x in owner.items() if x == w) for w in ("w0", "w1", "w2")}
    counts = [sum(1 for x in owner.values() if x == w) for w in ("w0", "w1", "w2")]
    assert sum(load.values()) == 20 and sorted(owner) == list(range(16))
    assert max(load.values()) <= 1.5 * min(load.values()), (weights, load)
    assert max(counts) - min(counts) <= 1
    assert assign(16, ["w2", "w0", "w1"], dict(reversed(list(weights.items())))) == owner


def test_balancing_moves_few_partitions():
    """Weights only swap what they must: against the unweighted assignment at most a few of 64
    partitions change hands (the unweighted one is already even by counts)."""
    rng = np.random.default_rng(7)
    weights = {int(k): int(v) for k, v in zip(range(64), rng.integers(0, 3, 64))}
    plain, weighted = assign(64, ["a", "b", "c"]), assign(64, ["a", "b", "c"], weights)
    assert sum(plain[k] != weighted[k] for k in range(64)) <= 8
