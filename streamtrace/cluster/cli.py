"""The cluster's commands: ``streamtrace worker`` and ``streamtrace cluster up | status``."""
from __future__ import annotations

import asyncio
import json
import logging
import sys

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
    from .jetstream import Credentials
    return Credentials(*(getattr(args, f, None) for f in CREDENTIAL_FLAGS))


def stray_credential(args) -> str | None:
    """The first NATS credential / TLS flag given to a command that has no ``--nats`` URL (it
    would be ignored silently), as it is spelled on the command line; None when there is none."""
    if getattr(args, "nats", None):
        return None
    given = [f for f in CREDENTIAL_FLAGS if getattr(args, f, None)]
    return "--" + given[0].replace("_", "-") if given else None


def verbose_logging(verbose: bool):
    """Warnings from everything; with ``verbose`` also streamtrace's own INFO lines (not every
    library's: jax, nats)."""
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("streamtrace").setLevel(logging.INFO if verbose else logging.WARNING)


def cmd_worker(args) -> int:
    from ..engine import ConfigError, load_config
    from .worker import run_worker
    verbose_logging(args.verbose)
    try:
        cfg = load_config(args.config)
        return run_worker(args.nats, cfg, creds=credentials(args), partitions=args.partitions,
                          lease_ttl_s=args.lease_ttl, replicas=args.replicas,
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
    from .up import run_up
    verbose_logging(args.verbose)
    return run_up(args)


def cmd_status(args) -> int:
    from .jetstream import connect
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
    except Exception as e:  # noqa: BLE001 - a server without the cluster's log, or JetStream away: one line
        print(f"cluster status: no cluster at {args.nats} ({type(e).__name__}: {e or 'no answer'})", file=sys.stderr)
        return 2
    print(json.dumps(st, indent=1) if args.json else format_status(st))
    return 0


def worker_args(p, *, partitions_default=None):
    """The worker settings ``worker`` takes and ``cluster up`` passes on to each of its workers."""
    from ..arguments import existing_file, positive_float, positive_int
    p.add_argument("--config", type=existing_file, default=None,
                   help="engine TOML (model, learning, engine.slots; default: none, the documented defaults)")
    p.add_argument("--partitions", type=positive_int, default=partitions_default,
                   help="P, when this creates the log (default 16)")
    p.add_argument("--lease-ttl", type=positive_float, default=2.0,
                   help="seconds a silent owner keeps its partitions (a killed worker's are taken over about "
                   "this long after its last write)")
    p.add_argument("--checkpoint-every", type=positive_int, default=200,
                   help="messages per partition between checkpoints")
    p.add_argument("--checkpoint-interval", type=positive_float, default=1.0, help="seconds at most between a "
                   "partition's checkpoints while it has new steps (what a failover replays)")
    p.add_argument("--replicas", type=positive_int, default=None, help="copies of the log, leases and "
                   "checkpoints, when this creates them (default: 1; 3 over a 3-node NATS cluster)")
    p.add_argument("-v", "--verbose", action="store_true", help="streamtrace's INFO logging (not other libraries')")


def add_parsers(sub):
    """The ``worker`` and ``cluster up | status`` commands' parsers (no NATS import here)."""
    from ..arguments import nonnegative_int, port, positive_float, positive_int
    text = "join a NATS JetStream cluster as a worker (streamtrace[cluster])"
    p = sub.add_parser("worker", help=text, description=text)
    p.add_argument("--nats", required=True, help="the NATS server URL, e.g. nats://127.0.0.1:4222, or the nodes "
                   "of one NATS cluster, comma-separated")
    worker_args(p)
    p.add_argument("--prometheus-port", type=port, default=0, help="serve Prometheus metrics on 127.0.0.1 (0: off)")
    credential_args(p)
    p.set_defaults(func=cmd_worker)
    text = "a local NATS cluster: up, status"
    p = sub.add_parser("cluster", help=text, description=text)
    cs = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    text = "start nats-server(s) (JetStream) and N workers, restart any that die; Ctrl-C stops all"
    up = cs.add_parser("up", help=text, description=text)
    up.add_argument("--workers", type=positive_int, default=2, help="worker processes")
    up.add_argument("--brokers", type=positive_int, default=1, help="nats-servers: 1, or 3 (a NATS cluster on "
                    "this machine; the log, leases and checkpoints kept 3 times)")
    up.add_argument("--sync", choices=("always", "default"), default="always",
                    help="JetStream fsync: before acknowledging each write (always), or nats-server's own "
                    "interval (default: every 2 minutes; faster, loses recent writes on an OS crash)")
    up.add_argument("--host", default="127.0.0.1", help="bind address (beyond loopback needs --token)")
    up.add_argument("--port", type=port, default=4222, help="client port (of the first broker; the others the next)")
    up.add_argument("--store", default=None, help="JetStream store folder (default: a temp folder)")
    up.add_argument("--token", default=None, help="a token clients must give (default: none, loopback only)")
    up.add_argument("--allow-anonymous", action="store_true", help="bind beyond loopback without credentials")
    up.add_argument("--prometheus-port", type=port, default=0,
                    help="worker i serves Prometheus metrics on this port + i (0: off)")
    up.add_argument("--max-restarts", type=nonnegative_int, default=5,
                    help="restarts of one process within --restart-window before cluster up gives up (exit 1)")
    up.add_argument("--restart-window", type=positive_float, default=60.0,
                    help="seconds over which --max-restarts counts")
    worker_args(up, partitions_default=16)
    up.set_defaults(func=cmd_up)
    text = "partitions -> owner, epoch, lag, checkpoint age; live workers"
    st = cs.add_parser("status", help=text, description=text)
    st.add_argument("--nats", default="nats://127.0.0.1:4222", help="the NATS server URL(s)")
    st.add_argument("--json", action="store_true", help="print the status as JSON")
    credential_args(st)
    st.set_defaults(func=cmd_status)
