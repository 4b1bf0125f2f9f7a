"""``streamtrace demo``: an engine and several synthetic sensor streams on loopback, live
progress, a summary table and a PNG plot."""
from __future__ import annotations

import math
import tempfile
import time
from pathlib import Path

from ..dashboard.command import demo_dashboard
from ..engine.launch import start_engine, stop, write_config
from .loss_fall import finite_mean, first_last, number_or_dash

__all__ = ["two_tone", "run_cli"]


def two_tone(kind: int, n: int):
    """Two sines and a little noise, different per ``kind``: the demo's sensor signals."""
    import numpy as np
    t = np.arange(n)
    rng = np.random.default_rng(kind)
    f1, f2 = 0.05 + 0.02 * kind, 0.013 + 0.004 * kind
    s = np.sin(f1 * t) + 0.5 * np.sin(f2 * t + kind) + 0.03 * rng.normal(size=n)
    return s.astype(np.float32)


def run_cli(args) -> int:
    """Exit status 0 when every stream ran without errors and its loss fell."""
    import threading

    import numpy as np

    from ..transport import SensorClient, Subscriber
    work = Path(tempfile.mkdtemp(prefix="streamtrace-demo-"))
    base = f"ipc://{work}/"
    given = lambda **kw: {k: v for k, v in kw.items() if v is not None}  # noqa: E731
    config = write_config(work / "engine.toml", {
        "model": given(stack=args.model, n_in=1, n_hidden=args.hidden, n_out=1),
        "learning": given(algorithm=args.algorithm, mode="forecast", lr=args.lr),
        "engine": {"slots": max(args.streams, 1)},
        "sockets": {"router": base + "router", "pull": base + "pull", "pub": base + "pub"},
        # predictions are published only for a dashboard to draw
        "publish": {"weights_every": 500, "stats_every_s": 1.0, "predictions": bool(args.dashboard)},
        "checkpoint": {"dir": str(work / "checkpoints"), "every": 2000},
    })
    what = "the default learner" if args.model is None else \
        f"{args.model.upper()}-{args.hidden or 32} ({args.algorithm or 'd-rtrl'})"
    print(f"streamtrace demo: engine with {what}, forecast, "
          f"{args.streams} synthetic sensor streams x {args.steps} steps over ZeroMQ ipc")
    engine = start_engine(config)
    board = demo_dashboard(base + "pub", args.dashboard) if args.dashboard else None
    series = [two_tone(i, args.steps + 1) for i in range(args.streams)]
    losses = [np.full(args.steps, np.nan) for _ in range(args.streams)]
    preds = [np.full(args.steps, np.nan) for _ in range(args.streams)]
    done = [0] * args.streams
    errors = []

    def sensor(i):
        try:
            with SensorClient(base + "router", stream=f"sensor-{i}") as c:
                for t in range(args.steps):
                    r = c.step(series[i][t:t + 1])
                    preds[i][t] = r.pred[0]
                    losses[i][t] = np.nan if r["loss"] is None else r["loss"]
                    done[i] = t + 1
        except Exception as e:  # shown in the summary, the demo still ends cleanly
            errors.append(f"sensor-{i}: {e}")

    stats = Subscriber(base + "pub", (b"stats",))
    threads = [threading.Thread(target=sensor, args=(i,), daemon=True) for i in range(args.streams)]
    t0 = time.perf_counter()
    for th in threads:
        th.start()
    try:
        while any(th.is_alive() for th in threads):
            got = stats.recv(timeout_s=1.0)
            if got:
                s = got[1]
                recent = finite_mean([finite_mean(l[max(1, d - 200):d]) for l, d in zip(losses, done) if d > 2])
                print(f"  {time.perf_counter() - t0:5.1f}s  steps {sum(done):7d}  {s['steps_per_s']:7.0f} steps/s  "
                      f"latency p50 {s['latency_us']['p50']:6.0f} us  p99 {s['latency_us']['p99']:6.0f} us  "
                      f"recent MSE {number_or_dash(recent, '.4f')}", flush=True)
    finally:
        for th in threads:
            th.join(timeout=5)
        stats.close()
        stop(engine)
        if board is not None:
            stop(board, 5)
    elapsed = time.perf_counter() - t0
    tenth = max(1, args.steps // 10)     # the first / last tenth of the run are compared
    ratios = _summary(series, losses, done, tenth)
    print(f"{sum(done)} steps in {elapsed:.1f}s ({sum(done) / elapsed:.0f} steps/s over {args.streams} streams)")
    for e in errors:
        print("error:", e)
    if args.plot:
        _plot(args.plot, series[0], preds[0], losses, tenth)
        print(f"plot: {args.plot}")
    return 0 if not errors and all(r > 1 for r in ratios) else 1     # NaN (no loss at all): not a fall


def _summary(series, losses, done, tenth) -> list:
    """The table of each stream's first and last tenth's MSE beside persistence's; the falls."""
    import numpy as np
    print(f"\n{'stream':10s} {'steps':>6s} {'first MSE':>10s} {'last MSE':>10s} {'fell':>6s} "
          f"{'persistence':>11s}")
    ratios = []
    for i, (s, loss) in enumerate(zip(series, losses)):
        first, last = first_last(loss[1:], tenth)       # the warm-up's steps have no loss: not counted
        fell = first / last if last > 0 else math.nan
        ratios.append(fell)
        naive = float(np.mean((s[1:] - s[:-1])[-tenth:] ** 2))   # "the next value equals the last"
        print(f"sensor-{i:<3d} {done[i]:6d} {number_or_dash(first, '10.4f')} {number_or_dash(last, '10.5f')} "
              f"{number_or_dash(fell, '5.1f')}x {naive:11.5f}")
    return ratios


def _plot(path, series, pred, losses, smooth):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np
    fig, (a, b) = plt.subplots(2, 1, figsize=(10, 6))
    n = len(pred)
    show = slice(max(0, n - 300), n)
    t = np.arange(n)
    a.plot(t[show], series[1:n + 1][show], label="signal (next sample)")
    a.plot(t[show], pred[show], "--", label="prediction")
    a.set_title("sensor-0: one-step-ahead prediction, last 300 steps")
    a.legend(loc="upper right")
    for i, l in enumerate(losses):
        k = np.ones(smooth) / smooth
        seen = l[np.isfinite(l)]
        if seen.size:                  # the warm-up (no loss yet) drawn at the first loss
            b.plot(np.convolve(np.nan_to_num(l, nan=seen[0]), k, mode="valid"), label=f"sensor-{i}")
    b.set_yscale("log")
    b.set_title("online loss (moving average)")
    b.set_xlabel("step")
    b.legend(loc="upper right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
