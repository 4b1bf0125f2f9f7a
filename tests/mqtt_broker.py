"""A real MQTT broker for the MQTT bridge tests and its latency bench.

Debian's ``mosquitto`` (on PATH or in /usr/sbin), else ``amqtt`` from PyPI (``make test``
installs one of them; ``STREAMTRACE_TEST_BROKER=amqtt`` picks amqtt even where mosquitto is
installed). ``Broker`` starts it on a free loopback port with a small config file in a temporary
folder, can kill it and start it again on the same port (a broker restart), and stops it.
"""
from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

MOSQUITTO_PLACES = ("/usr/sbin/mosquitto", "/usr/local/sbin/mosquitto", "/opt/homebrew/sbin/mosquitto")


class BrokerMissing(RuntimeError):
    pass


def find_broker() -> tuple[str, str]:
    """``(kind, executable)``: mosquitto first, then amqtt; ``BrokerMissing`` when neither."""
    want = os.environ.get("STREAMTRACE_TEST_BROKER", "")
    mosquitto = shutil.which("mosquitto") or next((p for p in MOSQUITTO_PLACES if os.access(p, os.X_OK)), None)
    venv_amqtt = Path(sys.executable).parent / "amqtt"
    amqtt = str(venv_amqtt) if os.access(venv_amqtt, os.X_OK) else shutil.which("amqtt")
    if want not in ("", "mosquitto", "amqtt"):
        raise BrokerMissing(f"STREAMTRACE_TEST_BROKER={want!r}: choose mosquitto or amqtt")
    if mosquitto and want != "amqtt":
        return "mosquitto", mosquitto
    if amqtt and want != "mosquitto":
        return "amqtt", amqtt
    raise BrokerMissing(
        "no MQTT broker for the MQTT bridge tests: install Debian's mosquitto (apt-get install mosquitto; "
        "`make test` does this when it runs as root) or amqtt (pip install amqtt)"
        + (f" [STREAMTRACE_TEST_BROKER={want}]" if want else ""))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Broker:
    def __init__(self, port: int | None = None):
        self.kind, self.exe = find_broker()
        self.port = port or free_port()
        self.folder = Path(tempfile.mkdtemp(prefix="st-mqtt-"))
        self.proc: subprocess.Popen | None = None
        self.starts = 0

    def _config(self) -> list[str]:
        if self.kind == "mosquitto":
            conf = self.folder / "mosquitto.conf"
            conf.write_text(f"listener {self.port} 127.0.0.1\nallow_anonymous true\npersistence false\n"
                            "log_dest stderr\nlog_type error\nlog_type warning\n")
            return [self.exe, "-c", str(conf)]
        conf = self.folder / "amqtt.yaml"
        conf.write_text(f"listeners:\n  default:\n    type: tcp\n    bind: 127.0.0.1:{self.port}\n"
                        "plugins:\n  amqtt.plugins.authentication.AnonymousAuthPlugin:\n    allow_anonymous: true\n")
        return [self.exe, "-c", str(conf)]

    def start(self, timeout: float = 15.0) -> Broker:
        self.starts += 1
        log = open(self.folder / f"broker-{self.starts}.log", "wb")
        self.proc = subprocess.Popen(self._config(), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        log.close()
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.kind} exited with {self.proc.returncode}: {self.log_text()}")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.5).close()
                return self
            except OSError:
                time.sleep(0.05)
        self.kill()
        raise RuntimeError(f"{self.kind} did not listen on 127.0.0.1:{self.port} within {timeout} s: "
                           f"{self.log_text()}")

    def log_text(self) -> str:
        return " | ".join((self.folder / f"broker-{self.starts}.log").read_text(errors="replace").splitlines()[-5:])

    def kill(self):
        """The broker dies at once (SIGKILL), as in a crash or a power cut."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def stop(self):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()
        shutil.rmtree(self.folder, ignore_errors=True)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()
