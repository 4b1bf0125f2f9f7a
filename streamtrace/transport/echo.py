"""The transport floor for benchmarks: a bare ZeroMQ ROUTER that decodes each msgpack data
message and answers with a reply of the engine's shape and size, without any learning."""
from __future__ import annotations

import os
import subprocess
import sys

import msgpack
import zmq

__all__ = ["run_echo", "start_echo"]


def run_echo(endpoint: str, cpu: int = -1, max_messages: int = 10 ** 9):
    if cpu >= 0:
        os.sched_setaffinity(0, {cpu})
    ctx = zmq.Context.instance()
    sock = ctx.socket(zmq.ROUTER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.bind(endpoint)
    print("ready", flush=True)
    for _ in range(max_messages):
        ident, *frames = sock.recv_multipart()
        msg = msgpack.unpackb(frames[-1], raw=False)
        if msg.get("type") == "stop":
            break
        x = msg["x"]
        reply = {"v": 1, "type": "prediction", "stream": msg["stream"], "seq": msg["seq"],
                 "pred": {"dtype": x["dtype"], "shape": x["shape"], "data": x["data"]},
                 "loss": 0.0, "step": msg["seq"], "version": 0, "ts": msg.get("ts", 0.0)}
        sock.send_multipart([ident, msgpack.packb(reply, use_bin_type=True)])
    sock.close(0)


def start_echo(endpoint: str, cpu: int | None = None) -> subprocess.Popen:
    """The bare ZeroMQ + msgpack echo server (the transport floor) in a child process;
    returns once it listens."""
    proc = subprocess.Popen([sys.executable, "-m", "streamtrace.transport.echo", endpoint,
                             str(-1 if cpu is None else cpu)], stdout=subprocess.PIPE, text=True)
    proc.stdout.readline()
    return proc


if __name__ == "__main__":
    run_echo(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else -1)
