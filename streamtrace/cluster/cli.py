"""The cluster's commands: ``streamtrace worker`` and ``streamtrace cluster up | status``."""
from __future__ import annotations

import asyncio
import json
import logging
import signal
import subprocess
import sys
import time

__all__ = ["add_parsers", "credential_args", "credentials", "stray_credential"]


def credential_args(p):
    """The NATS credential and TLS flags every command that talks to a cluster takes."""
    g = p.add_argument_group("NATS credentials and TLS (with --nats)")
    g.add_argument("--token", default=None, help="the NATS server's token")
    g.add_argument("--user", default=None, help="NATS user name (with --password)")
    g.add_argument("--password", default=None, help="NATS password (with --user)")
    g.add_argument("--creds", default=None, help="a .creds file (JWT + nkey)")
    g.add_argument("--nkey", default=None, help="a file holding an nkey seed")
    g.add_argument("--tls-ca", default=None, help="CA certificate file that verifies the server")
    g.add_argument("--tls-cert", default=None, help="client certificate file (with --tls-key)")
    g.add_argument("--tls-key", default=None, help="client private key file (with --tls-cert)")


CREDENTIAL_FLAGS = ("token", "user", "password", "creds", "nkey", "tls_ca", "tls_cert", "tls_key")


def credentials(args):
    """A ``Credentials`` from the flags of :func:`credential_args`."""
    from .log import Credentials
    return Credentials(*(getattr(args, f, None) for f in CREDENTIAL_FLAGS))


def stray_credential(args) -> str | None:
    """The first NATS credential / TLS flag given to a command that has no ``--nats`` URL (it
    would be ignored silently), as it is spelled on the command line; None when there is none."""
    if getattr(args, "nats", None):
        return None
    given = [f for f in CREDENTIAL_FLAGS if getattr(args, f, None)]
    return "--" + given[0].replace("_", "-") if given else None


def cmd_worker(args) -> int:
    from ..engine import ConfigError, load_config
    from .worker import run_worker
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(asctime)s %(name)s %(message)s")
    try:
        cfg = load_config(args.config)
        return run_worker(args.nats, cfg, creds=credentials(args), partitions=args.partitions,
                          lease_ttl_s=args.lease_ttl,
                          ckpt_every=args.checkpoint_every, ckpt_interval_s=args.checkpoint_interval,
                          prometheus_port=args.prometheus_port)
    except ConfigError as e:
        print("config error: " + " ".join(str(e).split()), file=sys.stderr)
        return 2
    except ConnectionError as e:
        print(f"worker: {e}", file=sys.stderr)
        return 2
    except ImportError as e:
        print(f"worker needs the optional extra: pip install 'streamtrace[cluster]' ({e})", file=sys.stderr)
        return 2


def cmd_up(args) -> int:
    from .server import NatsServer, ServerError
    try:
        srv = NatsServer(host=args.host, port=args.port, store_dir=args.store, token=args.token,
                         allow_anonymous=args.allow_anonymous).start()
    except ServerError as e:
        print(f"cluster up: {e}", file=sys.stderr)
        return 2
    cmd = [sys.executable, "-m", "streamtrace", "worker", "--nats", srv.url, "--partitions", str(args.partitions)]
    cmd += ["--config", args.config] if args.config else []
    cmd += ["--token", args.token] if args.token else []
    workers = [subprocess.Popen(cmd) for _ in range(args.workers)]
    print(f"streamtrace cluster: nats-server at {srv.url} (store {srv.store_dir}), {args.workers} worker(s); "
          "Ctrl-C stops all", flush=True)
    stop = []
    signal.signal(signal.SIGTERM, lambda *a: stop.append(1))
    try:
        while not stop and all(w.poll() is None for w in workers):
            time.sleep(0.5)
    except KeyboardInterrupt:
        pass
    for w in workers:
        if w.poll() is None:
            w.terminate()
    for w in workers:
        try:
            w.wait(30)
        except subprocess.TimeoutExpired:
            w.kill()
    srv.stop()
    return 0


def cmd_status(args) -> int:
    from .log import connect
    from .status import format_status, gather

    async def main():
        nc = await connect(args.nats, credentials(args), name="streamtrace-status")
        try:
            return await gather(nc)
        finally:
            await nc.close()
    try:
        st = asyncio.run(main())
    except ConnectionError as e:        # no NATS server there, or it refused the credentials
        print(f"cluster status: {e}", file=sys.stderr)
        return 2
    except ImportError as e:
        print(f"cluster status needs the optional extra: pip install 'streamtrace[cluster]' ({e})", file=sys.stderr)
        return 2
    print(json.dumps(st, indent=1) if args.json else format_status(st))
    return 0


def add_parsers(sub):
    """The ``worker`` and ``cluster up | status`` commands' parsers (no NATS import here)."""
    from ..arguments import existing_file, port, positive_float, positive_int
    text = "join a NATS JetStream cluster as a worker (streamtrace[cluster])"
    p = sub.add_parser("worker", help=text, description=text)
    p.add_argument("--nats", required=True, help="the NATS server URL, e.g. nats://127.0.0.1:4222")
    p.add_argument("--config", type=existing_file, default=None,
                   help="engine TOML (model, learning, engine.slots; default: none, the documented defaults)")
    p.add_argument("--partitions", type=positive_int, default=None,
                   help="P, when this worker creates the log (default 16)")
    p.add_argument("--lease-ttl", type=positive_float, default=2.0,
                   help="seconds a silent owner keeps its partitions (failover takes about this + 1-2 s)")
    p.add_argument("--checkpoint-every", type=positive_int, default=200,
                   help="messages per partition between checkpoints")
    p.add_argument("--checkpoint-interval", type=positive_float, default=1.0, help="seconds at most between a "
                   "partition's checkpoints while it has new steps (what a failover replays)")
    p.add_argument("--prometheus-port", type=port, default=0, help="serve Prometheus metrics on 127.0.0.1 (0: off)")
    p.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    credential_args(p)
    p.set_defaults(func=cmd_worker)
    text = "a local NATS cluster: up, status"
    p = sub.add_parser("cluster", help=text, description=text)
    cs = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    text = "start nats-server (JetStream) and N workers; Ctrl-C stops all"
    up = cs.add_parser("up", help=text, description=text)
    up.add_argument("--workers", type=positive_int, default=2, help="worker processes")
    up.add_argument("--config", type=existing_file, default=None,
                    help="the workers' engine TOML (default: none, the defaults)")
    up.add_argument("--host", default="127.0.0.1", help="bind address (beyond loopback needs --token)")
    up.add_argument("--port", type=port, default=4222, help="the NATS server's port")
    up.add_argument("--store", default=None, help="JetStream store folder (default: a temp folder)")
    up.add_argument("--partitions", type=positive_int, default=16, help="partitions of the stream log")
    up.add_argument("--token", default=None, help="a token clients must give (default: none, loopback only)")
    up.add_argument("--allow-anonymous", action="store_true", help="bind beyond loopback without credentials")
    up.set_defaults(func=cmd_up)
    text = "partitions -> owner, epoch, lag, checkpoint age; workers"
    st = cs.add_parser("status", help=text, description=text)
    st.add_argument("--nats", default="nats://127.0.0.1:4222", help="the NATS server URL")
    st.add_argument("--json", action="store_true", help="print the status as JSON")
    credential_args(st)
    st.set_defaults(func=cmd_status)
