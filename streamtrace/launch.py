"""Starting and stopping an engine or the echo floor in a child process, and timing a sensor's
round trips against either: the process toolkit shared by the CLI, the replay, bench/ and the
end-to-end tests (none of which should reach into ``cli.py`` for it)."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

__all__ = ["write_config", "start_engine", "start_echo", "stop", "roundtrips", "paced"]


def _toml_value(v):
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return repr(v)


def write_config(path: Path, sections: dict) -> Path:
    """A serve TOML from ``{section: {key: value}}``."""
    lines = []
    for section, values in sections.items():
        lines.append(f"[{section}]")
        lines += [f"{k} = {_toml_value(v)}" for k, v in values.items()]
    path.write_text("\n".join(lines) + "\n")
    return path


def start_engine(config: Path, *, cpu: int | None = None, log=None) -> subprocess.Popen:
    """The engine in a child process; returns once it listens."""
    cmd = [sys.executable, "-m", "streamtrace", "serve", "--config", str(config)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log or subprocess.STDOUT, text=True,
                            preexec_fn=(lambda: os.sched_setaffinity(0, {cpu})) if cpu is not None else None)
    for line in proc.stdout:
        if line.startswith("streamtrace engine:"):
            return proc
        if log is None:
            sys.stderr.write("  engine: " + line)
    raise RuntimeError(f"the engine exited with code {proc.wait()} before listening")


def start_echo(endpoint: str, cpu: int | None = None) -> subprocess.Popen:
    """The bare ZeroMQ + msgpack echo server (the transport floor) in a child process;
    returns once it listens."""
    proc = subprocess.Popen([sys.executable, "-m", "streamtrace.echo", endpoint,
                             str(-1 if cpu is None else cpu)], stdout=subprocess.PIPE, text=True)
    proc.stdout.readline()
    return proc


def stop(proc: subprocess.Popen, timeout: float = 30.0):
    """SIGTERM, then SIGKILL if it has not exited within ``timeout`` seconds."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()


def paced(call, n: int, period_us: float = 0.0) -> np.ndarray:
    """``call()`` n times, each at its tick every ``period_us`` (the time until then slept), as
    a sensor sampling at 1e6 / period_us Hz sends; 0: each right after the last (back to
    back). Microseconds per call."""
    import numpy as np
    out = np.empty(n)
    clock = time.perf_counter
    nxt = clock()
    for i in range(n):
        if period_us:
            nxt += period_us * 1e-6
            wait = nxt - clock()
            if wait > 0:
                time.sleep(wait)
        t0 = clock()
        call()
        out[i] = clock() - t0
    return out * 1e6


def roundtrips(endpoint: str, n: int, cpu: int | None, warmup: int = 500, x=None, y=None, warm_s: float = 0.0,
               period_us: float = 0.0):
    """``n`` timed request/reply steps of one sensor (microseconds each), after ``warmup``
    untimed ones (and, with ``warm_s``, untimed steps for that many seconds first), back to
    back; with ``period_us`` the timed ones a request every that many microseconds, as a
    sensor sampling at that rate sends."""
    import numpy as np

    from .adapters import SensorClient
    if cpu is not None:
        os.sched_setaffinity(0, {cpu})
    x = np.zeros(1, np.float32) if x is None else x
    with SensorClient(endpoint, stream="bench", timeout_s=30) as c:
        warm_until = time.monotonic() + warm_s
        while warmup and time.monotonic() < warm_until:
            c.step(x, y)
        for _ in range(warmup):
            c.step(x, y)
        out = paced(lambda: c.step(x, y), n, period_us)
    if cpu is not None:
        os.sched_setaffinity(0, set(range(os.cpu_count())))
    return out
