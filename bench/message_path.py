"""One data message's path through the engine: ``python bench/message_path.py [--shared] [-v]``.

``sys.setprofile`` over one ``EngineCore.ingest`` + ``tick`` (after five warm ones) records
every call into streamtrace's own Python: the calls, the files they run in, the hops (a call
into another file than its caller's) and the engine -> learner crossings (a call from
streamtrace/engine into streamtrace/learner). A model per stream (a slot bank, 1 slot) by
default; ``--shared``: one model over 16 slots, the message stepped by a subset call.
"""
from __future__ import annotations

import argparse
import os
import sys

import numpy as np


def path(shared: bool) -> list:
    """(caller file, callee file, function) of every call of one message, files relative to
    the package."""
    import streamtrace
    from streamtrace import wire
    from streamtrace.engine.config import load_config
    from streamtrace.engine.core import EngineCore
    root = os.path.dirname(streamtrace.__file__)
    cfg = load_config(None, {"model": {"stack": "gru", "n_in": 1, "n_hidden": 8, "n_out": 1},
                             "learning": {"mode": "forecast"},
                             "engine": {"slots": 16 if shared else 1, "shared_weights": shared, "park_s": 0},
                             "publish": {"weights_every": 0}})
    core = EngineCore(cfg)
    core.warmup()
    x = np.zeros(1, np.float32)
    for i in range(5):
        core.ingest(wire.data_message("s", i, x, ts=1.0), b"id")
        core.tick()
    calls = []

    def record(frame, event, arg):
        if event == "call" and frame.f_code.co_filename.startswith(root):
            caller = frame.f_back.f_code.co_filename if frame.f_back else "?"
            calls.append((os.path.relpath(caller, root), os.path.relpath(frame.f_code.co_filename, root),
                          frame.f_code.co_name))
    msg = wire.data_message("s", 5, x, ts=1.0)
    sys.setprofile(record)
    core.ingest(msg, b"id")
    core.tick()
    sys.setprofile(None)
    return calls


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shared", action="store_true", help="one model over 16 slots (default: a slot bank)")
    ap.add_argument("-v", action="store_true", help="list every call")
    args = ap.parse_args(argv)
    calls = path(args.shared)
    hops = sum(1 for a, b, _ in calls if a != b)
    crossings = [c for c in calls if c[0].startswith("engine/") and c[1].startswith("learner/")]
    print(f"calls {len(calls)}, files {len({b for _, b, _ in calls})}, hops {hops}, "
          f"engine -> learner {len(crossings)}: {', '.join(f'{b}:{f}' for _, b, f in crossings)}")
    if args.v:
        for c in calls:
            print("  ", *c)


if __name__ == "__main__":
    main()
