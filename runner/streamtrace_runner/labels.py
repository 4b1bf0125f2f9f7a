"""Delayed labels in the runner (``learning.label_delay``): which step a ``label`` message
names, and the refusal of one that cannot be applied, in ``serve``'s codes and words.

A stream keeps the seqs of its last ``label_delay`` data messages (``window``); a label for one
of them is applied by the exported label program to the gradient that step kept (``age``: how
many data messages came after it). The program answers a status: 0 applied, else a code of
``CODES`` and the state unchanged.
"""
from __future__ import annotations

from collections import deque

__all__ = ["CODES", "window", "age_of", "refusal"]

CODES = {1: "unknown_label", 2: "label_too_late", 3: "already_labelled", 4: "not_finite"}

# the label program's status in a stream's terms (the learner counts steps back, users see seqs)
_WHY = {1: "data message seq {seq} left nothing to label (it did not learn: mode 'predict', or a step "
           "that was skipped)",
        2: "seq {seq}: the step {age} steps back is beyond label_delay",
        3: "seq {seq} was already labelled",
        4: "seq {seq}: label contains NaN or Inf"}


def window(label_delay: int, seqs=()):
    """A stream's recent data seqs (None: the learner takes no delayed labels).

    >>> list(window(2, [4, 5, 6])), window(0)
    ([5, 6], None)
    """
    return deque(seqs, maxlen=label_delay) if label_delay else None


def age_of(recent: deque, seq: int, stream: str):
    """(age, None) of the data message ``seq`` among ``recent``, or (None, (code, message)):
    label_too_late once it left the window, unknown_label for a seq the stream never sent.

    >>> age_of(deque([3, 4, 5], maxlen=3), 4, "a")
    (1, None)
    >>> age_of(deque([3, 4, 5], maxlen=3), 1, "a")[1][0]
    'label_too_late'
    """
    if seq in recent:
        return len(recent) - 1 - list(recent).index(seq), None
    if len(recent) == recent.maxlen and seq < recent[0]:
        return None, ("label_too_late", f"stream '{stream}': the label of seq {seq} came after {recent.maxlen} "
                      f"or more later data messages (learning.label_delay = {recent.maxlen})")
    return None, ("unknown_label", f"stream '{stream}': the label of seq {seq} has no data message with "
                  f"seq {seq} (yet)")


def refusal(status: int, stream: str, seq: int, age: int) -> tuple:
    """(code, message) of the label program's ``status`` (not 0).

    >>> refusal(3, "a", 7, 0)
    ('already_labelled', "stream 'a': seq 7 was already labelled")
    """
    return CODES[status], f"stream '{stream}': " + _WHY[status].format(seq=seq, age=age)
