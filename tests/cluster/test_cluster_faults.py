"""Faults tested like a database, on three clustered nats-servers (the log, leases and
checkpoints at 3 replicas, ``sync_interval: always``) and two workers: a broker paused with
SIGSTOP for 10 s; the brokers restarted one by one; a worker cut off the brokers in a network
namespace and healed. A sensor publishes every step with JetStream acknowledgements (resent until
stored) while the fault happens. Oracles, each case: every acknowledged step stored once and
answered; every answer, duplicates included, and every stream's final state bit-identical to one
engine fed the same steps; no answer published by an owner after its partition's next epoch was
taken over (tests/cluster_harness.py: ``assert_fenced``)."""
from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import threading
import time

import pytest

pytest.importorskip("nats", reason="pip install 'streamtrace[cluster]' (make test installs it)")

from streamtrace.cluster.brokers import local_brokers, urls            # noqa: E402
from streamtrace.cluster.nats_server import find_server_binary              # noqa: E402

import cluster_harness as H                                             # noqa: E402

STREAMS, STEPS, PACE_S = 4, 40, 0.3      # 12 s of traffic: the faults happen while it flows


def run_through(tmp_path, nodes, fault, *, cut=None, fault_at=12):
    """Two workers (``cut``: argv prefix of the first one, e.g. a network namespace), the sensor
    publishing STEPS steps of STREAMS streams with ``fault`` started in a thread at step
    ``fault_at``; every oracle above checked. Returns (longest pause between acknowledged
    publishes, answers checked, duplicates, takeovers: lease epochs begun after the fault began)."""
    cfg = H.config(tmp_path)
    data = H.signals(STREAMS, STEPS)
    ref_preds, ref_states = H.reference(cfg, data)
    url = urls(nodes)
    workers, out = [], []
    for prefix in (cut or (), ()):
        workers.append(H.start_worker(url, cfg, "--replicas", "3", wait=False, prefix=prefix))
    for w in workers:
        H.wait_joined(w, sink=out)
    began = []

    def timed():
        began.append(time.time())
        fault()
    thread = threading.Thread(target=timed, daemon=True)
    audit: dict = {}
    try:
        answers, acks, stored = asyncio.run(asyncio.wait_for(
            H.sensor(url, data, fault_at, thread.start, deadline_s=90, audit=audit, pace_s=PACE_S), 120))
        thread.join(60)
        assert not thread.is_alive(), "the fault did not finish"
        codes = H.terminate(workers)
        assert codes == [0, 0], (codes, "".join(out[-40:]))
        states = H.final_states(url, cfg)
    finally:
        H.terminate(workers)
        (tmp_path / "workers.log").write_text("".join(out))
    want = {(n, t) for n in data for t in range(STEPS)}
    assert stored == len(want), stored                     # every acknowledged step stored once, none lost
    assert set(answers) == want, (sorted(want - set(answers))[:5], "".join(out[-40:]))
    H.assert_same(answers, ref_preds, states, ref_states)
    checked = H.assert_fenced(audit, ref_preds)
    pause = max(b - a for a, b in zip(acks, acks[1:]))
    first_seen = {}
    for t, k, e in audit["leases"]:
        first_seen.setdefault((k, e), t)
    takeovers = sum(1 for t in first_seen.values() if t > began[0])
    print(f"longest pause between acknowledged publishes {pause:.2f} s; {checked} answers checked "
          f"({checked - len(want)} repeats); {takeovers} lease takeovers")
    return pause, checked, checked - len(want), takeovers


def start(nodes):
    for n in nodes:
        n.spawn()
    for n in nodes:
        n.wait_ready()
    return nodes


@pytest.fixture
def brokers(tmp_path):
    find_server_binary()
    nodes = start(local_brokers(3, port=0, store_dir=str(tmp_path / "store"), sync_interval="always"))
    yield nodes
    for n in nodes:
        n.kill()


@pytest.mark.slow
def test_a_broker_paused_for_ten_seconds(brokers, tmp_path):
    """SIGSTOP of the log's leader broker (connections stay open, nothing answers) for 10 s
    mid-stream, then SIGCONT: clients and workers connected to it stall, the other two elect a
    leader and keep the quorum."""
    def pause():
        leader, _ = asyncio.run(H.log_leader(urls(brokers)))
        victim = next(n for n in brokers if n.name == leader)
        os.kill(victim.proc.pid, signal.SIGSTOP)
        try:
            time.sleep(10)
        finally:
            os.kill(victim.proc.pid, signal.SIGCONT)
    run_through(tmp_path, brokers, pause, fault_at=8)


@pytest.mark.slow
def test_the_brokers_restarted_one_by_one(brokers, tmp_path):
    """A rolling restart: each broker stopped (SIGTERM) and started again on its store, the next
    one only once it is back, while the sensor publishes."""
    def rolling():
        for n in brokers:
            n.stop()
            time.sleep(0.5)
            n.spawn()
            n.wait_ready()
            time.sleep(2.0)          # the restarted node catches up with the replicas' log
    run_through(tmp_path, brokers, rolling, fault_at=4)


def _ip(*args, ns=None):
    cmd = (["ip", "netns", "exec", ns] if ns else []) + ["ip", *args]
    subprocess.run(cmd, check=True, capture_output=True, timeout=10)


@pytest.fixture
def netns():
    """A network namespace joined to this one by a veth pair: (namespace, host-side link, host
    address, namespace address); skipped with the reason where it cannot be made."""
    tag = os.getpid() % 100000
    ns, host, peer = f"st-{tag}", f"stv{tag}h", f"stv{tag}n"
    a, b = 200 + tag % 50, tag % 250
    here, there = f"10.{a}.{b}.1", f"10.{a}.{b}.2"
    try:
        _ip("netns", "add", ns)
    except (OSError, subprocess.SubprocessError) as e:
        pytest.skip(f"cannot create a network namespace here ({type(e).__name__}: "
                    f"{getattr(e, 'stderr', b'') or e}): needs root and iproute2")
    try:
        _ip("link", "add", host, "type", "veth", "peer", "name", peer)
        _ip("link", "set", peer, "netns", ns)
        _ip("addr", "add", f"{here}/30", "dev", host)
        _ip("link", "set", host, "up")
        _ip("addr", "add", f"{there}/30", "dev", peer, ns=ns)
        _ip("link", "set", peer, "up", ns=ns)
        _ip("link", "set", "lo", "up", ns=ns)
        yield ns, host, here
    finally:
        subprocess.run(["ip", "link", "del", host], capture_output=True, timeout=10)
        subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=10)


@pytest.mark.slow
def test_a_worker_cut_off_the_brokers_and_healed(netns, tmp_path):
    """The first worker runs in a network namespace, reaching the brokers over a veth pair; the
    link is cut for 3 lease ttls (its TCP connections stall: no reset, no answer) and healed.
    The other worker takes its partitions over once its lease runs out; the cut one finds its
    leases gone when it is back (a refused compare-and-set) and rejoins."""
    find_server_binary()
    ns, link, here = netns
    nodes = start(local_brokers(3, host=here, port=0, store_dir=str(tmp_path / "store"), sync_interval="always",
                                allow_anonymous=True))
    try:
        def cut():
            _ip("link", "set", link, "down")
            try:
                time.sleep(3 * H.TTL)
            finally:
                _ip("link", "set", link, "up")
        *_, takeovers = run_through(tmp_path, nodes, cut, cut=("ip", "netns", "exec", ns))
        assert takeovers >= 1           # the cut worker's partitions did change hands
    finally:
        for n in nodes:
            n.kill()
