"""``streamtrace cluster up`` keeps the cluster it started: the supervisor on its own (small child
processes), then the real command with a worker killed by SIGKILL under live traffic: restarted,
every step answered once, every prediction bit-identical to one engine. ``cluster status`` lists
live workers only and says in one line when no server answers."""
from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

pytest.importorskip("nats", reason="pip install 'streamtrace[cluster]' (make test installs it)")

from streamtrace.cluster import ClusterClient                          # noqa: E402
from streamtrace.cluster.nats_server import free_port                       # noqa: E402
from streamtrace.cluster.supervisor import Supervisor, describe_exit   # noqa: E402

import cluster_harness as H                                             # noqa: E402


def _child(code: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", code])


# ---- the supervisor alone -----------------------------------------------------------------
def test_a_member_that_dies_is_restarted_and_the_others_keep_running():
    sup = Supervisor(max_restarts=3, window_s=60, backoff_s=0.2, poll_s=0.02)
    starts = []

    def flaky():
        starts.append(time.monotonic())
        return _child("import time; time.sleep(60)")
    sup.add("steady", lambda: _child("import time; time.sleep(60)"))
    sup.add("flaky", flaky)
    steady_pid = sup.pids()["steady"]
    try:
        os.kill(sup.pids()["flaky"], signal.SIGKILL)
        deadline = time.monotonic() + 10
        while len(starts) < 2 and time.monotonic() < deadline:
            assert sup.check()
            time.sleep(0.02)
        assert len(starts) == 2 and starts[1] - starts[0] >= 0.2       # restarted, after the backoff
        assert sup.pids()["steady"] == steady_pid                     # the other never stopped
        assert sup.counts == {"exits": 1, "restarts": 1}
    finally:
        codes = sup.stop(grace_s=5)
    assert codes == {"steady": -signal.SIGTERM, "flaky": -signal.SIGTERM}


def test_the_supervisor_gives_up_past_its_restart_limit_with_backoff_doubling():
    sup = Supervisor(max_restarts=2, window_s=60, backoff_s=0.1, max_backoff_s=10, poll_s=0.01)
    starts = []

    def crashing():
        starts.append(time.monotonic())
        return _child("raise SystemExit(3)")
    sup.add("crashing", crashing)
    sup.add("steady", lambda: _child("import time; time.sleep(60)"), tier=1)
    assert sup.run() == 1 and sup.gave_up == "crashing"
    gaps = [b - a for a, b in zip(starts, starts[1:])]
    assert len(starts) == 3 and gaps[0] >= 0.1 and gaps[1] >= 0.2       # 0.1 s, then doubled
    assert sup.stop(grace_s=5) == {"steady": -signal.SIGTERM}       # the one that gave up is gone already
    assert describe_exit(-9) == "signal SIGKILL" and describe_exit(3) == "code 3"


# ---- the command --------------------------------------------------------------------------
def test_status_without_a_server_is_one_line_and_exit_2():
    out = subprocess.run([sys.executable, "-m", "streamtrace", "cluster", "status", "--nats",
                          f"nats://127.0.0.1:{free_port()}"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and out.stdout == "", out
    assert len(out.stderr.strip().splitlines()) == 1 and "cannot connect" in out.stderr, out.stderr


@pytest.mark.parametrize("flags", [["--workers", "0"], ["--brokers", "1", "--replicas", "3"]])
def test_cluster_up_refuses_bad_settings_in_one_line(flags):
    out = subprocess.run([sys.executable, "-m", "streamtrace", "cluster", "up", "--port", str(free_port()), *flags],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1, out
    # the parser's own refusal (a bad value) or cluster up's (settings that do not fit together)
    assert "cluster up" in out.stderr and flags[-2] in out.stderr, out.stderr


def test_cluster_up_passes_every_worker_setting_on(tmp_path, monkeypatch):
    import argparse
    monkeypatch.chdir(tmp_path)
    (tmp_path / "e.toml").write_text("")           # --config must name a file that is there

    from streamtrace.cluster.cli import add_parsers
    from streamtrace.cluster.up import worker_argv
    parser = argparse.ArgumentParser()
    add_parsers(parser.add_subparsers())
    args = parser.parse_args(["cluster", "up", "--config", "e.toml", "--partitions", "8", "--lease-ttl", "1.5",
                              "--checkpoint-every", "7", "--checkpoint-interval", "0.5", "--replicas", "3",
                              "--prometheus-port", "9100", "--token", "T", "-v"])
    argv = worker_argv(args, "nats://a:1,nats://b:2", prometheus_port=9102)
    worker = parser.parse_args(argv[3:])           # what the worker itself makes of it
    assert (worker.nats, worker.config, worker.partitions, worker.lease_ttl, worker.checkpoint_every,
            worker.checkpoint_interval, worker.replicas, worker.prometheus_port, worker.token, worker.verbose) == \
        ("nats://a:1,nats://b:2", "e.toml", 8, 1.5, 7, 0.5, 3, 9102, "T", True)


def test_verbose_means_streamtrace_info_only():
    from streamtrace.cluster.cli import verbose_logging
    root = logging.getLogger()
    saved = (root.level, list(root.handlers), logging.getLogger("streamtrace").level)
    try:
        verbose_logging(True)
        assert logging.getLogger("streamtrace.cluster").isEnabledFor(logging.INFO)
        assert not logging.getLogger("jax._src.xla_bridge").isEnabledFor(logging.INFO)
        assert not logging.getLogger("nats").isEnabledFor(logging.INFO)
        verbose_logging(False)
        assert not logging.getLogger("streamtrace.cluster").isEnabledFor(logging.INFO)
    finally:
        root.setLevel(saved[0])
        root.handlers[:] = saved[1]
        logging.getLogger("streamtrace").setLevel(saved[2])


def _children(pid: int) -> dict[int, list[str]]:
    """{pid: command line} of ``pid``'s child processes."""
    out = {}
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            for child in open(f"/proc/{pid}/task/{task}/children").read().split():
                try:
                    out[int(child)] = open(f"/proc/{child}/cmdline").read().split("\0")
                except FileNotFoundError:
                    pass
    except FileNotFoundError:
        pass
    return out


def _kill_tree(proc: subprocess.Popen):
    """SIGKILL ``proc`` and its children (a test that failed half-way leaves nothing running)."""
    if proc.poll() is None:
        kids = _children(proc.pid)
        proc.kill()
        proc.wait(30)
        for pid in kids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


@pytest.mark.slow
def test_cluster_up_restarts_a_killed_worker_and_every_step_is_answered_once(tmp_path):
    """``cluster up --workers 2``; 8 streams x 24 steps; one worker SIGKILLed half-way: it is
    logged with its exit status and restarted, the other keeps serving, every step is answered
    once and bit-identical to one engine, ``status`` lists two live workers and not the dead
    one, and SIGTERM ends it all with exit 0."""
    cfg = H.config(tmp_path)
    data = H.signals(8, 24)
    ref_preds, _ = H.reference(cfg, data)
    port = free_port()
    url = f"nats://127.0.0.1:{port}"
    up = subprocess.Popen([sys.executable, "-m", "streamtrace", "cluster", "up", "--workers", "2", "--port",
                           str(port), "--store", str(tmp_path / "store"), "--config", str(cfg), "--partitions",
                           str(H.P), "--lease-ttl", str(H.TTL), "--checkpoint-every", "20"],
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []
    threading.Thread(target=lambda: lines.extend(up.stdout), daemon=True).start()
    client = None
    try:
        deadline = time.monotonic() + 60
        while not any(ln.startswith("streamtrace cluster:") for ln in lines) and time.monotonic() < deadline:
            assert up.poll() is None, "".join(lines)
            time.sleep(0.1)
        H.wait_balanced(url, 2, timeout_s=120)
        workers = [c for c in _children(up.pid).values() if "worker" in c]
        assert len(workers) == 2 and all("--lease-ttl" in c and c[c.index("--lease-ttl") + 1] == str(H.TTL)
                                         and c[c.index("--checkpoint-every") + 1] == "20" for c in workers), workers
        dead = next(iter(H.status(url)["workers"]))
        client = ClusterClient(url, timeout_s=30)
        H.send_steps(client, data, 0, 12)
        got = H.collect(client, {(n, t) for n in data for t in range(12)})
        os.kill(H.status(url)["workers"][dead]["pid"], signal.SIGKILL)
        H.send_steps(client, data, 12, 24)
        got.update(H.collect(client, {(n, t) for n in data for t in range(12, 24)}, deadline_s=120))
        live = H.wait_balanced(url, 2, timeout_s=60)
        st = H.status(url)
        assert dead not in live and dead not in st["workers"] and len(st["workers"]) == 2, st["workers"]
        assert up.poll() is None                               # still keeping the cluster
        up.send_signal(signal.SIGTERM)
        assert up.wait(90) == 0
    finally:
        if client is not None:
            client.close()
        _kill_tree(up)
    log = "".join(lines)
    assert "worker 0 exited with signal SIGKILL" in log or "worker 1 exited with signal SIGKILL" in log, log
    assert log.count("restarted (pid") == 1, log
    assert set(got) == {(n, t) for n in data for t in range(24)}
    H.assert_same(got, ref_preds, {}, {})
