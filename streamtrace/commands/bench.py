"""``streamtrace bench``: end-to-end round trips through an engine process against a bare
ZeroMQ + msgpack echo (the transport floor), and with ``--config FILE`` the user's own model,
timed as ``serve`` would build it.

For each algorithm (d-rtrl, es-d-rtrl) and slot count (1 and the config's ``engine.slots``):
the time to build and to compile the step, the step latency (median, p99) of the compiled
step as the engine calls it, and the eligibility-trace memory per slot. The jax dispatch
floor (a trivial compiled call, numpy in and out) is timed in the same run, so a step can be
read against what any jax program costs on this machine. ``e2e=True`` adds the end-to-end
round trip through a real engine process against a bare ZeroMQ + msgpack echo.
"""
from __future__ import annotations

import copy
import math
import sys
import tempfile
import time
import tomllib
from pathlib import Path

import numpy as np

from ..engine.config import EngineConfig
from ..engine.launch import start_engine, stop, write_config
from ..transport.echo import start_echo
from ..transport.timing import roundtrips

__all__ = ["bench_config", "dispatch_floor", "trace_bytes_per_slot", "format_table", "e2e_roundtrip", "run_cli",
           "percentiles", "timed"]

ALGORITHMS = ("d-rtrl", "es-d-rtrl")
E2E_WARM_S = 6.0


def percentiles(samples, scale: float = 1e6) -> dict:
    """Median (p50), p99 and count of ``samples * scale`` (default: seconds in, microseconds out)."""
    a = np.asarray(samples, np.float64) * scale
    return {"p50": float(np.median(a)), "p99": float(np.percentile(a, 99)), "n": int(a.size)}


def timed(call, iters: int, warmup: int = 0, max_seconds: float = math.inf):
    """Per-call wall times of ``call`` in seconds (it must block until its result is ready),
    after ``warmup`` untimed calls; past ``max_seconds`` (and 20 samples) it stops early."""
    for _ in range(warmup):
        call()
    out, clock = [], time.perf_counter
    stop_at = clock() + max_seconds
    for i in range(iters):
        t0 = clock()
        call()
        out.append(clock() - t0)
        if i >= 20 and clock() > stop_at:   # a slow model: fewer samples, not a stalled bench
            break
    return out


def dispatch_floor(iters: int = 2000, warmup: int = 200, max_seconds: float = 5.0) -> dict:
    """The cost of calling a trivial AOT-compiled jax program with numpy in and out."""
    import jax
    x = np.zeros(1, np.float32)
    fn = jax.jit(lambda v: v + 1).lower(x).compile()
    return percentiles(timed(lambda: np.asarray(fn(x)), iters, warmup, max_seconds))


def trace_bytes_per_slot(learner) -> int:
    """Bytes of the eligibility traces one slot carries (from the packed state layout)."""
    total = sum(math.prod(shape) * np.dtype(dtype).itemsize
                for name, shape, dtype in learner.layout.entries() if name.startswith("traces."))
    return total // learner.n


def _variant(cfg: EngineConfig, algorithm: str) -> EngineConfig:
    c = copy.deepcopy(cfg)
    if c.learning.algorithm != algorithm:
        c.learning.algorithm = algorithm
        if algorithm != "es-d-rtrl":        # a trace decay only exists for es-d-rtrl
            c.learning.decay = c.learning.rank = 0.0
    return c.validate()


def _stepper(learner, *inputs, run="run"):
    """A call of ``learner.programs.<run>`` on ``inputs`` that keeps the buffers it returns
    (starting from the learner's; the learner's own are left to it)."""
    program, state = getattr(learner.programs, run), [learner.buffers]

    def call():
        state[0], vec = program(state[0], *inputs)
        return vec
    return call


def _one(cfg: EngineConfig, slots: int, iters: int, warmup: int, max_seconds: float) -> dict:
    from ..recipe.build import build_learner
    from ..engine.core import subset_sizes
    t0 = time.perf_counter()
    learner = build_learner(cfg, slots=slots, shared_weights=cfg.engine.shared_weights)
    t1 = time.perf_counter()
    learner.programs.step()
    t2 = time.perf_counter()
    rng = np.random.default_rng(0)
    x = (0.1 * rng.standard_normal((learner.n,) + learner.x_shape)).astype(learner.x_dtype)
    y = (0.1 * rng.standard_normal((learner.n,) + learner.out_shape)).astype(learner.y_dtype)
    on = np.ones(learner.n, bool)
    times = timed(_stepper(learner, x, y, on, on), iters, warmup, max_seconds)
    row = {"algorithm": cfg.learning.algorithm, "slots": slots, "build_s": t1 - t0, "compile_s": t2 - t1,
           "step_us": percentiles(times), "trace_bytes_per_slot": trace_bytes_per_slot(learner)}
    sizes = subset_sizes(slots)
    if sizes and not cfg.engine.shared_weights:    # one busy stream of many: a model per stream
        one = build_learner(cfg, slots=1, shared_weights=False)  # steps alone (learner/bank.py)
        one.programs.step()
        x1, y1, on1 = x[:1], y[:1], on[:1]
        row["one_busy_us"] = percentiles(timed(_stepper(one, x1, y1, on1, on1), iters, warmup, max_seconds))
    elif sizes:   # shared weights: the engine's smallest subset call, the others idle
        k, m = cfg.engine.micro_batch, sizes[0]
        xs, ys = np.repeat(x[None, :m], k, 0), np.repeat(y[None, :m], k, 0)
        act, idx = np.zeros((k, m), bool), np.arange(m, dtype=np.int32)
        act[:, 0] = True
        row["one_busy_us"] = percentiles(timed(_stepper(learner, idx, 1, xs, ys, act, act, run="run_subset"),
                                                 iters, warmup, max_seconds))
    return row


def bench_config(cfg: EngineConfig, *, algorithms=ALGORITHMS, iters: int = 1000, warmup: int = 100,
                 max_seconds: float = 10.0, e2e: bool = False, e2e_steps: int = 5000,
                 config_path: str | None = None, period_us: float = 0.0) -> dict:
    """Every measurement in one run; a dict ready for ``json.dumps`` (times in us / s)."""
    warmup = min(warmup, iters)
    m = cfg.model
    result = {"config": config_path, "model": m.factory or m.stack, "n_in": m.n_in, "n_hidden": m.n_hidden,
              "n_out": m.n_out, "precision": m.precision, "mode": cfg.learning.mode,
              "shared_weights": cfg.engine.shared_weights, "dispatch_floor_us": dispatch_floor(), "runs": []}
    for algorithm in algorithms:
        for slots in sorted({1, cfg.engine.slots}):
            try:
                row = _one(_variant(cfg, algorithm), slots, iters, warmup, max_seconds)
            except Exception as e:  # noqa: BLE001 - a model one algorithm cannot trace: say so, go on
                row = {"algorithm": algorithm, "slots": slots, "error": f"{type(e).__name__}: {e}"}
            result["runs"].append(row)
    result["e2e"] = e2e_roundtrip(cfg, config_path, e2e_steps, period_us) if e2e else None
    return result


def e2e_roundtrip(cfg: EngineConfig, config_path: str | None, steps: int, period_us: float = 0.0) -> dict:
    """One sensor's round trips over ipc: the engine serving this config, then the echo floor;
    ``period_us``: a request every that many microseconds (0: back to back)."""
    work = Path(tempfile.mkdtemp(prefix="st-bench-", dir="/tmp"))
    sections = tomllib.loads(Path(config_path).read_text()) if config_path else {}
    sections.update(sockets={"router": f"ipc://{work}/engine", "pull": "", "pub": ""},
                    publish={"weights_every": 0, "stats_every_s": 3600.0, "predictions": False},
                    checkpoint={"dir": ""})
    supervised = cfg.learning.mode == "supervised"
    x = np.zeros(cfg.model.n_in, np.float64 if cfg.model.precision == 64 else np.float32)
    y = np.zeros(cfg.model.n_out, x.dtype) if supervised else None
    out = {"transport": "ipc", "steps": steps, "period_us": period_us}
    for server in ("echo", "engine"):
        ep = f"ipc://{work}/{server}"
        proc = start_echo(ep) if server == "echo" else start_engine(write_config(work / "engine.toml", sections))
        try:
            # warm-up for seconds too: the engine compiles its other programs (busy-slot
            # subsets, micro-batch sizes) 2 s into constant traffic, stalling a few round trips
            lat = roundtrips(ep, steps, None, warmup=min(500, steps), x=x, y=y,
                              warm_s=0.0 if server == "echo" else E2E_WARM_S, period_us=period_us)
        finally:
            stop(proc)
        p = percentiles(lat, 1.0)
        out[server] = {"p50": p["p50"], "p99": p["p99"]}
    out["p50_ratio"] = out["engine"]["p50"] / out["echo"]["p50"]
    out["p99_ratio"] = out["engine"]["p99"] / out["echo"]["p99"]
    return out


def _kib(n: int) -> str:
    return f"{n / 1024:.1f} KiB" if n < 1 << 20 else f"{n / (1 << 20):.2f} MiB"


def _pace(period_us: float) -> str:
    return f", a request every {period_us:g} us" if period_us else ", back to back"


def format_table(r: dict) -> str:
    f = r["dispatch_floor_us"]
    lines = [f"model {r['model']} {r['n_in']}->{r['n_hidden']}->{r['n_out']} (float{r['precision']}, {r['mode']}, "
             f"{'shared' if r['shared_weights'] else 'per-stream'} weights); jax dispatch floor "
             f"p50 {f['p50']:.1f} us, p99 {f['p99']:.1f} us", "",
             "| algorithm | slots | compile s | step p50 us | step p99 us | x floor | 1 busy slot p50 us | traces per slot |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for row in r["runs"]:
        if "error" in row:
            lines.append(f"| {row['algorithm']} | {row['slots']} | - | - | - | - | - | {row['error']} |")
            continue
        s = row["step_us"]
        one = f"{row['one_busy_us']['p50']:.1f}" if "one_busy_us" in row else "-"
        lines.append(f"| {row['algorithm']} | {row['slots']} | {row['compile_s']:.2f} | {s['p50']:.1f} | "
                     f"{s['p99']:.1f} | {s['p50'] / f['p50']:.1f} | {one} | {_kib(row['trace_bytes_per_slot'])} |")
    e = r.get("e2e")
    if e:
        lines += ["", f"end to end ({e['transport']}, one sensor, {e['steps']} round trips{_pace(e['period_us'])}): engine p50 "
                  f"{e['engine']['p50']:.0f} us, p99 {e['engine']['p99']:.0f} us; echo p50 {e['echo']['p50']:.0f} us, "
                  f"p99 {e['echo']['p99']:.0f} us; ratio p50 {e['p50_ratio']:.2f}x, p99 {e['p99_ratio']:.2f}x"]
    return "\n".join(lines)


# ---- the command ----------------------------------------------------------------------------
def _run_config(args) -> int:
    import json

    from ..engine import ConfigError, load_config
    if args.iters < 1 or args.steps < 1:
        print(f"bench: --iters and --steps must be >= 1; got {args.iters}, {args.steps}", file=sys.stderr)
        return 2
    try:
        cfg = load_config(args.config)
        if cfg.engine.sync_dispatch:      # the step as serve runs it: on the calling thread
            from ..learner.dispatch import inline_dispatch
            inline_dispatch()
        result = bench_config(cfg, iters=args.iters, e2e=args.e2e, e2e_steps=args.steps, config_path=args.config,
                              period_us=args.period_us)
    except ConfigError as e:
        print("config error: " + " ".join(str(e).split()), file=sys.stderr)
        return 2
    print(json.dumps(result, indent=1) if args.json else format_table(result), flush=True)
    return 1 if any("error" in r for r in result["runs"]) else 0


def _period_ok(args) -> bool:
    """--period-us: 0 (back to back) up to 1 s; else a message naming it and False."""
    if not 0 <= args.period_us <= 1_000_000:
        print(f"bench: --period-us must be between 0 (back to back) and 1000000 (1 Hz); got {args.period_us:g}",
              file=sys.stderr)
        return False
    return True


def run_cli(args) -> int:
    """The echo-vs-engine table, or with ``--config`` the user's model timed (``bench_config``)."""
    if not _period_ok(args):
        return 2
    if args.config:
        return _run_config(args)
    work = Path(tempfile.mkdtemp(prefix="streamtrace-bench-"))
    rows = []
    print(f"end-to-end round trips: GRU-{args.hidden} engine vs bare ZeroMQ+msgpack echo, "
          f"{args.steps} steps each (after 500 warm-up){_pace(args.period_us)}, one sensor")
    for transport in args.transports:
        for pinned in (False, True):
            cpu = 0 if pinned else None
            for server in ("echo", "engine"):
                ep = (f"ipc://{work}/{server}-{int(pinned)}" if transport == "ipc"
                      else f"tcp://127.0.0.1:{args.port + len(rows)}")
                if server == "echo":
                    proc = start_echo(ep, cpu)
                else:
                    cfg = write_config(work / f"engine-{transport}-{int(pinned)}.toml", {
                        "model": {"stack": "gru", "n_in": 1, "n_hidden": args.hidden, "n_out": 1},
                        "learning": {"algorithm": args.algorithm, "mode": "forecast"},
                        "engine": {"slots": 1, "cpu": cpu if pinned else -1},
                        "sockets": {"router": ep, "pull": "", "pub": ""},
                        "publish": {"weights_every": 0, "stats_every_s": 3600.0, "predictions": False}})
                    proc = start_engine(cfg)
                try:
                    lat = roundtrips(ep, args.steps, cpu, period_us=args.period_us)
                finally:
                    stop(proc)
                p = percentiles(lat, 1.0)
                row = {"server": server, "transport": transport, "pinned": pinned, "p50": p["p50"], "p99": p["p99"]}
                rows.append(row)
                print(f"  {server:6s} {transport} {'pinned to CPU 0' if pinned else 'unpinned':15s} "
                      f"p50 {row['p50']:7.1f} us  p99 {row['p99']:7.1f} us", flush=True)
    lines = ["| transport | CPUs | echo p50 µs | echo p99 µs | engine p50 µs | engine p99 µs | p50 ratio | p99 ratio |",
             "|---|---|---:|---:|---:|---:|---:|---:|"]
    for transport in args.transports:
        for pinned in (False, True):
            e = next(r for r in rows if r["server"] == "echo" and r["transport"] == transport and r["pinned"] == pinned)
            g = next(r for r in rows if r["server"] == "engine" and r["transport"] == transport and r["pinned"] == pinned)
            lines.append(f"| {transport} | {'both on CPU 0' if pinned else 'unpinned'} | {e['p50']:.0f} | "
                         f"{e['p99']:.0f} | {g['p50']:.0f} | {g['p99']:.0f} | {g['p50'] / e['p50']:.2f} | "
                         f"{g['p99'] / e['p99']:.2f} |")
    print("\n" + "\n".join(lines))
    if args.out:
        Path(args.out).write_text("\n".join(lines) + "\n")
    return 0
