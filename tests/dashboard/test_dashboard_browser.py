"""The dashboard in a real browser (Debian's Chromium, headless, driven by selenium) against a
running engine with three streams: the charts advance, a refused message's code shows, a
screenshot is not blank, and the page lives through an engine restart and a dashboard restart.

STREAMTRACE_DASHBOARD_PNG=docs/dashboard.png also saves the screenshot there (the README's)."""
from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("starlette", reason="the dashboard extra (streamtrace[dashboard]) is not installed")
pytest.importorskip("selenium", reason="selenium (the test extra) is not installed")

from dashboard_helpers import Sensors, chrome, engine_config, free_port, restart, start_dashboard  # noqa: E402
from streamtrace.engine.launch import start_engine, stop  # noqa: E402

STREAMS = ("alpha", "beta", "gamma")


def wait_for(what, predicate, timeout: float = 60.0, every: float = 0.2):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        got = predicate()
        if got:
            return got
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")


def last_seqs(driver) -> dict:
    return driver.execute_script(
        "const o = {}; for (const el of document.querySelectorAll('.chart')) o[el.dataset.stream] ="
        " el.dataset.lastSeq === '' ? null : Number(el.dataset.lastSeq); return o;")


def advancing(driver, wait_s: float = 1.5) -> bool:
    before = last_seqs(driver)
    time.sleep(wait_s)
    after = last_seqs(driver)
    return set(after) == set(STREAMS) and all(before.get(n) is not None and after[n] > before[n] for n in STREAMS)


def status(driver) -> str:
    return driver.find_element("id", "status").text


def not_blank(png: Path) -> float:
    import matplotlib.image
    img = matplotlib.image.imread(png)[..., :3].astype(float)
    return float(img.std())


@pytest.mark.slow
def test_dashboard_in_chromium_follows_the_engine_through_restarts(tmp_path):
    sock_dir = Path(tempfile.mkdtemp(prefix="st-dash-", dir="/tmp"))
    config = engine_config(tmp_path, sock_dir)
    engine = start_engine(config)
    port = free_port()
    board, url = start_dashboard(f"ipc://{sock_dir}/pub", port)
    driver = None
    try:
        with Sensors(f"ipc://{sock_dir}/pull", STREAMS) as sensors:
            driver = chrome(tmp_path / "chromium-profile")
            driver.get(url)
            # the page picks the first three streams by itself; their charts fill and advance
            wait_for("three charts with points", lambda: all(v is not None for v in last_seqs(driver).values())
                     and set(last_seqs(driver)) == set(STREAMS))
            assert wait_for("the charts to advance", lambda: advancing(driver), timeout=30)
            assert status(driver).startswith("live")
            # the page redraws from a stream of updates (10 a second; the rate is measured, not asserted)
            n0, t0 = int(driver.execute_script("return document.body.dataset.updates")), time.monotonic()
            wait_for("page updates", lambda: int(driver.execute_script("return document.body.dataset.updates")) > n0 + 5)
            print(f"page updates: {(int(driver.execute_script('return document.body.dataset.updates')) - n0) / (time.monotonic() - t0):.1f}/s")
            # a refused message's code shows in the error panel
            sensors.bad()
            wait_for("bad_shape in the error panel", lambda: "bad_shape" in driver.find_element("id", "errors").text)
            assert "bad_shape" in driver.find_element("id", "recent").text
            shot = tmp_path / "dashboard.png"
            assert driver.save_screenshot(str(shot))
            assert not_blank(shot) > 0.05, "the screenshot is (nearly) one colour"
            if os.environ.get("STREAMTRACE_DASHBOARD_PNG"):
                shutil.copy(shot, os.environ["STREAMTRACE_DASHBOARD_PNG"])
            # the engine restarts: the feed reconnects by itself and the page says so
            engine = restart(engine, config)
            wait_for("the restart noticed", lambda: "restarted 1x" in status(driver))
            assert wait_for("the charts to advance after the restart", lambda: advancing(driver), timeout=30)
            # the dashboard itself restarts on the same port: the page's event stream reconnects
            stop(board)
            board.stdout.close()
            wait_for("the page to notice", lambda: status(driver) == "reconnecting", timeout=20)
            board, _ = start_dashboard(f"ipc://{sock_dir}/pub", port)
            wait_for("live again", lambda: status(driver).startswith("live"), timeout=30)
            assert wait_for("the charts to advance again", lambda: advancing(driver), timeout=30)
            logs = [e for e in driver.get_log("browser") if e["level"] == "SEVERE"
                    and "events" not in e["message"] and "api/streams" not in e["message"]]
            assert not logs, logs      # (refused connections while the server was away are expected)
    finally:
        if driver is not None:
            driver.quit()
        stop(board)
        stop(engine)
        shutil.rmtree(sock_dir, ignore_errors=True)
