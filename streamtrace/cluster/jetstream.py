"""The ingest log and the cluster's buckets on JetStream: names, creation, connection options.

Sensors publish ``st.in.<stream>``; the stream ``ST_IN`` stores each message as
``st.p.<partition>.<stream>`` (the server's subject transform hashes the stream id into one of
P partitions, fixed at creation, like a Kafka key). Predictions go out on ``st.out.<stream>``
and refusals on ``st.err.<stream>`` (core NATS: at-least-once, de-duplicated by the client).
Buckets: ``st_lease`` (one key per partition: owner, epoch, checkpoint pointer), ``st_workers``
(heartbeats) and the object store ``st_ckpt`` (partition checkpoints).
"""
from __future__ import annotations

import json
import re
import ssl
from dataclasses import dataclass

__all__ = ["LOG_STREAM", "LEASES", "WORKERS", "CHECKPOINTS", "META", "in_subject", "out_subject", "err_subject",
           "partition_filter", "check_stream_id", "ensure_log", "read_partitions", "Credentials", "connect", "redact",
           "server_urls"]

LOG_STREAM = "ST_IN"
LEASES = "st_lease"
WORKERS = "st_workers"
CHECKPOINTS = "st_ckpt"
META = "st_meta"
DEFAULT_PARTITIONS = 16
_TOKEN = re.compile(r"^[A-Za-z0-9_\-:=@+~!#$%^&()\[\]{}|;,?/]{1,128}$")   # one NATS subject token


def check_stream_id(stream: str) -> str:
    """A stream id is one subject token: no dots, spaces, '*' or '>' (they would split or
    widen the subject)."""
    if not isinstance(stream, str) or not _TOKEN.match(stream):
        raise ValueError(f"stream id {stream!r} cannot be a NATS subject token: use 1..128 characters without "
                         "'.', '*', '>' or whitespace")
    return stream


def in_subject(stream: str) -> str:
    return "st.in." + stream


def out_subject(stream: str) -> str:
    return "st.out." + stream


def err_subject(stream: str) -> str:
    return "st.err." + stream


def partition_filter(k: int) -> str:
    return f"st.p.{k}.*"


NO_PLACEMENT = 10005     # JetStream's error code: no suitable peers for placement (yet)
WORKERS_TTL_S = 30.0     # a heartbeat key not written for this long is removed by the server


async def ensure_log(js, partitions: int | None = None, *, max_age_s: float = 86400.0, replicas: int = 1,
                     ready_s: float = 30.0) -> int:
    """Open the log, the buckets and the object store, creating what is missing (idempotent;
    workers and ``cluster up`` race safely) with ``replicas`` copies each (1, or 3 over a
    3-node NATS cluster; what exists keeps the replicas it was created with). Returns P: the one
    stored at creation wins; asking for another P later is an error, because moving streams
    between partitions would break their order. A JetStream that is not ready yet (a cluster
    electing its first leaders, or a bucket just created whose stream has no leader yet: no
    response from it; or servers still joining, so fewer than ``replicas`` can hold a copy) is
    waited for, ``ready_s`` at most."""
    import asyncio
    import time

    from nats.errors import TimeoutError as NatsTimeout
    from nats.js.errors import BadRequestError, NoStreamResponseError, ServiceUnavailableError
    deadline = time.monotonic() + ready_s
    while True:
        try:
            return await _ensure(js, partitions, max_age_s, replicas)
        except (ServiceUnavailableError, NoStreamResponseError, NatsTimeout, asyncio.TimeoutError):
            if time.monotonic() >= deadline:
                raise
        except BadRequestError as e:
            if e.err_code != NO_PLACEMENT:
                raise
            if time.monotonic() >= deadline:
                raise RuntimeError(f"JetStream found fewer than {replicas} servers to hold the log's copies "
                                   f"within {ready_s:g} s: start {replicas} clustered brokers, or ask for fewer "
                                   f"replicas ({e.description})") from e
        await asyncio.sleep(0.5)


async def _open_or_create(open_, create):
    from nats.js.errors import NotFoundError
    try:
        return await open_()
    except NotFoundError:
        return await create()


async def _ensure(js, partitions, max_age_s, replicas) -> int:
    from nats.js.api import (KeyValueConfig, ObjectStoreConfig, RetentionPolicy, StorageType, StreamConfig,
                             SubjectTransform)
    from nats.js.errors import KeyWrongLastSequenceError
    meta = await _open_or_create(lambda: js.key_value(META), lambda: js.create_key_value(
        KeyValueConfig(bucket=META, history=1, replicas=replicas)))
    want = partitions or DEFAULT_PARTITIONS
    try:
        await meta.create("config", json.dumps({"partitions": want}).encode())
    except KeyWrongLastSequenceError:
        pass
    p = await read_partitions(js, meta)
    if partitions and partitions != p:
        raise ValueError(f"the cluster's log was created with {p} partitions; {partitions} asked (P is fixed "
                         "at creation: use the same value, or a new store)")
    transform = SubjectTransform(src="st.in.*", dest="st.p.{{partition(%d,1)}}.{{wildcard(1)}}" % p)
    await _open_or_create(lambda: js.stream_info(LOG_STREAM), lambda: js.add_stream(StreamConfig(
        name=LOG_STREAM, subjects=["st.in.*"], subject_transform=transform, retention=RetentionPolicy.LIMITS,
        storage=StorageType.FILE, max_age=max_age_s, duplicate_window=120.0, num_replicas=replicas)))
    await _open_or_create(lambda: js.key_value(LEASES), lambda: js.create_key_value(
        KeyValueConfig(bucket=LEASES, history=1, replicas=replicas)))
    await _open_or_create(lambda: js.key_value(WORKERS), lambda: js.create_key_value(
        KeyValueConfig(bucket=WORKERS, history=1, replicas=replicas, ttl=WORKERS_TTL_S)))
    await _open_or_create(lambda: js.object_store(CHECKPOINTS), lambda: js.create_object_store(
        CHECKPOINTS, ObjectStoreConfig(bucket=CHECKPOINTS, replicas=replicas)))
    return p


async def read_partitions(js, meta=None) -> int:
    meta = meta or await js.key_value(META)
    return int(json.loads((await meta.get("config")).value)["partitions"])


@dataclass
class Credentials:
    """What a worker, client or bridge presents to nats-server (all optional)."""
    token: str | None = None
    user: str | None = None
    password: str | None = None
    creds: str | None = None          # a .creds file (JWT + nkey seed)
    nkey_seed: str | None = None      # a file holding an nkey seed
    tls_ca: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None

    def options(self) -> dict:
        kw = {k: v for k, v in (("token", self.token), ("user", self.user), ("password", self.password),
                                 ("user_credentials", self.creds), ("nkeys_seed", self.nkey_seed)) if v}
        if self.tls_ca or self.tls_cert:
            ctx = ssl.create_default_context(cafile=self.tls_ca)
            if self.tls_cert:
                ctx.load_cert_chain(self.tls_cert, self.tls_key)
            kw["tls"] = ctx
        return kw


def server_urls(url: str) -> list[str]:
    """``nats://a:4222,nats://b:4222`` -> the list of URLs (one URL: a list of one).

    Example::

        >>> server_urls("nats://a:4222, nats://b:4222")
        ['nats://a:4222', 'nats://b:4222']
    """
    urls = [u.strip() for u in url.split(",") if u.strip()]
    if not urls:
        raise ValueError(f"no NATS server URL in {url!r}")
    return urls


async def connect(url: str, creds: Credentials | None = None, *, name: str = "streamtrace", **kw):
    """A NATS connection that keeps reconnecting (a broker restart is waited out, another node
    of a cluster taken meanwhile) and fails at once on a first connection that is refused (wrong
    credentials, nothing listening). ``url``: one server, or several comma-separated (the
    nodes of one NATS cluster, tried in turn)."""
    import nats
    seen = []

    async def first_errors(e):      # why a first connection failed (NoServersError alone does not say)
        if len(seen) < 8:
            seen.append(e)
    kw.setdefault("error_cb", first_errors)
    try:
        nc = await nats.connect(server_urls(url), name=name, allow_reconnect=True, max_reconnect_attempts=1,
                                reconnect_time_wait=0.2, connect_timeout=2, **(creds or Credentials()).options(), **kw)
    except Exception as e:  # noqa: BLE001 - nats-py raises several kinds; one clear message
        why = "; ".join(dict.fromkeys(f"{type(x).__name__}: {x}" for x in seen)) or f"{type(e).__name__}: {e}"
        if any("authoriz" in str(x).lower() for x in seen):
            why += " (the server wants credentials: --token / --user and --password / --creds / --nkey)"
        raise ConnectionError(f"cannot connect to NATS at {url}: {why}") from None
    nc.options["max_reconnect_attempts"] = -1     # connected once: from now on wait out broker restarts
    return nc


def redact(url: str) -> str:
    """``url`` (or each of comma-separated URLs) without a token or password in it (for logs
    and summaries)."""
    if "," in url:
        return ",".join(redact(u.strip()) for u in url.split(","))
    scheme, sep, rest = url.partition("://")
    if sep and "@" in rest:
        return f"{scheme}://***@{rest.split('@', 1)[1]}"
    return url
