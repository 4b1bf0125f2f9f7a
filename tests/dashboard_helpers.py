"""Helpers for the dashboard tests: a forecast engine with three pushing sensors, the dashboard
in a child process, and Debian's Chromium driven by selenium (never a downloaded browser)."""
from __future__ import annotations

import shutil
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import zmq

from streamtrace import wire
from streamtrace.engine.launch import start_engine, stop, write_config
from configs import ipc_sockets  # noqa: E402

CHROMIUM = ("/usr/bin/chromium", "/usr/bin/chromium-browser")
CHROMEDRIVER = ("/usr/bin/chromedriver", "/usr/lib/chromium/chromedriver")


def find(candidates, name: str) -> str | None:
    return next((p for p in candidates if Path(p).exists()), None) or shutil.which(name)


def engine_config(folder: Path, sock_dir: Path) -> Path:
    return write_config(folder / "engine.toml", {
        "model": {"stack": "gru", "n_in": 1, "n_hidden": 8, "n_out": 1},
        "learning": {"mode": "forecast", "lr": 3e-3},
        "engine": {"slots": 4, "on_gap": "accept"},   # what a restart loses in flight is skipped
        "sockets": ipc_sockets(sock_dir, pull=True, pub=True),
        "publish": {"stats_every_s": 0.25, "weights_every": 200},
    })


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_dashboard(pub: str, port: int, *extra: str) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen([sys.executable, "-m", "streamtrace", "dashboard", "--pub", pub,
                             "--listen", f"127.0.0.1:{port}", *extra], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    for line in proc.stdout:
        if line.startswith("streamtrace dashboard:"):
            return proc, line.split()[2]
    raise RuntimeError(f"the dashboard exited with code {proc.wait()} before listening")


class Sensors:
    """Three streams pushed (fire and forget) at about ``hz`` steps per second each, seq
    counting on across engine restarts; ``bad`` sends one message the engine must refuse."""

    def __init__(self, endpoint: str, streams=("alpha", "beta", "gamma"), hz: float = 100.0):
        self.sock = zmq.Context.instance().socket(zmq.PUSH)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.SNDHWM, 1000)
        self.sock.connect(endpoint)
        self.streams, self.period = streams, 1.0 / hz
        self.lock, self.seq = threading.Lock(), 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join(5)
        self.sock.close(0)

    def _send(self, raw: bytes):
        try:
            self.sock.send(raw, zmq.NOBLOCK)
        except zmq.Again:      # the engine is down and the queue is full: a sensor drops too
            pass

    def _run(self):
        while not self._stop.is_set():
            with self.lock:
                t = self.seq
                for k, name in enumerate(self.streams):
                    x = np.sin(0.07 * t + k) + 0.5 * np.sin(0.013 * t * (k + 1))
                    self._send(wire.data_message(name, t, np.float32([x])))
                self.seq += 1
            time.sleep(self.period)

    def bad(self):
        with self.lock:
            self._send(wire.data_message(self.streams[0], self.seq, np.float32([1.0, 2.0])))   # bad_shape


def chrome(user_data_dir: Path, width: int = 1400, height: int = 1000):
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    binary, driver = find(CHROMIUM, "chromium"), find(CHROMEDRIVER, "chromedriver")
    if binary is None or driver is None:
        raise RuntimeError("Debian's chromium and chromium-driver are needed for the dashboard's browser test "
                           "(`make test` installs them: apt-get install chromium chromium-driver)")
    opts = webdriver.ChromeOptions()
    opts.binary_location = binary
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--disable-background-networking", "--disable-component-update", "--disable-sync",
                "--no-first-run", f"--user-data-dir={user_data_dir}", f"--window-size={width},{height}"):
        opts.add_argument(arg)
    return webdriver.Chrome(options=opts, service=Service(executable_path=driver))


def restart(proc, config: Path):
    stop(proc)
    if proc.stdout is not None:
        proc.stdout.close()
    return start_engine(config)
