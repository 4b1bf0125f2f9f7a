"""Several nats-servers on one machine as one NATS cluster (``streamtrace cluster up --brokers 3``).

Node i listens for clients on ``port + i`` and for its peers on a free port, with routes to
every other node, a store folder ``<store>/n<i>`` of its own and the same ``sync_interval``. A
JetStream stream or bucket created with 3 replicas then survives the loss of any one node.
The same layout on three machines: one node per machine, each with routes to the other two
(docs/cluster.md).
"""
from __future__ import annotations

import os
import tempfile

from .nats_server import NatsServer, free_port

__all__ = ["local_brokers", "urls"]


def local_brokers(n: int, *, host: str = "127.0.0.1", port: int = 4222, store_dir: str | None = None,
                  token: str | None = None, allow_anonymous: bool = False, sync_interval: str | None = "always",
                  log_file=None) -> list[NatsServer]:
    """``n`` configured (not started) nodes; with n == 1 a plain server (no cluster).

    Example::

        >>> nodes = local_brokers(3, port=14222)
        >>> [s.port for s in nodes], len(nodes[0].routes)
        ([14222, 14223, 14224], 2)
    """
    store_dir = store_dir or tempfile.mkdtemp(prefix="streamtrace-nats-")
    if n == 1:
        return [NatsServer(host=host, port=port, store_dir=store_dir, token=token, allow_anonymous=allow_anonymous,
                           sync_interval=sync_interval, log_file=log_file)]
    cluster_ports = [free_port(host) for _ in range(n)]
    nodes = []
    for i in range(n):
        routes = [f"nats-route://{host}:{cp}" for j, cp in enumerate(cluster_ports) if j != i]
        nodes.append(NatsServer(host=host, port=port + i if port else 0, store_dir=os.path.join(store_dir, f"n{i}"),
                                token=token, allow_anonymous=allow_anonymous, sync_interval=sync_interval,
                                log_file=log_file, name=f"n{i}", cluster_port=cluster_ports[i], routes=routes))
    return nodes


def urls(nodes) -> str:
    """The comma-separated client URLs of ``nodes`` (what ``--nats`` takes).

    Example::

        >>> urls(local_brokers(2, port=14222))
        'nats://127.0.0.1:14222,nats://127.0.0.1:14223'
    """
    return ",".join(s.url for s in nodes)
