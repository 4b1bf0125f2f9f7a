"""What the MQTT bridge adds to a round trip, measured in one run (not a pytest test; not in
`make test`):

* bus floor: a device publishes a sample, a bare paho relay process (no engine) publishes the
  same payload back on the mirrored topic, through the same broker: two broker hops and one
  Python MQTT client in between, as in the bridge's path;
* engine end to end: ``SensorClient.step`` against the same engine (ZeroMQ request/reply);
* bridge: the device's sample through the broker and ``streamtrace bridge mqtt`` (its own
  process) to the engine, the prediction back through the broker to the device.

Rounds alternate the three so that a busy machine slows them alike. Prints the table rows
(p50 / p99 in µs) and the ratio bridge / (engine end to end + bus floor).

    .venv/bin/python bench/bridge_latency_mqtt.py [--steps 2000] [--rounds 3] [--json]
"""
from __future__ import annotations

import argparse
import json
import os
import queue
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from timing import cpu_name, percentiles, timed

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))     # the test broker and engine helpers

ENGINE = {
    "model": {"stack": "gru", "n_in": 4, "n_hidden": 64, "n_out": 4},
    "learning": {"algorithm": "d-rtrl", "mode": "forecast", "optimizer": "adam", "lr": 1e-3},
    "engine": {"slots": 4, "micro_batch": 1, "park_s": 0.0},
    "publish": {"weights_every": 0, "stats_every_s": 3600.0, "predictions": False},
    "checkpoint": {"dir": ""},
}


def relay(port: int):
    """The bus floor's other end: every payload on floor/<id>/data goes back on floor/<id>/pred."""
    import paho.mqtt.client as mqtt
    c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2)
    c.on_connect = lambda c, u, f, rc, p=None: c.subscribe("floor/+/data", 0)
    c.on_message = lambda c, u, m: c.publish(m.topic.rsplit("/", 1)[0] + "/pred", m.payload, 0)
    c.connect("127.0.0.1", port)
    c.loop_forever()


class Device:
    def __init__(self, port: int):
        import paho.mqtt.client as mqtt
        self.inbox: queue.Queue = queue.Queue()
        self.c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2)
        self.c.on_message = lambda c, u, m: self.inbox.put(m.payload)
        self.c.connect("127.0.0.1", port)
        self.c.loop_start()
        for t in ("floor/dev/pred", "sensors/dev/pred"):
            self.c.subscribe(t, 0)

    def round_trips(self, topic: str, n: int, x: list, timeout: float = 10.0) -> np.ndarray:
        out = np.empty(n)
        for i in range(n):
            payload = json.dumps({"x": x, "ts": float(i)})
            t0 = time.perf_counter()
            self.c.publish(topic, payload, 0)
            self.inbox.get(timeout=timeout)
            out[i] = time.perf_counter() - t0
        return out


def wait_answering(dev: Device, topic: str, x: list, what: str, timeout: float = 60.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            dev.round_trips(topic, 1, x, timeout=1.0)
            return
        except queue.Empty:
            pass
    raise SystemExit(f"{what} did not answer within {timeout:.0f} s")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=2000, help="timed round trips per kind and round")
    ap.add_argument("--warmup", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--relay", type=int, default=None, help=argparse.SUPPRESS)   # internal: the relay process
    args = ap.parse_args(argv)
    if args.relay is not None:
        relay(args.relay)
        return 0

    from engine_helpers import running_engine
    from mqtt_broker import Broker

    from streamtrace.transport import SensorClient
    x = [0.1, -0.2, 0.3, 0.05]
    procs = []
    with Broker() as broker, running_engine(Path(tempfile.mkdtemp()), ENGINE) as (_, ep, _cfg):
        try:
            procs.append(subprocess.Popen([sys.executable, __file__, "--relay", str(broker.port)]))
            procs.append(subprocess.Popen([sys.executable, "-m", "streamtrace", "bridge", "mqtt", "--endpoint",
                                           ep["router"], "--port", str(broker.port)], stderr=subprocess.DEVNULL))
            dev = Device(broker.port)
            sensor = SensorClient(ep["router"], stream="e2e", timeout_s=120)
            sensor.step(x)                                    # the engine's first program
            wait_answering(dev, "floor/dev/data", x, "the relay")
            wait_answering(dev, "sensors/dev/data", x, "the bridge")
            samples = {"floor": [], "engine": [], "bridge": []}
            for r in range(args.rounds):
                for kind in samples:
                    n = args.warmup + args.steps
                    if kind == "engine":
                        t = np.asarray(timed(lambda: sensor.step(x), n))
                    else:
                        t = dev.round_trips("floor/dev/data" if kind == "floor" else "sensors/dev/data", n, x)
                    samples[kind].append(t[args.warmup:])
            sensor.close()
        finally:
            for p in procs:
                p.terminate()
                p.wait(10)
    res = {k: percentiles(np.concatenate(v)) for k, v in samples.items()}
    res["ratio"] = {q: res["bridge"][q] / (res["engine"][q] + res["floor"][q]) for q in ("p50", "p99")}
    res["added_over_engine"] = {q: (res["bridge"][q] - res["floor"][q]) / res["engine"][q] for q in ("p50", "p99")}
    res["setup"] = {"broker": broker.kind, "steps": args.steps * args.rounds, "cpu": cpu_name(), "cpus": os.cpu_count(), "model": "GRU-64 d-rtrl, 4 inputs"}
    if args.json:
        print(json.dumps(res))
        return 0
    print(f"MQTT bridge latency ({broker.kind}, {args.steps * args.rounds} round trips each, GRU-64 D-RTRL, "
          f"{os.cpu_count()} CPUs)\n")
    print("| path | p50 µs | p99 µs |\n|---|---:|---:|")
    for k, name in (("floor", "bus floor: device → broker → relay → broker → device"),
                    ("engine", "engine end to end: SensorClient.step (ZeroMQ)"),
                    ("bridge", "bridge: device → broker → bridge → engine → bridge → broker → device")):
        print(f"| {name} | {res[k]['p50']:.0f} | {res[k]['p99']:.0f} |")
    r, a = res["ratio"], res["added_over_engine"]
    print(f"\nbridge / (engine end to end + bus floor): p50 {r['p50']:.2f}, p99 {r['p99']:.2f}; "
          f"(bridge - bus floor) / engine end to end: p50 {a['p50']:.2f}, p99 {a['p99']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
