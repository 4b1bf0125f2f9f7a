"""The runner's server (``streamtrace-runner serve``) against ``streamtrace serve``, side by side in
one run, the default learner (or ``--config``'s), one stream, the same client
(``launch.roundtrips``: SensorClient):

    python bench/runner_server.py [--steps 2000] [--rounds 3] [--cgroup-mb 48] [--md FILE]
                                  [--config FILE] [--period-us US] [--runner-python DEVICE_VENV/bin/python]
                                  [--runner NAME=PYTHON[,ARG...]] ...

``--runner`` (repeatable) measures several runners in the same rounds, each against the same
round's ``serve`` (e.g. ``before=OLD_VENV/bin/python`` and ``after=NEW_VENV/bin/python``, or
``off=VENV/bin/python,--no-reply-first``); without it, one runner of ``--runner-python``.
``--period-us``: the timed round trips paced, a request every that many microseconds (a sensor
sampling at that rate), not back to back.

Per round and side, a fresh process: start to first answer (Popen to the first reply a client
gets, connecting once the ROUTER's ipc socket exists), ``steps`` timed round trips after 200 untimed (median, p99), the peak
RSS (VmHWM) and, at the end, its anonymous and file-backed parts (the latter depends on the page
cache: libraries whose files were just written, as by ``pip install``, are mapped in full
64 kB windows around each page touched; after a reboot only what was read). Then the runner alone inside a cgroup-v1 memory cgroup of ``--cgroup-mb`` (the
process and its children; swap off through memory.memsw where the kernel has it): steps
answered and the cgroup's OOM kills. Ratios: median over rounds of runner / serve.
"""
from __future__ import annotations

import argparse
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
CG = Path("/sys/fs/cgroup/memory")


def _first_answer(proc, endpoint, t0) -> float:
    from streamtrace.transport import SensorClient
    path = Path(endpoint[len("ipc://"):])
    while not path.exists():      # bound: connecting earlier waits out ZeroMQ's 100 ms reconnect interval
        if proc.poll() is not None:
            raise RuntimeError(f"exited with {proc.returncode}")
        time.sleep(0.001)
    with SensorClient(endpoint, stream="first", timeout_s=0.05) as c:
        while True:
            try:
                c.step(np.zeros(1))
                return time.perf_counter() - t0
            except TimeoutError:
                if proc.poll() is not None:
                    raise RuntimeError(f"exited with {proc.returncode}") from None
                c.numbering.next.pop("first", None)


def _memory_mb(pid) -> dict:
    """The peak RSS (VmHWM) and, now, its anonymous part (the process's own: heap, Python's
    objects, the state) and its file-backed part (the libraries' pages mapped: how many
    depends on what of them the page cache holds, so it moves from run to run)."""
    keys = {"VmHWM": "rss_mb", "RssAnon": "anon_mb", "RssFile": "file_mb"}
    got = dict.fromkeys(keys.values(), float("nan"))
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in keys:
            got[keys[key]] = int(value.split()[0]) / 1024
    return got


def one(side, folder, work, steps, preexec=None, python=sys.executable, args=(), config="", period_us=0.0) -> dict:
    """One fresh process of ``side`` ("serve", else a runner of ``python`` with ``args``)."""
    from streamtrace.transport import SensorClient  # noqa: F401 - imported before the clock starts
    from streamtrace.transport.timing import roundtrips
    sock = f"ipc://{work}/{side}"
    if side != "serve":
        cmd = [python, "-m", "streamtrace_runner", "serve", str(folder), "--router", sock, "--pull", "", "--pub", "",
               *args]
    else:
        cfg = Path(work) / "serve.toml"
        cfg.write_text(f'{config}\n[sockets]\nrouter = "{sock}"\npull = ""\npub = ""\n')
        cmd = [sys.executable, "-m", "streamtrace", "serve", "--config", str(cfg)]
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, preexec_fn=preexec)
    try:
        start = _first_answer(proc, sock, t0)
        rt = roundtrips(sock, steps, None, warmup=200, period_us=period_us)
        return {"start_s": start, "rt_p50_us": float(np.median(rt)), "rt_p99_us": float(np.percentile(rt, 99)),
                **_memory_mb(proc.pid), "pid": proc.pid}
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)


def in_cgroup(folder, work, steps, mb, python=sys.executable, args=()) -> str:
    if not (CG / "memory.limit_in_bytes").exists():
        return f"no cgroup-v1 memory controller at {CG}: not run"
    group = CG / f"streamtrace-runner-bench-{os.getpid()}"
    group.mkdir()
    try:
        (group / "memory.limit_in_bytes").write_text(str(mb << 20))
        if (group / "memory.memsw.limit_in_bytes").exists():
            (group / "memory.memsw.limit_in_bytes").write_text(str(mb << 20))
        procs = str(group / "cgroup.procs")
        got = one("runner", folder, work, steps, preexec=lambda: Path(procs).write_text(str(os.getpid())),
                  python=python, args=args)
        ooms = [line for line in (group / "memory.oom_control").read_text().splitlines() if line.startswith("oom_kill ")]
        peak = int((group / "memory.max_usage_in_bytes").read_text()) / 2**20
        return (f"{steps + 201} steps answered inside a {mb} MB memory cgroup (v1), cgroup peak {peak:.1f} MB, "
                f"{ooms[0] if ooms else 'oom_kill n/a'}; round trip p50 {got['rt_p50_us']:.0f} us")
    except Exception as e:   # noqa: BLE001 - a bench reports what happened
        return f"in a {mb} MB cgroup: {type(e).__name__}: {e}"
    finally:
        group.rmdir()


def _runners(a) -> dict:
    """{name: (python, args)} of ``--runner NAME=PYTHON[,ARG...]``, or one of ``--runner-python``."""
    if not a.runner:
        return {"runner": (a.runner_python, [])}
    got = {}
    for spec in a.runner:
        name, _, rest = spec.partition("=")
        python, *args = rest.split(",")
        if not name or not python or name == "serve":
            sys.exit(f"--runner {spec!r}: NAME=PYTHON[,ARG...] (a name other than serve)")
        got[name] = (python, args)
    return got


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--cgroup-mb", type=int, default=48)
    ap.add_argument("--md", default=None)
    ap.add_argument("--runner-python", default=sys.executable,
                    help="the runner's interpreter: a device's venv (pip install ./runner), default this one")
    ap.add_argument("--runner", action="append", default=[], metavar="NAME=PYTHON[,ARG...]",
                    help="a runner to measure (repeatable): its interpreter and extra `serve` arguments")
    ap.add_argument("--config", default=None, help="the learner's TOML for both (default: the default learner)")
    ap.add_argument("--period-us", type=float, default=0.0, help="pace the timed round trips (0: back to back)")
    a = ap.parse_args()
    runners = _runners(a)
    config = Path(a.config).read_text() if a.config else ""
    work = tempfile.mkdtemp(prefix="rs-", dir="/tmp")
    # exported by a child: this process stays small and without jax's threads, so starting
    # each side (fork + exec) costs what it costs a user's shell
    subprocess.run([sys.executable, "-m", "streamtrace", "export", "--out", str(Path(work) / "default"),
                    *(["--config", a.config] if a.config else [])], check=True, stdout=subprocess.DEVNULL)
    rows = {side: [] for side in [*runners, "serve"]}
    for _ in range(a.rounds):
        for side in rows:
            python, args = runners.get(side, (sys.executable, []))
            rows[side].append(one(side, Path(work) / "default", work, a.steps, python=python, args=args,
                                  config=config, period_us=a.period_us))
    med = lambda side, k: statistics.median(r[k] for r in rows[side])
    ratio = lambda side, k: statistics.median(r[k] / s[k] for r, s in zip(rows[side], rows["serve"]))
    paced = f"a request every {a.period_us:g} us" if a.period_us else "back to back"
    lines = [f"runner server vs serve, {a.config or 'default learner'}, one stream, {a.steps} round trips ({paced}) x "
             f"{a.rounds} rounds, {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs (shared)", "",
             "| | " + " | ".join(runners) + " | serve | " + " | ".join(f"{n} / serve" for n in runners) + " |",
             "|---" * (2 * len(runners) + 2) + "|"]
    for k, name in (("start_s", "start to first answer (s)"), ("rt_p50_us", "round trip p50 (us)"),
                    ("rt_p99_us", "round trip p99 (us)"), ("rss_mb", "peak RSS (MB)"),
                    ("anon_mb", "of it anonymous, at the end (MB)"), ("file_mb", "file-backed, at the end (MB)")):
        lines.append(f"| {name} | " + " | ".join(f"{med(n, k):.3g}" for n in runners) + f" | {med('serve', k):.3g} | "
                     + " | ".join(f"{ratio(n, k):.3f}" for n in runners) + " |")
    lines.append("")
    for n, (python, args) in runners.items():
        lines += [f"{n}: {python} {' '.join(args)}".rstrip(),
                  in_cgroup(Path(work) / "default", work, a.steps, a.cgroup_mb, python, args)]
    text = "\n".join(lines)
    print(text)
    if a.md:
        Path(a.md).write_text(text + "\n")


if __name__ == "__main__":
    main()
