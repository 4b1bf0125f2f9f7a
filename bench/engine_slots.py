"""One sensor against engines with 1 and with N slots (a model per stream, the default): what a
lone stream pays for the slots it does not use. Real `streamtrace serve` processes over ipc,
the bare ZeroMQ echo in the same run.

    .venv/bin/python bench/engine_slots.py [--hidden 64 256] [--slots 16] [--steps 2000]
"""
import argparse
import tempfile
from pathlib import Path

from streamtrace.engine.launch import start_engine, stop, write_config

from streamtrace.transport.echo import start_echo

from streamtrace.transport.timing import roundtrips
from timing import percentiles

WARM_S = 8.0    # the engine compiles its other programs 2 s into constant traffic


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--hidden", type=int, nargs="+", default=[64, 256])
    ap.add_argument("--slots", type=int, default=16)
    ap.add_argument("--algorithm", default="d-rtrl")
    ap.add_argument("--steps", type=int, default=2000)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="st-slots-", dir="/tmp"))
    echo = start_echo(f"ipc://{work}/echo")
    try:
        floor = roundtrips(f"ipc://{work}/echo", args.steps, None, warmup=1, warm_s=1.0)
    finally:
        stop(echo)
    p = percentiles(floor, 1.0)
    print(f"echo p50 {p['p50']:.0f} us, p99 {p['p99']:.0f} us")
    rows = ["| model | slots | p50 µs | p99 µs | p50 / 1-slot engine |", "|---|---:|---:|---:|---:|"]
    for h in args.hidden:
        base = None
        for slots in (1, args.slots):
            ep = f"ipc://{work}/e{h}-{slots}"
            cfg = write_config(work / f"e{h}-{slots}.toml", {
                "model": {"stack": "gru", "n_in": 1, "n_hidden": h, "n_out": 1},
                "learning": {"algorithm": args.algorithm, "mode": "forecast"}, "engine": {"slots": slots},
                "sockets": {"router": ep, "pull": "", "pub": ""},
                "publish": {"weights_every": 0, "stats_every_s": 3600.0, "predictions": False}})
            proc = start_engine(cfg)
            try:
                lat = roundtrips(ep, args.steps if h <= 64 else max(args.steps // 5, 200), None,
                                  warmup=1, warm_s=WARM_S)
            finally:
                stop(proc)
            p = percentiles(lat, 1.0)
            p50, p99 = p["p50"], p["p99"]
            base = base or p50
            rows.append(f"| GRU-{h} {args.algorithm} | {slots} | {p50:.0f} | {p99:.0f} | {p50 / base:.2f} |")
            print(rows[-1], flush=True)
    print("\n".join(rows))


if __name__ == "__main__":
    main()
