"""Three nats-servers clustered on loopback (``cluster up --brokers 3``'s layout), the log, leases
and checkpoints at 3 replicas with ``sync_interval: always``: the log's leader broker is killed
with SIGKILL mid-stream while a sensor publishes with JetStream acknowledgements. Oracle: every
acknowledged step is in the log once, answered, and its prediction and every stream's final state
are bit-identical to one engine fed the same steps (tests/cluster_harness.py)."""
from __future__ import annotations

import asyncio

import pytest

pytest.importorskip("nats", reason="pip install 'streamtrace[cluster]' (make test installs it)")

from streamtrace.cluster import ClusterClient                           # noqa: E402
from streamtrace.cluster.brokers import local_brokers, urls            # noqa: E402
from streamtrace.cluster.nats_server import find_server_binary              # noqa: E402

import cluster_harness as H                                             # noqa: E402


@pytest.fixture
def brokers(tmp_path):
    find_server_binary()
    nodes = local_brokers(3, port=0, store_dir=str(tmp_path / "store"), sync_interval="always")
    for n in nodes:
        n.spawn()
    try:
        for n in nodes:
            n.wait_ready()
        yield nodes
    finally:
        for n in nodes:
            n.kill()


@pytest.mark.slow
@pytest.mark.parametrize("which", ["leader", "follower"])
def test_killing_a_broker_loses_no_acknowledged_step(brokers, tmp_path, which):
    cfg = H.config(tmp_path)
    data = H.signals(6, 31)
    ref_preds, ref_states = H.reference(cfg, data)
    leader, replicas = asyncio.run(H.log_leader(urls(brokers)))
    assert replicas == 3
    victim = next(n for n in brokers if (n.name == leader) == (which == "leader"))
    others = urls([n for n in brokers if n is not victim])      # the sensor and the worker talk to these
    worker, out = H.start_worker(others, cfg, "--replicas", "3", "-v", wait=False), []
    H.wait_joined(worker, sink=out)
    try:
        first = {n: xs[:30] for n, xs in data.items()}
        answers, acks, stored = asyncio.run(asyncio.wait_for(H.sensor(others, first, 15, victim.kill), 60))
        with ClusterClient(others, timeout_s=30) as c:          # several URLs: the last step of each stream
            H.send_steps(c, data, 30, 31)
            answers.update(H.collect(c, {(n, 30) for n in data}))
        assert H.terminate([worker]) == [0]
        states = H.final_states(others, cfg)
    finally:
        H.terminate([worker])
    (tmp_path / "worker.log").write_text("".join(out))
    want = {(n, t) for n in data for t in range(31)}
    assert stored == len(want) - len(data), stored                       # each acknowledged step stored once, none lost
    assert set(answers) == want, (sorted(want - set(answers))[:5], "".join(out[-40:]))
    assert all(a["type"] == "prediction" for a in answers.values())
    H.assert_same(answers, ref_preds, states, ref_states)
    pause = max(b - a for a, b in zip(acks, acks[1:]))
    print(f"longest pause between acknowledged publishes (the election): {pause:.2f} s")
