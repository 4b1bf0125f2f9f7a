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



@pytest.mark.parametrize("joins_after", [2, None])
def test_creating_the_log_waits_while_too_few_brokers_have_joined(monkeypatch, joins_after):
    """JetStream answers 'no suitable peers for placement' (10005) while a cluster's servers are
    still joining (seen in CI: three brokers up, the log at 3 replicas created at once). The
    creation is retried until the peers are there; with them never coming, the error says what is
    missing."""
    from nats.js.errors import BadRequestError

    from streamtrace.cluster import jetstream as L
    calls = []

    async def placement(js, partitions, max_age_s, replicas):
        calls.append(replicas)
        if joins_after is None or len(calls) <= joins_after:
            raise BadRequestError(code=400, err_code=L.NO_PLACEMENT, description="no suitable peers for placement")
        return partitions

    monkeypatch.setattr(L, "_ensure", placement)
    if joins_after is None:
        with pytest.raises(RuntimeError, match="fewer than 3 servers to hold the log's copies within 1.2 s"):
            asyncio.run(L.ensure_log(None, 4, replicas=3, ready_s=1.2))
        assert 2 <= len(calls) <= 4                  # retried every 0.5 s, then gave up
    else:
        assert asyncio.run(L.ensure_log(None, 4, replicas=3, ready_s=30)) == 4
        assert len(calls) == joins_after + 1


def test_another_bad_request_is_not_retried(monkeypatch):
    from nats.js.errors import BadRequestError

    from streamtrace.cluster import jetstream as L
    calls = []

    async def refused(js, partitions, max_age_s, replicas):
        calls.append(1)
        raise BadRequestError(code=400, err_code=10074, description="replicas > 1 not supported in non-clustered mode")

    monkeypatch.setattr(L, "_ensure", refused)
    with pytest.raises(BadRequestError, match="non-clustered"):
        asyncio.run(L.ensure_log(None, 4, replicas=3, ready_s=30))
    assert len(calls) == 1
