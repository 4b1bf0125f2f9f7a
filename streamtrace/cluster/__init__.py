"""Scale-out on NATS JetStream (``pip install 'streamtrace[cluster]'``): streams sharded over
workers by partition, KV leases with fencing tokens, checkpoints in the object store, replay
after failover. See docs/cluster.md."""
from .assign import assign
from .client import ClusterClient
from .jetstream import Credentials
from .nats_server import NatsServer, ServerError, find_server_binary

__all__ = ["assign", "ClusterClient", "Credentials", "NatsServer", "ServerError", "find_server_binary"]
