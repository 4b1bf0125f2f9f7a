"""The client's numbering policy (streamtrace/transport/numbering.py) on hand-written answer sequences:
what the engine would answer, written out, and what the client must do with each."""
from __future__ import annotations

from streamtrace.transport.numbering import MAX_RESYNCS, Numbering, Sample


def _refusal(stream, seq, code, expected=None):
    out = {"type": "error", "code": code, "message": "", "stream": stream, "seq": seq}
    if expected is not None:
        out["expected"] = expected
    return out


def _sent(n: Numbering, stream: str) -> tuple[int, Sample]:
    seq = n.take(stream)
    s = Sample(b"\x80")          # the raw bytes are not looked at unless resent
    n.sent(stream, seq, s)
    return seq, s


def test_streams_are_numbered_each_on_its_own():
    n = Numbering("a", start_seq=5)
    assert [n.take(s) for s in ("a", "b", "a", "b", "c")] == [5, 0, 6, 1, 0]


def test_a_sample_refused_again_and_again_is_given_up_after_max_resyncs():
    """Two senders on one stream id: each resend is refused again; after MAX_RESYNCS resends
    the refusal reaches the caller instead of a fourth resend."""
    n = Numbering("a")
    seq, s = _sent(n, "a")
    for i in range(MAX_RESYNCS):
        out = n.settle(_refusal("a", seq, "repeat", expected=10 * (i + 1)))
        assert not out.deliver and [(st, q) for st, q, _ in out.resend] == [("a", 10 * (i + 1))]
        seq = out.resend[0][1]
        n.sent("a", seq, s)
    out = n.settle(_refusal("a", seq, "repeat", expected=99))
    assert out.deliver and out.sample is s and not out.resend
    assert n.resyncs == MAX_RESYNCS


def test_a_refusal_that_is_not_repeat_or_gap_frees_its_number():
    n = Numbering("a")
    _sent(n, "a")
    assert n.settle({"type": "prediction", "stream": "a", "seq": 0}).deliver
    seq, s = _sent(n, "a")
    out = n.settle(_refusal("a", seq, "not_finite", expected=1))
    assert out.deliver and out.sample is s and n.take("a") == 1


def test_a_caller_numbered_refusal_and_a_labels_answer_are_handed_over_untouched():
    n = Numbering("a")
    seq, s = _sent(n, "a")
    assert n.settle(_refusal("a", 7, "gap", expected=0)).deliver          # seq 7 was not numbered here
    assert n.settle(_refusal("a", seq, "unknown_label")).deliver          # a label's, not the data step's
    assert n.settle({"type": "label_ack", "stream": "a", "seq": seq}).deliver
    assert n.in_flight == {("a", seq): s} and n.resyncs == 0


def test_a_step_with_no_answer_is_forgotten_and_no_longer_holds_its_stream():
    n = Numbering("a")
    _, s = _sent(n, "a")
    assert n.unconfirmed("a")
    n.forget("a", s)
    assert not n.unconfirmed("a") and n.counts["unanswered"] == 1
    assert n.settle({"type": "prediction", "stream": "a", "seq": 0}).sample is None   # a late answer
