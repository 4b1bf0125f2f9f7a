"""When the serve loop lets a call's replies go before its update (``engine.reply_first``).

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

__all__ = ["ReplyFirst", "MAX_BACKOFF"]

MAX_BACKOFF = 64


class ReplyFirst:
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
