"""The runner's documented install (``pip install ./runner`` in a fresh venv, docs/devices.md)
brings no jax, jaxlib or brainstate, and that venv serves an exported learner: the answer
``SensorClient`` gets from it equals the in-process runner's. Its size beside the full install
is printed (measured numbers: docs/devices.md); slow: it installs a venv (~10 s from pip's cache)."""
from __future__ import annotations

import signal
import subprocess
import sys
import venv
from pathlib import Path

import numpy as np
import pytest

from streamtrace.export.write import export_learner
from streamtrace_runner.runtime import Runner

ROOT = Path(__file__).resolve().parents[2]


def _size(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file() and not p.is_symlink())


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_the_runner_venv_has_no_jax_and_serves(tmp_path):
    env = tmp_path / "venv"
    venv.create(env, with_pip=True)
    py = str(env / "bin" / "python")
    subprocess.run([py, "-m", "pip", "install", "--quiet", str(ROOT / "runner")], check=True, timeout=300)
    listed = subprocess.run([py, "-m", "pip", "list", "--format=freeze"], capture_output=True, text=True,
                            check=True, timeout=60).stdout.lower()
    names = {line.split("==")[0] for line in listed.split()}
    assert "streamtrace-runner" in names and "iree-base-runtime" in names
    assert not {"jax", "jaxlib", "brainstate", "streamtrace"} & names
    folder = tmp_path / "default"
    export_learner(None, folder)
    want = Runner(folder).step(np.array([[0.5]]))[0].ravel()[0]
    sock = f"ipc://{tmp_path}/r"
    proc = subprocess.Popen([py, "-m", "streamtrace_runner", "serve", str(folder), "--router", sock, "--pull", "",
                             "--pub", ""], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().startswith("streamtrace runner:")
        from streamtrace.transport import SensorClient
        with SensorClient(sock, stream="s", timeout_s=30) as c:
            got = c.step(np.array([0.5])).pred.ravel()[0]
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=30)
    assert proc.returncode == 0 and got == want
    full = Path(sys.prefix)
    print(f"runner venv {_size(env) / 2**20:.0f} MiB, this venv {_size(full) / 2**20:.0f} MiB, "
          f"ratio {_size(env) / _size(full):.3f}")
