"""When a server's loop lets a step's replies go before its update (``serve``'s
``engine.reply_first``, the runner's ``--no-reply-first`` to turn it off), and whether a learner
allows it at all (``allowed``).

Where a prediction does not depend on its step's update (supervised mode, or forecast with
``learning.forecast_before_update``), the prediction twin (a program computing only the
prediction and the loss, the state untouched) answers first and the step runs after the reply
has left. Both servers, ``serve``'s (engine/server.py) and the runner's (server.py), decide when
with this module.

A reply sent before the update gains its sensor the update's time only if the update is done
before the engine's next message comes: then the update ran while the reply and the next
request crossed the network. A sensor that sends its next request sooner than that (back to
back, over a fast link, on a busy machine) waits for the update anyway, and the reply-first
call's prediction program (an extra compiled call) only adds to its round trip. So the loop
replies first only when nothing waits on its sockets, and watches the outcome: a message
found waiting when a reply-first call ends means the update held it up, and the next 1, 2,
4 .. ``MAX_BACKOFF`` calls reply after their update (the way publication skips back off in
server.py); a reply-first call that held nothing up ends the backing off.
"""
from __future__ import annotations

__all__ = ["ReplyFirst", "MAX_BACKOFF", "allowed"]

MAX_BACKOFF = 64


def allowed(learning: dict) -> bool:
    """Whether a learner's prediction is made before its step's update (``learning``: the config's
    ``learning`` section, as a dict): supervised mode, or forecast with
    ``forecast_before_update``. Otherwise the forecast uses the weights the update makes.

    >>> allowed({"mode": "supervised"}), allowed({"mode": "forecast", "forecast_before_update": True})
    (True, True)
    >>> allowed({"mode": "forecast"})
    False
    """
    return learning.get("mode") == "supervised" or bool(learning.get("forecast_before_update", False))


class ReplyFirst:
    """Per loop turn, whether its step replies first (``sender``), and the backing off while
    updates hold up the next messages (``outcome``); ``enabled`` False: never.

    >>> rf = ReplyFirst(True)
    >>> rf.sender(print, quiet=True) is print, rf.sender(print, quiet=False)
    (True, None)
    >>> rf.outcome(held_up=True); rf.sender(print, quiet=True), rf.sender(print, quiet=True) is print
    (None, True)
    """

    def __init__(self, enabled: bool):
        self.enabled = enabled
        self._skip = 0          # calls left to reply after their update
        self._backoff = 0       # the length of the last backing off

    def sender(self, send, quiet: bool):
        """``send`` for the calls of this loop turn to reply first with, or None: nothing may
        wait on the sockets (``quiet``), and no backing off."""
        if not self.enabled or not quiet:
            return None
        if self._skip:
            self._skip -= 1
            return None
        return send

    def outcome(self, held_up: bool):
        """After a call that replied first: whether a message was waiting when it ended."""
        if held_up:
            self._backoff = min(2 * self._backoff or 1, MAX_BACKOFF)
            self._skip = self._backoff
        else:
            self._backoff = 0
