"""``streamtrace-runner serve FOLDER``: serve an exported learner over the wire protocol, without
jax. A bad folder, checkpoint or address: one line on stderr, exit 2."""
from __future__ import annotations

import argparse
import sys

__all__ = ["main"]


def _parser():
    p = argparse.ArgumentParser(prog="streamtrace-runner", description="serve a learner exported by "
                                "`streamtrace export` over streamtrace's wire protocol (no jax)")
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser("serve", help="serve an export folder (the sockets and defaults of `streamtrace serve`)")
    s.add_argument("folder")
    s.add_argument("--router", default="tcp://127.0.0.1:5555", help="request/reply ingest (default loopback)")
    s.add_argument("--pull", default="tcp://127.0.0.1:5556", help="fire-and-forget ingest ('' : none)")
    s.add_argument("--pub", default="tcp://127.0.0.1:5557", help="predictions, weights, errors, stats ('' : none)")
    s.add_argument("--slots", type=int, default=16, help="streams served at once, a model each (default 16)")
    s.add_argument("--checkpoint-dir", default="", help="checkpoints here (serve's format); resumes from the newest")
    s.add_argument("--checkpoint-every", type=int, default=1000, help="steps between checkpoints (default 1000)")
    s.add_argument("--on-gap", choices=("reject", "accept"), default="reject")
    s.add_argument("--weights-every", type=int, default=100,
                   help="publish the weights that changed every N steps (0: never; as serve's publish.weights_every)")
    s.add_argument("--idle-timeout-s", type=float, default=60.0, help="a stream silent this long leaves its slot")
    s.add_argument("--park-s", type=float, default=3600.0,
                   help="a stream that left is kept (parked) this long and resumes if it returns (0: off)")
    s.add_argument("--max-parked", type=int, default=256, help="most parked streams, the oldest dropped first")
    s.add_argument("--no-reply-first", action="store_true",
                   help="answer each message after its step, never from the prediction twin before it "
                   "(as serve's engine.reply_first = false; the twin answers first only where the "
                   "prediction does not depend on the update: supervised, or learning.forecast_before_update)")
    s.add_argument("--busy-poll-us", type=int, default=5000,
                   help="after messages at most this far apart, poll without sleeping (no wake-up per "
                   "message; keeps a CPU busy while a 200 Hz+ sensor sends; never with one CPU; 0: off; "
                   "as serve's engine.busy_poll_us)")
    s.add_argument("--curve-secret-key-file", default="", help="CURVE: this server's key (zmq certificate)")
    s.add_argument("--curve-authorized-dir", default="", help="CURVE: the client public keys admitted")
    s.add_argument("--allow-any-client", action="store_true", help="CURVE: admit any client key")
    return p


def serve(args) -> int:
    from .bank import RunnerBank
    from .checkpoints import CheckpointError
    from .core import Options, RunnerCore
    from .runtime import Runner, RunnerError
    from .server import RunnerServer, Sockets
    try:
        if args.slots < 1 or args.checkpoint_every < 1 or args.max_parked < 1:
            raise ValueError("--slots, --checkpoint-every and --max-parked must be >= 1")
        if args.busy_poll_us < 0:
            raise ValueError("--busy-poll-us must be >= 0 (0: off)")
        if args.weights_every < 0:
            raise ValueError("--weights-every must be >= 0 (0: never)")
        if not (args.park_s >= 0 and args.idle_timeout_s >= 0):
            raise ValueError("--park-s and --idle-timeout-s must be >= 0 seconds")
        opt = Options(slots=args.slots, idle_timeout_s=args.idle_timeout_s, on_gap=args.on_gap,
                      park_s=args.park_s, max_parked=args.max_parked,
                      checkpoint_dir=args.checkpoint_dir, checkpoint_every=args.checkpoint_every,
                      # without a PUB socket nothing is published: no weights or predictions made for it
                      weights_every=args.weights_every if args.pub else 0, predictions=bool(args.pub),
                      reply_first=not args.no_reply_first, busy_poll_us=args.busy_poll_us)
        core = RunnerCore(RunnerBank(Runner(args.folder), args.slots), opt)
        resumed = core.resume()
        server = RunnerServer(core, Sockets(args.router, args.pull, args.pub, curve_secret_key_file=args.curve_secret_key_file,
                                            curve_authorized_dir=args.curve_authorized_dir,
                                            allow_any_client=args.allow_any_client))
    except (RunnerError, CheckpointError, ValueError, OSError) as e:
        print("runner error: " + " ".join(str(e).split()), file=sys.stderr)
        return 2
    server.install_signals()        # before the announcement: whoever waits for it may stop us at once
    if resumed:
        print(f"resumed from {resumed['path']} at step {core.steps}", flush=True)
    print(f"streamtrace runner: {server.endpoints}; {args.folder}, {args.slots} slots", flush=True)
    server.run()
    print(f"stopped after {core.steps} steps", flush=True)
    return 0


def main(argv=None) -> int:
    args = _parser().parse_args(argv)
    return serve(args)


if __name__ == "__main__":
    sys.exit(main())
