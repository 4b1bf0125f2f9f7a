"""One partition a worker owns: restore its checkpoint, replay and follow its log, step each
message, publish the answers, checkpoint, commit under the fencing token, then ack.

Order of writes (why the state is exact): a checkpoint is stored as a new object, then made
current by a compare-and-set on the lease (refused if the lease moved on), and only then are
the messages it covers acked (the storing and committing run in a task of their own while the
owner steps on: the snapshot was taken first, one commit at a time). A new owner loads the committed checkpoint and replays the log
after its sequence; the step being deterministic, it recomputes the same states and the same
predictions (clients drop the repeats by (stream, seq)). Whenever this owner is unsure of
where it stands (its lease's validity ran out mid-batch, a broker error mid-step), it drops
the partition's in-memory state and reloads the committed checkpoint: never a guess.
"""
from __future__ import annotations

import asyncio
import hashlib
import logging
import time

from . import jetstream as L
from .lease import Lease, LeaseLost
from .pull import Puller

__all__ = ["PartitionOwner"]

log = logging.getLogger("streamtrace.cluster")


_background: set = set()      # deletions of superseded checkpoints in flight (a reference keeps each task alive)


class _Unsure(Exception):
    """Stop and reload from the committed checkpoint."""


async def _restore_verified(w, lease: Lease) -> tuple[int, list[str]]:
    """Load the lease's checkpoint into ``w.stepper`` if its bytes hash to the committed SHA-256
    (and parse); else the previous checkpoint (a longer replay); else none (the log from its
    start). Returns (log seq the state covers, stream names). Each damaged one is counted
    (``checkpoints_damaged``) and logged."""
    from ..learner.checkpoint import CheckpointError
    choices = [(lease.ckpt, lease.seq, lease.sha)]
    if lease.prev:
        choices.append((lease.prev.get("ckpt"), lease.prev.get("seq", 0), lease.prev.get("sha")))
    for name, seq, sha in choices:
        if not name:
            break
        try:
            raw = (await w.objects.get(name)).data
            if sha and hashlib.sha256(raw).hexdigest() != sha:
                raise CheckpointError(f"checkpoint {name}: its bytes do not match the SHA-256 committed with it")
            return w.stepper.restore(raw, f"checkpoint {name}")
        except (CheckpointError, *_object_errors()) as e:
            w.count("checkpoints_damaged")
            log.error("partition %d: %s (%s); falling back to the checkpoint before it", lease.partition,
                      e, type(e).__name__)
    if lease.ckpt:
        log.error("partition %d: no intact checkpoint: replaying the log from its start", lease.partition)
    return 0, []


def _object_errors() -> tuple:
    from nats.js.errors import DigestMismatchError, NotFoundError
    return DigestMismatchError, NotFoundError


def consumer_config(k: int, epoch: int, start_seq: int):
    """The pull consumer partition ``k``'s owner at ``epoch`` reads the log with, from ``start_seq``."""
    from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
    name = f"p{k}-e{epoch}"
    return ConsumerConfig(name=name, durable_name=name, filter_subject=L.partition_filter(k),
                          deliver_policy=DeliverPolicy.BY_START_SEQUENCE, opt_start_seq=start_seq,
                          ack_policy=AckPolicy.ALL, ack_wait=60.0, max_ack_pending=-1, inactive_threshold=30.0)


class PartitionOwner:
    def __init__(self, worker, lease: Lease):
        self.w, self.lease, self.k = worker, lease, lease.partition
        self.names: set[str] = set()
        self.applied = 0          # last log sequence applied to the in-memory state
        self.answered = 0         # last log sequence whose answer went out (or the loaded state covers)
        self.last_msg = None      # the newest applied message (AckAll acks everything up to it)
        self.since_ckpt, self.t_ckpt = 0, time.monotonic()
        self.psub, self.consumer = None, None
        self.stopping, self.lost = False, False
        self.commit: asyncio.Task | None = None     # the checkpoint being stored and committed
        self.hole_at = None       # (stream, log seq) of a hole already replayed once: the log lacks it
        self.delivered = 0        # the consumer's delivery count of the last message that reached this owner

    # ---- taking over -------------------------------------------------------------------
    async def load(self):
        """State from the committed checkpoint, then a consumer from the sequence after it."""
        w, lease = self.w, self.lease
        w.stepper.drop(self.names)
        self.names, self.last_msg, self.since_ckpt = set(), None, 0
        self.applied, names = await _restore_verified(w, lease)
        self.names = set(names)
        # the partition's weight, written with the next renewal: never below what the lease said (a
        # checkpoint older than a stream's first step holds fewer; the replay brings it back)
        self.lease.streams = max(self.lease.streams, len(self.names))
        self.answered = self.applied
        w.count("restores")
        await self._subscribe()

    async def _subscribe(self):
        await self._unsubscribe()
        cfg = consumer_config(self.k, self.lease.epoch, self.applied + 1)
        try:
            await self.w.js.delete_consumer(L.LOG_STREAM, cfg.name)
        except Exception:  # noqa: BLE001 - absent: the usual case (a delete that failed shows in _delivery)
            pass
        await self.w.js.add_consumer(L.LOG_STREAM, cfg)
        self.consumer, self.delivered = cfg.name, 0
        self.psub = Puller(self.w.nc, L.LOG_STREAM, cfg.name, expires_s=max(self.w.poll_s * 4, 1.0))
        await self.psub.start()

    async def _unsubscribe(self):
        if self.psub is not None:
            await self.psub.stop()
            self.psub = None

    # ---- following the log --------------------------------------------------------------
    async def run(self):
        while not self.stopping and not self.lost:
            try:
                await self._turn()
            except LeaseLost as e:
                self.lost = True
                self.w.count("leases_lost")
                log.warning("%s", e)
            except asyncio.CancelledError:
                raise
            except Exception as e:  # noqa: BLE001 - broker away, timeouts, _Unsure: reload and go on
                if self.stopping:
                    break
                self.w.count("reloads")
                log.info("partition %d: %s: %s; reloading from the committed checkpoint", self.k, type(e).__name__, e)
                await asyncio.sleep(0.2)
                await self._reload()
        if self.lost:
            await self._settle(quietly=True)
            await self._unsubscribe()
            self.w.stepper.drop(self.names)
            self.names = set()

    async def _reload(self):
        try:
            await self._settle(quietly=True)      # its outcome is in the lease either way
            if not self.lease.valid(time.monotonic()):
                await self.w.leases.renew(self.lease)
            await self.load()
        except LeaseLost:
            self.lost = True
            self.w.count("leases_lost")
        except Exception as e:  # noqa: BLE001 - still unreachable: the next turn tries again
            log.info("partition %d: reload failed (%s: %s)", self.k, type(e).__name__, e)
            self.psub = None

    async def _turn(self):
        now = time.monotonic()
        if self.psub is None:
            raise _Unsure("no subscription")
        if now > self.lease.valid_until - self.w.renew_margin:
            await self.w.leases.renew(self.lease)
        if self.commit is not None and self.commit.done():
            await self._settle()                  # a commit that failed raises here: reload
        msgs = await self.psub.next_batch(self.w.poll_s)
        for msg in msgs:
            await self._apply(msg)
        if self.since_ckpt >= self.w.ckpt_every or (
                self.since_ckpt and time.monotonic() - self.t_ckpt >= self.w.ckpt_interval_s):
            await self.checkpoint(wait=False)

    def _delivery(self, msg):
        """Each message the consumer delivers is counted by it (redeliveries too): one whose count
        skips ahead went somewhere this owner never saw (a consumer whose delete failed and that
        the create found, still delivering where an earlier pull left it; a consumer leader that
        changed with deliveries in flight). Its steps may be a stream's first, which no sequence
        check could miss: replay from the committed checkpoint on a new consumer instead."""
        n = msg.metadata.sequence.consumer
        if n != self.delivered + 1:
            self.w.count("delivery_gaps")
            raise _Unsure(f"the consumer's delivery #{n} came after #{self.delivered}: a delivery never reached "
                          "this owner; replaying the log")
        self.delivered = n

    async def _apply(self, msg):
        self._delivery(msg)
        seq = msg.metadata.sequence.stream
        if seq <= self.applied:            # delivered again (after ack_wait): already in the state
            self.w.count("redelivered_skipped")
            return
        if time.monotonic() > self.lease.valid_until - self.w.renew_margin:
            await self.w.leases.renew(self.lease)   # a long batch on a busy machine: renew inside it
        if not self.lease.valid(time.monotonic()):
            raise _Unsure("lease validity ran out before stepping")
        stream = msg.subject.split(".", 3)[3]
        kind, body = self.w.stepper.step(msg.data, stream, stop_at_hole=self.hole_at != (stream, seq))
        if kind == "hole":
            # a stream's step is missing before this one: delivered out of order (a consumer's
            # leader changed), or lost from the log. Replay from the committed checkpoint once;
            # if the log still lacks it, the engine refuses this step as a gap (below).
            self.hole_at = (stream, seq)
            self.w.count("hole_replays")
            raise _Unsure(f"stream {stream!r}: a step is missing before log seq {seq}; replaying the log")
        if self.hole_at == (stream, seq):
            self.w.count("log_holes")
            log.error("partition %d: stream %r: the log lacks a step before log seq %d (a hole, refused to its "
                      "client as a gap, not learned around)", self.k, stream, seq)
        if stream in self.w.stepper.streams():
            self.names.add(stream)
            self.lease.streams = max(self.lease.streams, len(self.names))
        self.applied, self.last_msg = seq, msg
        self.since_ckpt += 1
        if not self.lease.valid(time.monotonic()):
            # paused between the check and here: the answer may belong to a successor now
            self.w.count("publishes_withheld")
            raise _Unsure("lease validity ran out while stepping")
        subject = L.out_subject(stream) if kind == "pred" else L.err_subject(stream)
        # St-Sent: the wall time of publishing (an audit can hold it against the successor's takeover)
        await self.w.nc.publish(subject, body, headers={"St-Epoch": str(self.lease.epoch), "St-Worker": self.w.id,
                                                         "St-Partition": str(self.k), "St-Log-Seq": str(seq),
                                                         "St-Sent": f"{time.time():.6f}"})
        self.answered = seq
        self.w.count("published" if kind == "pred" else "refused")

    # ---- durability ---------------------------------------------------------------------
    async def checkpoint(self, wait: bool = True):
        """Snapshot the partition's streams now; store the snapshot, commit it under the fencing
        token, then ack what it covers: in a task of its own (stepping goes on meanwhile; one
        commit at a time), awaited here when ``wait``. Raises LeaseLost or _Unsure."""
        await self._settle()
        w, lease = self.w, self.lease
        if not lease.valid(time.monotonic()):
            raise _Unsure("lease validity ran out before a checkpoint")
        name = f"p{self.k}.e{lease.epoch}.s{self.applied}"
        raw = w.stepper.snapshot(self.names, self.applied, {"partition": self.k, "epoch": lease.epoch})
        self.commit = asyncio.create_task(self._commit(name, raw, self.applied, self.last_msg))
        self.last_msg, self.since_ckpt, self.t_ckpt = None, 0, time.monotonic()
        if wait:
            await self._settle()

    async def _settle(self, quietly: bool = False):
        """Wait for the commit in flight; its error raised (or, ``quietly``, only logged)."""
        task, self.commit = self.commit, None
        if task is None:
            return
        try:
            await task
        except Exception as e:  # noqa: BLE001 - quietly: the caller reloads or leaves anyway
            if not quietly:
                raise
            log.info("partition %d: checkpoint not committed (%s: %s)", self.k, type(e).__name__, e)

    async def _commit(self, name: str, raw: bytes, seq: int, last_msg):
        w, lease = self.w, self.lease
        await w.objects.put(name, raw)
        superseded = (lease.prev or {}).get("ckpt")        # the current one becomes prev: kept
        await w.leases.renew(lease, ckpt=name, seq=seq, sha=hashlib.sha256(raw).hexdigest())
        w.count("checkpoints")
        if last_msg is not None:
            await last_msg.ack()
        if superseded and superseded not in (name, lease.ckpt, (lease.prev or {}).get("ckpt")):
            # three more round trips: off the path of the next message
            task = asyncio.create_task(self._delete(superseded))
            _background.add(task)
            task.add_done_callback(_background.discard)

    async def _delete(self, name: str):
        try:
            await self.w.objects.delete(name)
        except Exception:  # noqa: BLE001 - a leftover object costs space, not correctness
            pass

    async def release(self, deadline: float | None = None):
        """Graceful hand-over (after ``run`` returned): the final checkpoint, the lease
        released, the slots freed. Broker errors (a restart's timeouts, no responders) are
        retried until ``deadline`` (monotonic; None: one try), then raised; LeaseLost (another
        owner holds it) is raised at once."""
        try:
            await self._settle(quietly=True)      # a commit that failed is redone by the final checkpoint
            while not self.lost:
                try:
                    left = None if deadline is None else deadline - time.monotonic()
                    await asyncio.wait_for(self._hand_over(), left)
                    self.w.count("released")
                    return
                except LeaseLost:
                    self.lost = True
                    raise
                except Exception as e:  # noqa: BLE001 - broker away or restarting: the lease is still ours
                    if deadline is None or time.monotonic() + 0.2 >= deadline:
                        raise
                    log.info("partition %d: release failed (%s: %s); retrying", self.k, type(e).__name__, e)
                    await asyncio.sleep(0.2)
        finally:
            await self._unsubscribe()
            self.w.stepper.drop(self.names)
            self.names = set()

    async def _hand_over(self):
        # the final checkpoint only when the state is ahead of the committed one and every step in
        # it was answered (an answer withheld mid-step is left for the successor's replay)
        if self.applied > self.lease.seq and self.answered == self.applied:
            if not self.lease.valid(time.monotonic()):
                await self.w.leases.renew(self.lease)     # CAS: succeeds only if nobody took over
            await self.checkpoint()
        await self.w.leases.release(self.lease)
