"""``streamtrace cluster up``: local broker(s) and N workers kept running by a :class:`Supervisor`.

Brokers start first (all of them before waiting, so a NATS cluster can form), then the workers,
each with every worker setting ``cluster up`` was given. A process that dies is logged with its
exit status and restarted (backoff, a limit); the others keep serving. Exit 0 on Ctrl-C /
SIGTERM (workers hand their partitions over, then the brokers stop), 1 when a process could not
be kept (restarted too often), 2 on bad settings or brokers that would not start.
"""
from __future__ import annotations

import signal
import sys

__all__ = ["run_up"]


WORKER_FLAGS = ("partitions", "lease_ttl", "checkpoint_every", "checkpoint_interval", "replicas")


def worker_argv(args, url: str, prometheus_port: int = 0) -> list[str]:
    """The command line of one worker of ``cluster up``, every worker setting passed on."""
    cmd = [sys.executable, "-m", "streamtrace", "worker", "--nats", url]
    for f in WORKER_FLAGS:
        if getattr(args, f, None) is not None:
            cmd += ["--" + f.replace("_", "-"), str(getattr(args, f))]
    cmd += ["--config", args.config] if args.config else []
    cmd += ["--prometheus-port", str(prometheus_port)] if prometheus_port else []
    cmd += ["-v"] if args.verbose else []
    cmd += ["--token", args.token] if args.token else []
    return cmd


def check_args(args) -> str | None:
    """What is wrong with ``cluster up``'s settings, in one line; None when nothing."""
    if args.workers < 1 or args.brokers < 1:
        return "--workers and --brokers must be at least 1"
    if args.replicas is not None and not 1 <= args.replicas <= min(args.brokers, 5):
        return f"--replicas {args.replicas}: between 1 and the number of brokers ({args.brokers}), at most 5"
    if args.max_restarts < 0 or args.restart_window <= 0:
        return "--max-restarts must be >= 0 and --restart-window > 0"
    return None


def start_brokers(args) -> list:
    """The broker(s), started and accepting clients (raises ServerError)."""
    from .brokers import local_brokers
    nodes = local_brokers(args.brokers, host=args.host, port=args.port, store_dir=args.store, token=args.token,
                          allow_anonymous=args.allow_anonymous,
                          sync_interval="always" if args.sync == "always" else None)
    try:
        for node in nodes:
            node.spawn()
        for node in nodes:
            node.wait_ready()
    except BaseException:
        for node in nodes:
            node.kill()
        raise
    return nodes


def run_up(args) -> int:
    """Run ``cluster up`` until Ctrl-C / SIGTERM or until a process cannot be kept (see module doc)."""
    import subprocess

    from .brokers import urls
    from .nats_server import ServerError
    from .supervisor import Supervisor
    bad = check_args(args)
    if bad:
        print(f"cluster up: {bad}", file=sys.stderr)
        return 2
    if args.replicas is None:
        args.replicas = min(args.brokers, 3)
    try:
        nodes = start_brokers(args)
    except ServerError as e:
        print(f"cluster up: {e}", file=sys.stderr)
        return 2
    url = urls(nodes)
    sup = Supervisor(max_restarts=args.max_restarts, window_s=args.restart_window)
    for node in nodes:
        sup.add(f"nats-server {node.name or 0} ({node.url})", node.spawn, proc=node.proc, tier=0)
    for i in range(args.workers):
        cmd = worker_argv(args, url, args.prometheus_port + i if args.prometheus_port else 0)
        sup.add(f"worker {i}", lambda cmd=cmd: subprocess.Popen(cmd), tier=1)
    print(f"streamtrace cluster: {len(nodes)} nats-server(s) at {url} (store {args.store or nodes[0].store_dir}, "
          f"sync {args.sync}, {args.replicas} replica(s)), {args.workers} worker(s); Ctrl-C stops all", flush=True)
    signal.signal(signal.SIGTERM, sup.request_stop)
    code = 0
    try:
        code = sup.run()
    except KeyboardInterrupt:
        pass
    finally:
        sup.stop()
    return code
