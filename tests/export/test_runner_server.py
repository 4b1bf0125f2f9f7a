"""The jax-free runner's server (runner/, ``streamtrace-runner serve``) against ``serve``'s
engine core on the same messages: the same error codes for bad input with the state kept,
predictions alike, checkpoints crossing both ways, and the process over real sockets with
``SensorClient`` (a final checkpoint on SIGTERM, resumed on restart). The oracle is the jax
engine (``EngineCore``, the code ``serve`` runs). Tolerances: docs/devices.md ("Same answers")."""
from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from engine_helpers import answers
from streamtrace import wire
from streamtrace.engine.config import load_config
from streamtrace.engine.core import EngineCore
from streamtrace.export.write import export_learner
from streamtrace.evaluation.tasks import mackey_glass
from streamtrace_runner.bank import RunnerBank
from streamtrace_runner.core import Options, RunnerCore
from streamtrace_runner.runtime import Runner

SLOTS = 2
# serve's jax program and the IREE module round alike but for XLA's FMA contraction (always on
# where the CPU has FMA; IREE's llvm-cpu does not contract): an ulp of the float32 normaliser
# statistics, amplified by the RLS readout; measured here 1e-4 at most over 1,500 steps
AGREE = 1e-3


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    out = tmp_path_factory.mktemp("runner") / "default"
    export_learner(None, out)
    return out


def _engine(ckpt: Path | None = None, clock=None, **engine):
    over = {"engine": {"slots": SLOTS, **engine}, "publish": {"weights_every": 0}}
    if ckpt is not None:
        over["checkpoint"] = {"dir": str(ckpt), "every": 10 ** 6}
    return EngineCore(load_config(None, over), **({} if clock is None else {"clock": clock}))


def _runner(folder, ckpt: Path | None = None, clock=None, **options):
    return RunnerCore(RunnerBank(Runner(folder), SLOTS),
                      Options(slots=SLOTS, weights_every=0, checkpoint_dir=str(ckpt or ""), **options),
                      **({} if clock is None else {"clock": clock}))


def _series(n: int, start: int = 0):
    return np.asarray(mackey_glass(start + n), np.float64).reshape(-1, 1)[start:]


def _data(stream, xs, first=0):
    return [wire.data_message(stream, first + i, x) for i, x in enumerate(xs)]


def _preds(replies):
    return np.array([wire.unpack_array(r["pred"]).ravel()[0] for r in replies if r["type"] == "prediction"])


BAD = [b"\xc1", wire.encode({"v": 2, "type": "data"}), wire.encode({"type": "sing"}),
       wire.data_message("a", 5, np.zeros(3)), wire.data_message("a", 5, np.array([np.nan])),
       wire.data_message("a", 3, np.array([0.1])), wire.data_message("a", 9, np.array([0.1])),
       wire.label_message("a", 4, np.array([0.1])), wire.data_message("c", 0, np.array([0.1])),
       wire.encode({"type": "data", "stream": "a", "seq": 5, "x": wire.pack_array(np.zeros(1)), "z": 1})]


def test_bad_input_gets_serves_codes_and_keeps_the_state(folder):
    """The same refusals from both (codes, stream, expected seq), and the runner's predictions
    after them equal its own run without them, bit for bit (nothing changed its state)."""
    xs = _series(140)
    head = _data("a", xs[:5]) + _data("b", xs[:1])     # two streams hold both slots: "c" gets no_slot
    tail = _data("a", xs[5:140], first=5)
    engine, runner, clean = _engine(), _runner(folder), _runner(folder)
    got_e, got_r = (answers(core, head + BAD + tail) for core in (engine, runner))
    errors = lambda got: [(r["code"], r.get("stream"), r.get("expected")) for r in got if r["type"] == "error"]
    assert errors(got_r) == errors(got_e)
    assert [c for c, _, _ in errors(got_r)] == ["not_msgpack", "bad_version", "bad_type", "bad_shape",
                                                 "not_finite", "repeat", "gap", "bad_type", "no_slot",
                                                 "unknown_field"]
    assert runner.errors == engine.metrics.errors_by_code
    want = _preds(answers(clean, head + tail))
    assert np.array_equal(_preds(got_r), want)
    rel = np.abs(_preds(got_e) - want) / np.abs(_preds(got_e))
    assert rel.max() < AGREE


def test_weights_snapshot_names_serves_arrays(folder):
    """get_weights: the same params and predicting-state names, shapes and dtypes as serve's."""
    msgs = _data("a", _series(3)) + [wire.encode({"type": "get_weights"})]
    (*_, w_e), (*_, w_r) = answers(_engine(), msgs), answers(_runner(folder), msgs)
    for part in ("params", "state"):
        shapes = lambda w: {k: (tuple(v["shape"]), v["dtype"]) for k, v in w[part].items()}
        assert shapes(w_r) == shapes(w_e) and shapes(w_e)
    assert (w_r["slots"], w_r["streams"]) == (w_e["slots"], w_e["streams"]) == ([0], {"a": 0})
    for k in w_e["params"]:      # no learning yet (the normaliser's warm-up): the same weights
        assert np.array_equal(wire.unpack_array(w_r["params"][k]), wire.unpack_array(w_e["params"][k]))


@pytest.mark.parametrize("first", ["serve", "runner"])
def test_checkpoints_cross_over(folder, tmp_path, first):
    """A checkpoint written by one resumes in the other: the continued predictions agree with
    the writer's own continuation, and the stream goes on at its next seq."""
    xs = _series(260)
    make = {"serve": lambda ck: _engine(ck), "runner": lambda ck: _runner(folder, ck)}
    second = "runner" if first == "serve" else "serve"
    writer = make[first](tmp_path / "ck")
    answers(writer, _data("a", xs[:150]))
    writer.save_checkpoint()
    reader = make[second](tmp_path / "ck")
    assert reader.resume()["extra"]["steps"] == 150
    rest = _data("a", xs[150:], first=150)
    got, want = _preds(answers(reader, rest)), _preds(answers(writer, rest))
    assert len(got) == len(want) == 110
    assert np.max(np.abs(got - want) / np.abs(want)) < AGREE
    # the same process of the writer's kind, resumed from the same file, continues bit for bit
    again = make[first](tmp_path / "ck2")
    again.ckpt.folder.mkdir()
    (tmp_path / "ck2" / writer.ckpt.paths()[-1].name).write_bytes(writer.ckpt.paths()[0].read_bytes())
    again.resume()
    assert np.array_equal(_preds(answers(again, rest)), want)


@pytest.mark.slow      # serve's engine of the default learner compiles (~4 s), then 470 steps
def test_stats_carry_serves_keys_and_per_stream_metrics(folder):
    """After the same messages, the runner's stats have serve's keys (but serve's call sizes)
    and the same values: counters, the learner's counters, each stream's rolling metrics
    (within AGREE: the two compilers' last bits), its loss and events."""
    xs = _series(220)
    msgs = _data("a", xs[:115]) + _data("b", xs[100:220]) + [wire.data_message("a", 115, np.array([1e6]))]
    engine, runner = _engine(), _runner(folder)
    answers(engine, msgs), answers(runner, msgs)
    se, sr = wire.decode(engine.stats_message()), wire.decode(runner.stats_message())
    assert set(sr) - {"runner"} == set(se) - {"batch_sizes", "subset_sizes"}
    assert sr["stream_seasons"] == se["stream_seasons"] and set(se["stream_seasons"]) == {"a", "b"}
    for k in ("received", "accepted", "answered", "errors", "steps", "updates", "outliers", "streams", "slots_free"):
        assert sr[k] == se[k], k
    assert sr["outliers"] == 1 and sr["stream_events"] == se["stream_events"] == {"a": {"outliers": 1, "rolled_back": 0}}
    assert {k: v for k, v in sr["learner"].items()} == se["learner"]
    assert set(sr["latency_us"]) == set(se["latency_us"]) and sr["latency_us"]["max"] > 0
    for name in ("a", "b"):
        got, want = sr["stream_metrics"][name], se["stream_metrics"][name]
        assert got["n"] == want["n"] > 0 and got.get("outliers") == want.get("outliers")
        for k in ("mse", "mae", "nrmse"):
            assert abs(got[k] - want[k]) <= AGREE * want[k], (name, k)
        assert abs(sr["stream_loss"][name] - se["stream_loss"][name]) <= AGREE * se["stream_loss"][name]


@pytest.mark.slow      # serve's engine of the default learner compiles (~4 s)
def test_an_idle_stream_is_parked_and_resumes_where_it_left(folder):
    """Idle past engine.idle_timeout_s, a stream's slot goes to another stream and its state is
    parked; back in time, it continues as if it never left (bit for bit against a run where it
    never left), counted as serve's engine counts it; without parking it starts afresh."""
    now = [0.0]
    clock = lambda: now[0]
    xs = _series(50)
    alone = _preds(answers(_runner(folder), _data("a", xs)))

    def leave_and_return(core):
        now[0] = 0.0
        answers(core, _data("a", xs[:30]) + _data("b", xs[:2]))
        now[0] = 10.0
        core.evict_idle()
        answers(core, _data("c", xs[:2]) + _data("d", xs[:2]))     # both slots taken by others
        now[0] = 20.0
        core.evict_idle()
        return _preds(answers(core, _data("a", xs[30:], first=30)))
    engine, runner = _engine(clock=clock, idle_timeout_s=5.0, park_s=60.0), _runner(folder, clock=clock, idle_timeout_s=5.0)
    leave_and_return(engine)
    assert np.array_equal(leave_and_return(runner), alone[30:])
    assert len(runner.parking) == len(engine.parking) == 3          # b, c, d (a came back)
    for k in ("parked", "unparked", "park_dropped"):
        assert runner.counters[k] == engine.metrics.counters[k], k
    assert runner.counters["unparked"] == 1
    off = _runner(folder, clock=clock, idle_timeout_s=5.0, park_s=0.0)
    fresh = _preds(answers(_runner(folder), _data("a", xs[30:], first=30)))
    assert np.array_equal(leave_and_return(off), fresh) and off.counters["parked"] == 0


def test_the_runner_process_serves_sensor_client_and_checkpoints_on_sigterm(folder, tmp_path):
    """``python -m streamtrace_runner serve``: SensorClient's steps answered as the in-process
    runner answers them; SIGTERM writes the final checkpoint; a restart resumes the stream."""
    from streamtrace.transport import SensorClient
    sock = Path(tmp_path) / "r"
    cmd = [sys.executable, "-m", "streamtrace_runner", "serve", str(folder), "--router", f"ipc://{sock}",
           "--pull", "", "--pub", "", "--slots", str(SLOTS), "--checkpoint-dir", str(tmp_path / "ck")]
    xs = _series(30)
    want = _preds(answers(_runner(folder), _data("s", xs)))
    got = []
    for part in (xs[:20], xs[20:]):
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
        try:
            first = proc.stdout.readline()
            assert first.startswith("resumed from" if got else "streamtrace runner:"), first
            if got:
                assert f"at step {len(got)}" in first and "streamtrace runner:" in proc.stdout.readline()
            with SensorClient(f"ipc://{sock}", stream="s", start_seq=len(got), timeout_s=20) as c:
                got += [c.step(x).pred.ravel()[0] for x in part]
        finally:
            proc.send_signal(signal.SIGTERM)
            out, _ = proc.communicate(timeout=30)
        assert proc.returncode == 0 and f"stopped after {len(got)} steps" in out
    assert np.array_equal(np.array(got), want)


def test_a_folder_that_is_not_an_export_is_refused_in_one_line(tmp_path):
    r = subprocess.run([sys.executable, "-m", "streamtrace_runner", "serve", str(tmp_path)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "not an exported learner" in r.stderr


def test_new_streams_start_from_the_initial_state_sharing_its_frozen_weights(folder):
    # a bank of three: stream 0 on the loaded state, stream 1 on the state read again (its
    # frozen weights' device buffers shared, not copied), stream 2 never stepped; the oracle
    # is the folder's state.npz read by numpy and a runner of its own stepped once
    runner = Runner(folder)
    bank = RunnerBank(runner, 3)
    x = np.array([0.3])
    p0 = bank.step(0, x, None, True)[0]
    p1 = bank.step(1, x, None, True)[0]
    fixed = runner.manifest["fixed_from"]
    assert fixed < len(bank.slots[0])
    assert all(a is b for a, b in zip(bank.slots[0][fixed:], bank.slots[1][fixed:]))
    alone = Runner(folder).step(x[None])[0]
    assert np.array_equal(p0, alone) and np.array_equal(p1, alone)
    with np.load(Path(folder) / "state.npz", allow_pickle=False) as z:
        initial = {k: z[k] for k in z.files if k != "__meta__"}
    fresh = bank.slot_state(2)
    assert set(fresh) == set(initial)
    for name, value in initial.items():
        np.testing.assert_array_equal(fresh[name], value, err_msg=name)
    assert bank.state_dict()["stats.counters"].shape[0] == 3


def test_serving_imports_no_zipfile_logging_or_tempfile(folder):
    # resident memory (docs/devices.md "Memory"): a runner that loads its folder, serves two
    # streams and answers stats has not imported these (with what zipfile imports, ~1.8 MB of
    # a 40 MB process); a fresh interpreter, as `streamtrace-runner serve` starts
    code = ("import sys, numpy as np\n"
            "from streamtrace_runner import cli, server, wire\n"
            "from streamtrace_runner.bank import RunnerBank\n"
            "from streamtrace_runner.core import Options, RunnerCore\n"
            "from streamtrace_runner.runtime import Runner\n"
            f"core = RunnerCore(RunnerBank(Runner({str(folder)!r}), 2), Options(slots=2))\n"
            "out = [core.ingest(wire.data_message(s, 0, np.array([0.5])), b'me') for s in 'ab']\n"
            "assert [wire.decode(r[-1][2])['type'] for r in out] == ['prediction'] * 2, out\n"
            "core.stats_message()\n"
            "print(sorted(m for m in ('zipfile', 'logging', 'tempfile', 'shutil', 'lzma') if m in sys.modules))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[]"


def test_weights_message_written_slot_by_slot_equals_msgpack_of_the_stacked_arrays(folder):
    """The runner writes a weights message slot by slot into one buffer (weights_frame.py): its
    bytes equal msgpack's of the same message built from the stacked arrays' rows of the slots
    asked for (the bank's state_dict, wire.pack_array), for slots that differ (one stepped, one
    fresh), for one slot of two and for none; its digests equal those of the same rows."""
    from streamtrace_runner import wire as rwire
    from streamtrace_runner.weights import digest
    from streamtrace_runner.weights_frame import digests, encode_weights
    core = _runner(folder)
    answers(core, _data("a", _series(120)))
    names = core.weights.chosen()
    stacked = core.bank.state_dict(set(names.values()))
    assert not np.array_equal(stacked["readout.W"][0], stacked["readout.W"][1])      # the slots differ
    part = lambda p: {n[len(p):]: k for n, k in names.items() if n.startswith(p)}      # noqa: E731
    for slots in ([0, 1], [1], []):
        head = {"type": "weights", "kind": "snapshot", "version": 4, "base": None, "params": None, "state": None,
                "slots": slots, "streams": {"a": 0}}
        got = encode_weights(head, {"params": part("params."), "state": part("state.")}, core.bank, slots)
        rows = {k: v[np.asarray(slots, np.intp)] for k, v in stacked.items()}
        want = rwire.encode({**head, "params": {n: rwire.pack_array(rows[k]) for n, k in part("params.").items()},
                             "state": {n: rwire.pack_array(rows[k]) for n, k in part("state.").items()}})
        assert bytes(got) == want, slots
        assert digests(core.bank, names, slots) == {n: digest(rows[k]) for n, k in names.items()}, slots


def _rebuilt(msgs):
    """A subscriber's arrays after a snapshot and the updates after it (an update replaces the
    arrays it carries), with the last message's slots and streams."""
    held = {}
    for m in msgs:
        held = {} if m["kind"] == "snapshot" else held
        held.update({f"{p}.{n}": wire.unpack_array(a) for p in ("params", "state") for n, a in m[p].items()})
    return held, msgs[-1]["slots"], msgs[-1]["streams"]


@pytest.mark.parametrize("side", ["serve", "runner"])
def test_weights_carry_the_slots_serving_a_stream_and_rebuild_after_streams_come_and_go(folder, side):
    """A weights message holds the rows of the slots that serve a stream (``slots``; ``streams``:
    each stream's row), the same rows as the full stacked arrays; when the slots change, the
    update carries every array (the fixed weights too), so a snapshot and its updates rebuild
    exactly what a fresh snapshot holds, through a second stream's arrival and the first's
    eviction. The oracle: the side's own full state, rows picked by numpy."""
    now = [0.0]
    core = _engine(clock=lambda: now[0], idle_timeout_s=5.0) if side == "serve" else \
        _runner(folder, clock=lambda: now[0], idle_timeout_s=5.0)
    def full():                   # message name -> the side's full array (every slot)
        if side == "serve":
            return {**{f"params.{n}": np.asarray(v) for n, v in core.learner.params.items()},
                    **{f"state.{n}": np.asarray(v) for n, v in core.learner.predictor_state().items()}}
        names = core.weights.chosen()
        stacked = core.bank.state_dict(set(names.values()))
        return {n: stacked[k] for n, k in names.items()}
    got = lambda kind: wire.decode(bytes(core.weights_message(kind)))     # noqa: E731
    msgs = [got("snapshot")]
    assert (msgs[0]["slots"], msgs[0]["streams"]) == ([], {})
    assert all(wire.unpack_array(a).shape[0] == 0 for a in msgs[0]["state"].values())
    answers(core, _data("a", _series(30)))
    msgs.append(got("update"))
    assert (msgs[-1]["slots"], msgs[-1]["streams"]) == ([0], {"a": 0})
    msgs.append(got("update"))
    assert "fixed.W" not in msgs[-1]["params"], "an update for the same slots resent the fixed weights"
    now[0] = 3.0
    answers(core, _data("b", _series(20)))
    msgs.append(got("update"))
    assert (msgs[-1]["slots"], msgs[-1]["streams"]) == ([0, 1], {"a": 0, "b": 1})
    assert "fixed.W" in msgs[-1]["params"]
    now[0] = 7.0
    core.evict_idle(now[0])                   # "a" idle for 7 s: its slot freed, "b" stays
    answers(core, _data("b", _series(25)[20:], first=20))
    msgs.append(got("update"))
    held, slots, streams = _rebuilt(msgs)
    assert (slots, streams) == ([1], {"b": 0})
    snap = _rebuilt([got("snapshot")])[0]
    assert set(held) == set(snap) and all(np.array_equal(held[n], snap[n]) for n in snap)
    for n, v in full().items():
        assert np.array_equal(snap[n], v[[1]]), n
