r"""Starting and stopping an engine in a child process: the toolkit shared by the commands, the
replay, bench/ and the end-to-end tests. (The echo server and round-trip timing are
``streamtrace.transport``'s.)

>>> import pathlib, tempfile
>>> path = write_config(pathlib.Path(tempfile.mkdtemp()) / "engine.toml", {"engine": {"slots": 2}})
>>> path.read_text()
'[engine]\nslots = 2\n'
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

__all__ = ["write_config", "start_engine", "stop"]


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


def stop(proc: subprocess.Popen, timeout: float = 30.0):
    """SIGTERM, then SIGKILL if it has not exited within ``timeout`` seconds."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
