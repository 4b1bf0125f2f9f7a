"""What the engine answers a client, decoded: :class:`Prediction`, :class:`EngineError` for a
refusal, and ``decode_reply`` (bytes -> either map, arrays as numpy)."""
from __future__ import annotations

import numpy as np

from .. import wire

__all__ = ["EngineError", "Prediction", "decode_reply"]


class EngineError(RuntimeError):
    """The engine refused a message. Raised by ``step``, ``recv``, ``label`` and ``get_weights``
    of :class:`~streamtrace.transport.SensorClient` and :class:`~streamtrace.cluster.ClusterClient`.
    A refused message changes nothing in the engine and uses up no sequence number.

    Parameters
    ----------
    code : the stable error code (``bad_shape``, ``not_finite``, ``overloaded``, ``no_slot``, ...;
        the full list is the README's wire table). ``repeat`` and ``gap`` reach the caller only
        for steps it numbered itself (``send(..., seq=N)``): the clients resync the rest.
    message : what is wrong, in words.
    reply : the whole error map; ``stream``, ``seq`` and ``expected`` (the number the engine
        waits for next on that stream) are also attributes (None where the engine did not say).

    Example::

        >>> e = EngineError("bad_shape", "'x' has shape [3]; the model expects [1]",
        ...                 {"type": "error", "code": "bad_shape", "stream": "a", "seq": 4, "expected": 4})
        >>> e.code, e.seq, e.expected, str(e)
        ('bad_shape', 4, 4, "bad_shape: 'x' has shape [3]; the model expects [1]")
    """

    def __init__(self, code: str, message: str, reply: dict):
        super().__init__(f"{code}: {message}")
        self.code, self.message, self.reply = code, message, reply
        self.stream, self.seq, self.expected = reply.get("stream"), reply.get("seq"), reply.get("expected")

    @classmethod
    def from_reply(cls, reply: dict) -> "EngineError":
        """The error of a decoded ``error`` map."""
        return cls(reply.get("code", "?"), reply.get("message", ""), reply)


class Prediction(dict):
    """A decoded ``prediction`` reply: a dict with ``stream``, ``seq``, ``pred``, ``loss`` (None
    during warm-up), ``step``, ``version``, ``ts``; ``.pred`` is the prediction as a numpy array.

    Parameters
    ----------
    (as a dict) the decoded reply map, ``pred`` already a numpy array.

    Example::

        >>> p = Prediction({"stream": "a", "seq": 0, "pred": np.zeros(2), "loss": None})
        >>> p.pred.shape, p["seq"]
        ((2,), 0)
    """

    @property
    def pred(self) -> np.ndarray:
        return self["pred"]


def decode_reply(raw: bytes) -> dict:
    """One answer's bytes -> a :class:`Prediction`, a ``weights`` map (params and state as arrays) or
    another map (``error``, ``label_ack``). Raises ``wire.WireError`` for bytes that are not one."""
    msg = wire.decode(raw, max_bytes=1 << 30)
    if msg["type"] == "prediction":
        msg["pred"] = wire.unpack_array(msg["pred"], "pred")
        return Prediction(msg)
    if msg["type"] == "weights":
        for part in ("params", "state"):
            msg[part] = {n: wire.unpack_array(a, n, max_elements=1 << 28) for n, a in msg.get(part, {}).items()}
    return msg
