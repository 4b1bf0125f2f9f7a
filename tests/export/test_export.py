"""`streamtrace export` and its jax-free runner (streamtrace.export): the exported step against
the jax learner built from the same config (the default float64 learner, a float32 GRU), the
state map against the learner's own packing, checkpoints crossing both ways, the runner
without jax, refusals in one line, and the aarch64 module under qemu-user against the x86-64
one. Tolerances: measured on this machine, stated in docs/devices.md."""
from __future__ import annotations

from paths import ROOT
import json
import math
import os
import shutil
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import numpy as np
import pytest

from streamtrace.checkpoints import read_checkpoint
from streamtrace.export.learner import learner_from_config
from streamtrace.export.program import compile_program
from streamtrace.export.runner import Runner, RunnerError
from streamtrace.export.state_map import StateMap
from streamtrace.export.tanh64 import rewrite_tanh64
from streamtrace.export.write import export_learner
from streamtrace.evaluation.tasks import mackey_glass

GRU = '[model]\nstack = "gru"\nn_hidden = 16\n'
CONFIGS = {"gru": GRU, "lif": '[model]\nstack = "lif"\nn_hidden = 16\n',
           "lstm64": '[model]\nstack = "lstm"\nn_hidden = 16\nprecision = 64\n'}
WARMUP = 100          # the default learner's normaliser warm-up: its model is not used before
# `make arm` fetches IREE's aarch64 runtime of the venv's version
IREE_RUN_ARM = ROOT / f".cache/iree-aarch64-{version('iree-base-runtime')}/iree/_runtime_libs/iree-run-module"
ARM_SYSROOT = Path("/usr/aarch64-linux-gnu")


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """export(name, target): the folder of the default learner or the GRU, exported once."""
    done = {}

    def export(name: str, target: str = "host") -> Path:
        if (name, target) not in done:
            folder = tmp_path_factory.mktemp(f"{name}-{target}")
            config = None
            if name in CONFIGS:
                config = folder / f"{name}.toml"
                config.write_text(CONFIGS[name])
            export_learner(config, folder / "out", target)
            done[name, target] = folder / "out"
        return done[name, target]
    return export


def _learner(name: str, folder: Path):
    return learner_from_config(None if name == "default" else folder.parent / f"{name}.toml")[1]


def _side_by_side(learner, runner, xs):
    """Both stepped on xs (one slot): (jax predictions, runner predictions)."""
    shape = (1,) + learner.x_shape
    got = [(np.asarray(learner.step(np.full(shape, x)).prediction).ravel()[0],
            runner.step(np.full(shape, x))[0].ravel()[0]) for x in xs]
    return np.array(got).T


def _relative(a, b):
    return np.abs(a - b) / np.maximum(np.abs(a), 1e-300)


def _nrmse(pred, target):
    return math.sqrt(np.mean((pred - target) ** 2)) / np.std(target)


# ---- the f64 tanh without libm ---------------------------------------------------------

def test_tanh64_rewrite_equals_numpy_tanh():
    """A float64 tanh program, rewritten (tanh64.py) and compiled for the host, against
    numpy's tanh over small, medium and huge arguments, zeros, infinities and NaN. Measured
    here: 3.7e-16 relative at most (2 ulp)."""
    import iree.runtime as rt
    x = np.concatenate([np.linspace(-25, 25, 20001), np.geomspace(1e-300, 1e-3, 500),
                        -np.geomspace(1e-300, 1e-3, 500), [0.0, -0.0, np.inf, -np.inf, 710.0, -710.0]])
    src = (f"module @m {{\n  func.func public @main(%arg0: tensor<{x.size}xf64>) -> tensor<{x.size}xf64> {{\n"
           f"    %0 = stablehlo.tanh %arg0 : tensor<{x.size}xf64>\n    return %0 : tensor<{x.size}xf64>\n  }}\n}}")
    text, count = rewrite_tanh64(src)
    assert count == 1 and "stablehlo.tanh" not in text
    ctx = rt.SystemContext(config=rt.Config("local-sync"))
    module = rt.VmModule.copy_buffer(ctx.instance, compile_program(text, "host"))
    ctx.add_vm_module(module)
    got = ctx.modules[module.name]["main"](x).to_host()
    want = np.tanh(x)
    assert np.max(_relative(want[want != 0], got[want != 0])) < 1e-15
    assert np.array_equal(np.signbit(got), np.signbit(want))         # -0.0 stays -0.0
    nan = ctx.modules[module.name]["main"](np.full(x.size, np.nan)).to_host()
    assert np.isnan(nan).all()


# ---- the folder -------------------------------------------------------------------------

def test_state_map_places_every_array_where_the_learner_packs_it(exported):
    """The initial checkpoint through the state map gives the learner's own packed buffers, bit
    for bit, and back (the learner's packing, learner/packing.py, is the oracle)."""
    folder = exported("default")
    learner = _learner("default", folder)
    manifest = json.loads((folder / "manifest.json").read_text())
    smap = StateMap.load(folder, manifest["buffers"])
    arrays, header = read_checkpoint(folder / "state.npz")
    assert header["signature"] == json.loads(json.dumps(learner.signature()))
    built = smap.buffers(arrays)
    for mine, theirs in zip(built, learner.buffers, strict=True):
        assert mine.dtype == theirs.dtype and np.array_equal(mine, np.asarray(theirs))
    named = smap.named(built)
    assert set(named) == set(learner.state_dict())
    for k, v in learner.state_dict().items():
        assert np.array_equal(named[k], v, equal_nan=True), k


def test_manifest_names_the_program(exported):
    folder = exported("gru")
    m = json.loads((folder / "manifest.json").read_text())
    assert m["target"] == "host" and m["precision"] == 32 and m["config"]["model"]["stack"] == "gru"
    assert not {"security", "bridge", "sockets"} & set(m["config"])      # no key files or passwords
    assert m["inputs"]["x"] == [[1, 1], "<f4"] and m["outputs"]["prediction"] == [1, 1]
    assert {"jax", "iree-base-compiler", "numpy", "streamtrace"} <= set(m["versions"])
    assert set(m["sha256"]) == {"step.vmfb", "predict.vmfb", "state.npz", "state_map.npz"}
    assert sorted(m["programs"]) == ["predict", "step"] and m["label_delay"] == 0      # one slot: no reset
    assert m["programs"]["predict"]["outputs"] == [m["output"]]


# ---- the runner against the jax learner -------------------------------------------------

@pytest.mark.slow
def test_runner_equals_the_default_learner(exported):
    """The default learner (float64, reservoir + GRU beside it, RLS readout, experts,
    normaliser) over 600 Mackey-Glass steps. Before its normaliser's warm-up the model is
    not used and the runner equals jax bit for bit (measured); after it the two compilers'
    last-bit differences (a 200-unit product summed in another order) pass through an RLS
    readout started at P = I / 1e-8: measured 1.0e-4 relative at most (median 4.7e-8), NRMSE
    equal to 6.0e-6 relative. The runner's readout P stays symmetric bit for bit, as its
    column-wise P r (learner/symmetric.py) takes it to be."""
    folder = exported("default")
    xs = mackey_glass(601)
    runner = Runner(folder)
    ref, got = _side_by_side(_learner("default", folder), runner, xs[:600])
    assert np.max(_relative(ref[:WARMUP], got[:WARMUP])) < 1e-13
    assert np.max(_relative(ref, got)) < 1e-3
    a, b = _nrmse(ref[-400:], xs[201:601]), _nrmse(got[-400:], xs[201:601])
    assert abs(a - b) / a < 1e-4
    P = runner.state_dict()["readout.P"]
    np.testing.assert_array_equal(P, np.swapaxes(P, -1, -2))


def test_the_runner_screens_a_glitch_as_the_learner_does(exported):
    """The exported default learner keeps its outlier screen: a 1e40 sample after 300 clean
    ones is flagged on that step only (``runner.events``), and the runner goes on with finite
    predictions, as the jax learner does."""
    folder = exported("default")
    runner, learner = Runner(folder), _learner("default", folder)
    xs = mackey_glass(320)
    xs[300] = 1e40
    flags, preds = [], []
    for x in xs:
        prediction, _, _ = runner.step(np.array([[x]]))
        flags.append(bool(runner.events["outlier"][0]))
        preds.append(prediction)
        assert bool(np.asarray(learner.step(np.array([[x]])).outlier).any()) == flags[-1]
    assert np.flatnonzero(flags).tolist() == [300] and np.isfinite(preds).all()


@pytest.mark.parametrize("name, tolerance", [("gru", 1e-4), ("lif", 1e-4), ("lstm64", 1e-12)])
def test_runner_equals_the_learner(exported, name, tolerance):
    """300 Mackey-Glass steps, D-RTRL, Adam: GRU-16 float32 (measured 1.5e-6 relative at
    most), a spiking LIF-16 float32 (9.9e-6) and LSTM-16 float64 (4.1e-15)."""
    folder = exported(name)
    xs = mackey_glass(300)
    ref, got = _side_by_side(_learner(name, folder), Runner(folder), xs)
    assert np.max(_relative(ref, got)) < tolerance
    assert np.max(np.abs(ref)) > 0.05         # it predicts something, not zeros on both sides


def test_runner_equals_eight_slots_with_masks(tmp_path):
    """--slots 8: per-slot GRU models stepped in pairs (a loop of run-time length with a branch
    per pair), some slots inactive each step: predictions measured 6.5e-7 relative at most,
    the applied flags the same."""
    config = tmp_path / "gru.toml"
    config.write_text(GRU)
    export_learner(config, tmp_path / "out", "host", slots=8)
    learner = learner_from_config(config, slots=8)[1]
    runner = Runner(tmp_path / "out")
    xs = mackey_glass(200)
    for t in range(60):
        x = np.array([[xs[(t + 7 * k) % 200]] for k in range(8)], np.float32)
        active = np.array([(t + k) % 3 != 0 for k in range(8)])
        want = learner.step(x, active=active)
        prediction, _, applied = runner.step(x, active=active)
        assert np.max(np.abs(prediction - want.prediction)) <= 1e-5 * np.max(np.abs(want.prediction)), t
        assert np.array_equal(applied, np.asarray(want.applied)), t
    assert applied.any() and not applied.all()


def test_checkpoints_cross_both_ways(exported, tmp_path):
    """A runner checkpoint restores into the jax learner with the same arrays, bit for bit, and
    a learner checkpoint starts the runner where the learner was; both then predict alike."""
    folder = exported("gru")
    xs = mackey_glass(80)
    runner = Runner(folder)
    for x in xs[:40]:
        runner.step(np.full((1, 1), x))
    runner.save(tmp_path / "runner.npz")
    learner = _learner("gru", folder)
    learner.restore(tmp_path / "runner.npz")
    mine = runner.state_dict()
    for k, v in learner.state_dict().items():
        assert np.array_equal(v, mine[k], equal_nan=True), k
    ref, got = _side_by_side(learner, runner, xs[40:])
    assert np.max(_relative(ref, got)) < 1e-4

    learner.save(tmp_path / "learner.npz", extra={"step": 80})
    back = Runner(folder, state=tmp_path / "learner.npz")
    assert back.steps == 80
    for k, v in learner.state_dict().items():
        assert np.array_equal(v, back.state_dict()[k], equal_nan=True), k


def test_runner_imports_no_jax(exported):
    """The runner in a process of its own: it steps, and neither jax nor brainstate is loaded."""
    folder = exported("gru")
    code = ("import sys, numpy as np\nfrom streamtrace.export.runner import Runner\n"
            f"r = Runner({str(folder)!r})\nfor i in range(3): p = r.step(np.array([[0.1 * i]]))\n"
            "print(p[0].shape, sorted(m for m in ('jax', 'jaxlib', 'brainstate') if m in sys.modules))")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "(1, 1) []"


def test_runner_refuses_a_damaged_folder_and_bad_input(exported, tmp_path):
    folder = tmp_path / "copy"
    shutil.copytree(exported("gru"), folder)
    runner = Runner(folder)
    with pytest.raises(RunnerError, match=r"x has shape \(3,\), expected \(1, 1\)"):
        runner.step(np.zeros(3))
    raw = bytearray((folder / "step.vmfb").read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    (folder / "step.vmfb").write_bytes(bytes(raw))
    with pytest.raises(RunnerError, match="step.vmfb does not match the manifest's sha256"):
        Runner(folder)


def test_export_cli_refuses_in_one_line(tmp_path):
    """A bad config: exit 2, one line naming the key (a part IREE cannot compile:
    test_export_catalogue.py)."""
    bad = tmp_path / "bad.toml"
    bad.write_text('[model]\nstack = "nope"\n')
    for config, start in ((bad, "config error: model.stack:"),):
        out = subprocess.run([sys.executable, "-m", "streamtrace", "export", "--config", str(config), "--out",
                              str(tmp_path / "out")], capture_output=True, text=True, timeout=300, cwd=ROOT)
        assert out.returncode == 2, out.stderr
        lines = [line for line in out.stderr.splitlines() if line.strip()]
        assert len(lines) == 1 and lines[0].startswith(start), out.stderr
    assert not (tmp_path / "out" / "manifest.json").exists()


# ---- 64-bit ARM under qemu-user ---------------------------------------------------------

def _qemu_steps(folder: Path, xs, work: Path):
    """The aarch64 module of ``folder`` stepped on xs by IREE's aarch64 iree-run-module under
    qemu-aarch64, the state carried from one call to the next as .npy files: (the output
    vectors, the last state as checkpoint arrays)."""
    m = json.loads((folder / "manifest.json").read_text())
    arrays, _ = read_checkpoint(folder / "state.npz")
    smap = StateMap.load(folder, m["buffers"])
    state = smap.buffers(arrays)
    (x_shape, x_dt), y, active, learn = (m["inputs"][k] for k in ("x", "y", "active", "learn"))
    out = []
    for x in xs:
        args = state + [np.full(x_shape, x, x_dt), np.zeros(*y), np.ones(*active), np.ones(*learn)]
        flags = []
        for i, a in enumerate(args):
            np.save(work / f"in{i}.npy", a)
            flags.append(f"--input=@{work / f'in{i}.npy'}")
        flags += [f"--output=@{work / f'out{i}.npy'}" for i in range(len(state) + 1)]
        run = subprocess.run(["qemu-aarch64", "-L", str(ARM_SYSROOT), str(IREE_RUN_ARM), f"--module={folder}/step.vmfb",
                              "--device=local-sync", "--function=main", *flags], capture_output=True, text=True,
                             timeout=120)
        assert run.returncode == 0, run.stderr[-2000:]
        state = [np.load(work / f"out{i}.npy") for i in range(len(state))]
        out.append(np.load(work / f"out{len(state)}.npy"))
    return np.array(out), smap.named(state)


@pytest.mark.slow
@pytest.mark.parametrize("name, tolerance", [("default", 1e-13), ("gru", 5e-5)])
def test_aarch64_under_qemu_equals_x86_64(exported, tmp_path, name, tolerance):
    """The aarch64 module (float64 default with its tanh made libm-free; float32 GRU) run by
    IREE's own aarch64 runtime under qemu-user, 20 steps, against the generic x86-64 module
    run by the runner here. Measured: predictions 3.2e-16 relative (default, its warm-up
    steps) and 7.7e-6 (GRU); every float state array within 8.0e-7 of its largest value
    (aarch64 fuses multiply-adds that generic x86-64 rounds twice: the float32 normaliser's
    last bits differ and reach the float64 traces)."""
    if shutil.which("qemu-aarch64") is None or not (ARM_SYSROOT / "lib/libstdc++.so.6").exists():
        pytest.skip("qemu-aarch64 or the arm64 C/C++ runtimes are not installed (`make arm` installs qemu-user, "
                    "libc6-arm64-cross, libstdc++6-arm64-cross; `make test` runs it)")
    if not IREE_RUN_ARM.exists():
        pytest.skip(f"{IREE_RUN_ARM.relative_to(ROOT)} missing: `make arm` fetches IREE's aarch64 runtime wheel")
    xs = mackey_glass(20)
    arm, arm_state = _qemu_steps(exported(name, "aarch64"), xs, tmp_path)
    runner = Runner(exported(name, "x86_64"))
    steps = [runner.step(np.full((1, 1), x)) for x in xs]
    x86 = np.array([p.ravel()[0] for p, _, _ in steps])
    worst = max((np.max(np.abs(v - arm_state[k])) / np.max(np.abs(v)) for k, v in runner.state_dict().items()
                 if v.dtype.kind == "f" and v.size and np.any(v)), default=0.0)
    print(f"{name}: aarch64 vs x86-64 predictions {np.max(_relative(x86, arm[:, 0])):.2g} relative, "
          f"state arrays within {worst:.2g} of their largest value")     # (measured: docs/devices.md)
    assert np.max(_relative(x86, arm[:, 0])) < tolerance
    assert np.array_equal(np.isnan([loss[0] for _, loss, _ in steps]), np.isnan(arm[:, 1]))
    for k, v in runner.state_dict().items():
        if v.dtype.kind != "f":
            assert np.array_equal(v, arm_state[k]), k            # counters: the same steps, updates, skips
        elif v.size and np.any(v):
            assert np.max(np.abs(v - arm_state[k])) <= 1e-5 * np.max(np.abs(v)), k
