"""Keeping child processes running: what ``streamtrace cluster up`` does with its brokers and workers.

Each member is a name and a way to start it (a function returning a ``subprocess.Popen``). A
member that exits while the supervisor is not stopping is logged with its exit status and
started again after a backoff (``backoff_s`` doubled per recent restart, at most ``max_backoff_s``);
the others keep running. A member that had to be restarted more than ``max_restarts`` times
within ``window_s`` cannot be kept: the supervisor then gives up (``run`` returns 1) and the
caller stops the rest. Stopping: SIGTERM to the members of the highest tier at once, waited
for, then the next tier (workers, tier 1, before the brokers they hand their partitions over
through, tier 0), SIGKILL after a grace.
"""
from __future__ import annotations

import logging
import signal
import subprocess
import time
from dataclasses import dataclass, field
from typing import Callable

__all__ = ["Supervisor", "describe_exit"]

log = logging.getLogger("streamtrace.cluster")


def describe_exit(code: int) -> str:
    """``Popen.returncode`` in words: 'code 3' or 'signal SIGKILL'."""
    if code < 0:
        try:
            return f"signal {signal.Signals(-code).name}"
        except ValueError:
            return f"signal {-code}"
    return f"code {code}"


@dataclass
class _Member:
    name: str
    launch: Callable[[], subprocess.Popen]
    tier: int = 0
    proc: subprocess.Popen | None = None
    restarts: list = field(default_factory=list)     # monotonic times of recent restarts
    due: float | None = None                          # when a pending restart is due


class Supervisor:
    """Start members, restart the ones that die, give up past a limit.

    Parameters: ``max_restarts`` restarts of one member within ``window_s`` seconds are allowed
    (one more and :meth:`run` returns 1); ``backoff_s`` is the first restart's delay, doubled
    for each restart within the window up to ``max_backoff_s``; ``poll_s`` how often members are looked at.

    Example::

        >>> import sys, subprocess
        >>> sup = Supervisor(max_restarts=1, window_s=60, backoff_s=0.0, poll_s=0.01)
        >>> sup.add("quick", lambda: subprocess.Popen([sys.executable, "-c", "pass"]))
        >>> sup.run()           # exits, restarted once, exits again: cannot be kept
        1
        >>> sup.counts["restarts"], sup.gave_up
        (1, 'quick')
    """

    def __init__(self, *, max_restarts: int = 5, window_s: float = 60.0, backoff_s: float = 1.0,
                 max_backoff_s: float = 30.0, poll_s: float = 0.2, clock=time.monotonic):
        self.max_restarts, self.window_s = max_restarts, window_s
        self.backoff_s, self.max_backoff_s, self.poll_s, self.clock = backoff_s, max_backoff_s, poll_s, clock
        self.members: list[_Member] = []
        self.counts = {"exits": 0, "restarts": 0}
        self.gave_up: str | None = None       # the member that could not be kept
        self.stopping = False

    def add(self, name: str, launch: Callable[[], subprocess.Popen], proc: subprocess.Popen | None = None,
            tier: int = 0):
        """A member; started now unless ``proc`` (already running) is given. Higher tiers stop first."""
        self.members.append(_Member(name, launch, tier, proc if proc is not None else launch()))

    def pids(self) -> dict:
        """{name: pid} of the members running now."""
        return {m.name: m.proc.pid for m in self.members if m.proc is not None and m.proc.poll() is None}

    def request_stop(self, *_):
        """Make :meth:`run` return 0 at its next look (safe from a signal handler)."""
        self.stopping = True

    def check(self) -> bool:
        """Look at every member once: log and schedule the restart of one that exited, start
        those whose backoff is over. False once one cannot be kept."""
        now = self.clock()
        for m in self.members:
            if m.proc is not None and m.proc.poll() is not None:
                self._exited(m, now)
                if self.gave_up:
                    return False
            if m.proc is None and m.due is not None and now >= m.due:
                m.due, m.proc = None, m.launch()
                self.counts["restarts"] += 1
                log.warning("%s restarted (pid %d)", m.name, m.proc.pid)
        return True

    def _exited(self, m: _Member, now: float):
        code, m.proc = m.proc.returncode, None
        self.counts["exits"] += 1
        m.restarts = [t for t in m.restarts if now - t < self.window_s]
        if len(m.restarts) >= self.max_restarts:
            self.gave_up = m.name
            log.error("%s exited with %s; restarted %d times within %.0f s already: cannot keep it, stopping the "
                      "cluster", m.name, describe_exit(code), len(m.restarts), self.window_s)
            return
        delay = min(self.backoff_s * 2 ** len(m.restarts), self.max_backoff_s)
        m.restarts.append(now)
        m.due = now + delay
        log.warning("%s exited with %s; restarting it in %.1f s (restart %d of at most %d within %.0f s)",
                    m.name, describe_exit(code), delay, len(m.restarts), self.max_restarts, self.window_s)

    def run(self) -> int:
        """Keep the members until :meth:`request_stop` (0) or until one cannot be kept (1)."""
        while not self.stopping:
            if not self.check():
                return 1
            time.sleep(self.poll_s)
        return 0

    def stop(self, grace_s: float = 30.0) -> dict:
        """SIGTERM every member, a tier at a time from the highest, each tier waited for up to
        ``grace_s`` (then SIGKILL): {name: exit code}."""
        self.stopping = True
        codes = {}
        for tier in sorted({m.tier for m in self.members}, reverse=True):
            group = [m for m in self.members if m.tier == tier and m.proc is not None]
            for m in group:
                m.due = None
                if m.proc.poll() is None:
                    m.proc.terminate()
            deadline = time.monotonic() + grace_s
            for m in group:
                try:
                    codes[m.name] = m.proc.wait(max(deadline - time.monotonic(), 0.01))
                except subprocess.TimeoutExpired:
                    m.proc.kill()
                    codes[m.name] = m.proc.wait(10)
        return codes
