"""Benchmark session setup and the results table (median, p99, ratios to the dispatch floor,
all from one run). Options: --pin-cpu N pins this process to CPU N; --async-dispatch keeps
jax's asynchronous CPU dispatch (off by default: every step is awaited anyway)."""
import json
from pathlib import Path

import pytest
from timing import machine_line, percentiles, pin, timed

RESULTS: list[dict] = []


def pytest_addoption(parser):
    parser.addoption("--pin-cpu", type=int, default=None, help="pin the benchmark process to this CPU")
    parser.addoption("--async-dispatch", action="store_true", help="keep jax's async CPU dispatch")
    parser.addoption("--results", default=str(Path(__file__).parent / "results"),
                     help="folder for results.json / results.md")


def pytest_configure(config):
    import jax
    pin(config.getoption("--pin-cpu"))
    if not config.getoption("--async-dispatch"):
        jax.config.update("jax_cpu_enable_async_dispatch", False)


def machine(config) -> str:
    cpu = config.getoption("--pin-cpu")
    return machine_line(f"pinned to CPU {cpu}" if cpu is not None else "unpinned",
                        f"{'async' if config.getoption('--async-dispatch') else 'sync'} dispatch")


@pytest.fixture
def record(benchmark, request):
    """Run ``fn`` under pytest-benchmark, one call per round, and keep median/p99."""
    def run(group: str, name: str, fn, *, budget_s: float = 1.5, min_rounds: int = 50, **info):
        per = sum(timed(fn, 20, warmup=20)) / 20
        rounds = int(max(min_rounds, min(5000, budget_s / max(per, 1e-7))))
        benchmark.group = group
        benchmark.extra_info.update(info)
        benchmark.pedantic(fn, rounds=rounds, iterations=1, warmup_rounds=10)
        p = percentiles(benchmark.stats.stats.data, 1e6 / info.get("per_call", 1))   # us per step
        RESULTS.append({"group": group, "name": name, "median_us": p["p50"], "p99_us": p["p99"], "rounds": p["n"],
                        **info})
    return run


def pytest_sessionfinish(session, exitstatus):
    if not RESULTS:
        return
    config = session.config
    floor = next((r for r in RESULTS if r["name"] == "jax dispatch floor"), None)
    out = Path(config.getoption("--results"))
    out.mkdir(parents=True, exist_ok=True)
    lines = [f"Machine: {machine(config)}", "",
             "| benchmark | median µs | p99 µs | × floor (median) | × reference (median) | × limit (median) "
             "| × fused-Adam limit |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    key_of = lambda r: (r.get("model"), r.get("algorithm"), r.get("slots"), r.get("per_call", 1))
    ref = {key_of(r): r for r in RESULTS if r["group"] == "reference"}
    # the yardstick: the limit program with optax's Adam (the learner's default st.adam has its
    # arithmetic); beside it the limit with a hand-fused Adam, for the learner's rows
    limit = {key_of(r): r for r in RESULTS if r["group"] == "limit" and r.get("adam") == "optax"}
    fused = {key_of(r): r for r in RESULTS if r["group"] == "limit" and r.get("adam") == "fused"}
    for r in RESULTS:
        f = f"{r['median_us'] / floor['median_us']:.1f}" if floor else "-"
        key = key_of(r)
        rr = ref.get(key) if r["group"] != "reference" else None
        x_ref = f"{r['median_us'] / rr['median_us']:.2f}" if rr else "-"
        lr = limit.get(key) if r is not limit.get(key) else None
        x_lim = f"{r['median_us'] / lr['median_us']:.2f}" if lr else (
            "no limit" if r["group"] == "streamtrace" and not any(k[0] == key[0] for k in limit) else "-")
        fl = fused.get(key) if r["group"] == "streamtrace" else None
        x_fused = f"{r['median_us'] / fl['median_us']:.2f}" if fl else "-"
        lines.append(f"| {r['name']} | {r['median_us']:.1f} | {r['p99_us']:.1f} | {f} | {x_ref} | {x_lim} "
                     f"| {x_fused} |")
    if limit:
        lines += ["", "× limit: median / the limit program's median (bench/limits.py: the same GRU math "
                  "written by hand as one jax function with optax.adam; a fused-Adam row shows its ratio to it). "
                  "The streamtrace rows run the learner's default optimizer, st.adam (optax.adam up to rounding, "
                  "one division per value, applied in place); × fused-Adam limit: their ratio to the limit with a hand-fused Adam. "
                  "LIF/ALIF stacks have no limit program."]
    text = "\n".join(lines)
    (out / "results.md").write_text(text + "\n")
    (out / "results.json").write_text(json.dumps({"machine": machine(config), "results": RESULTS}, indent=1))
    tr = config.pluginmanager.get_plugin("terminalreporter")
    if tr is not None:
        tr.write_line("")
        for line in lines:
            tr.write_line(line)
