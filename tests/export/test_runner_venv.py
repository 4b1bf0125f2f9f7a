"""The runner's documented install (docs/devices.md: ``python3 -m venv --without-pip`` and ``pip
--python VENV/bin/python install ./runner``) brings no jax, jaxlib or brainstate, takes at most
1/10 of the full install's size on disk (issue 34; the full install: this test's own venv,
streamtrace with its extras), and that venv serves an exported learner: the answer
``SensorClient`` gets from it equals the in-process runner's. Where this environment's pip has
no ``--python`` (pip < 22.3), the venv is made with pip inside and ``pip install ./runner`` (the
other documented command; with pip and setuptools it is larger: no size limit asserted). Slow:
it installs a venv (~10 s from pip's cache)."""
from __future__ import annotations

import signal
import subprocess
import sys
import venv
from pathlib import Path

import numpy as np
import pytest
from importlib.metadata import version

from streamtrace.export.write import export_learner
from streamtrace_runner.runtime import Runner

ROOT = Path(__file__).resolve().parents[2]


def _size(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file() and not p.is_symlink())


def _pip_has_python_option() -> bool:
    """pip >= 22.3 installs into another interpreter's environment (``pip --python``)."""
    major, minor = (int(v) for v in version("pip").split(".")[:2])
    return (major, minor) >= (22, 3)


def _install(env: Path) -> bool:
    """The runner installed into a fresh venv at ``env``, the smallest documented way this
    environment allows; True if that is the venv without pip (``pip --python``)."""
    outside = _pip_has_python_option()
    venv.create(env, with_pip=not outside)
    py = str(env / "bin" / "python")
    pip = [sys.executable, "-m", "pip", "--python", py] if outside else [py, "-m", "pip"]
    subprocess.run([*pip, "install", "--quiet", str(ROOT / "runner")], check=True, timeout=300)
    return outside


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_the_runner_venv_has_no_jax_and_serves(tmp_path):
    env = tmp_path / "venv"
    without_pip = _install(env)
    py = str(env / "bin" / "python")
    listed = subprocess.run([py, "-I", "-c", "import importlib.metadata as m; print(*(d.metadata['Name'] for d in "
                             "m.distributions()))"], capture_output=True, text=True, check=True, timeout=60,
                            cwd=tmp_path).stdout       # (-I and cwd: no checkout's metadata on the path)
    names = {n.replace("_", "-") for n in listed.lower().split()}
    assert "streamtrace-runner" in names and "iree-base-runtime" in names
    assert ("pip" not in names) is without_pip
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
    ratio = _size(env) / _size(Path(sys.prefix))
    print(f"runner venv {_size(env) / 2**20:.0f} MiB ({'without' if without_pip else 'with'} pip), this venv "
          f"{_size(Path(sys.prefix)) / 2**20:.0f} MiB, ratio {ratio:.3f}")
    if without_pip:
        assert ratio <= 0.1
