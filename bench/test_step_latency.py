"""Per-step latency of the compiled learner step (forward + traces + gradient + Adam), with
the jax dispatch floor, the hand-written limit program of the same math (bench/limits.py, GRU
stacks) and, when installed, the reference library measured in the same run."""
import jax
import numpy as np
import pytest

import streamtrace as st
from limits import make_limit_step
from timing import N_IN, N_OUT, stack_step

try:
    from reference_braintrace import AVAILABLE as REFERENCE, make_step
except ImportError:  # the reference is an optional extra
    REFERENCE = False

MODELS = [("gru", 64), ("gru", 256), ("lif", 256), ("alif", 256)]
ALGOS = ["d-rtrl", "es-d-rtrl"]
SLOTS = [None, 64]


def test_dispatch_floor(record):
    f = jax.jit(lambda x: x + 1).lower(np.zeros(N_IN, np.float32)).compile()
    x = np.zeros(N_IN, np.float32)
    record("floor", "jax dispatch floor", lambda: np.asarray(f(x)))


@pytest.mark.parametrize("slots", SLOTS, ids=["1slot", "64slots"])
@pytest.mark.parametrize("algo", ALGOS)
@pytest.mark.parametrize("kind,hidden", MODELS, ids=[f"{k}{h}" for k, h in MODELS])
def test_learner_step(record, kind, hidden, algo, slots):
    step = stack_step(kind, hidden, algo, slots)
    name = f"streamtrace {kind.upper()}-{hidden} {algo} {slots or 1} slot(s)"
    record("streamtrace", name, step, model=f"{kind}{hidden}", algorithm=algo, slots=slots or 1)


@pytest.mark.parametrize("adam", ["optax", "fused"])
@pytest.mark.parametrize("slots", SLOTS, ids=["1slot", "64slots"])
@pytest.mark.parametrize("algo", ALGOS)
@pytest.mark.parametrize("hidden", [h for k, h in MODELS if k == "gru"], ids=lambda h: f"gru{h}")
def test_limit_step(record, hidden, algo, slots, adam):
    step = make_limit_step(N_IN, hidden, N_OUT, algo, slots, adam=adam)
    record("limit", f"limit GRU-{hidden} {algo} {slots or 1} slot(s), {adam} Adam", step,
           model=f"gru{hidden}", algorithm=algo, slots=slots or 1, adam=adam)


@pytest.mark.skipif(not REFERENCE, reason="reference library braintrace not installed (pip install '.[bench]')")
@pytest.mark.parametrize("slots", SLOTS, ids=["1slot", "64slots"])
@pytest.mark.parametrize("algo", ALGOS)
@pytest.mark.parametrize("kind,hidden", MODELS, ids=[f"{k}{h}" for k, h in MODELS])
def test_reference_step(record, kind, hidden, algo, slots):
    if slots and kind != "gru":
        pytest.skip("the reference's batched step is timed for the GRU stacks only")
    try:
        step, _, _ = make_step(kind, N_IN, hidden, N_OUT, algo, batch=slots)
    except NotImplementedError as e:
        pytest.skip(str(e))
    # batch=B: braintrace's in-graph batch of B samples, the counterpart of B slots
    record("reference", f"braintrace {kind.upper()}-{hidden} {algo} {'B=' + str(slots) if slots else '1 slot'}", step,
           model=f"{kind}{hidden}", algorithm=algo, slots=slots or 1)


# Sustained load: a stream with queued steps is stepped up to engine.micro_batch (8) steps per
# call (a scan), so its throughput is the per-step cost inside such a call. Timed per step, each
# side in its own multi-step form: the learner's micro-batch, the limit in a scan, braintrace's
# step in a brainstate for_loop (its one-step call is mostly per-call overhead).
STEPS = 8
BATCHED = [(64, "es-d-rtrl", 64), (256, "es-d-rtrl", None), (64, "d-rtrl", None)]


@pytest.mark.parametrize("side", ["streamtrace", "limit", "reference"])
@pytest.mark.parametrize("hidden,algo,slots", BATCHED, ids=[f"gru{h}-{a}-{s or 1}" for h, a, s in BATCHED])
def test_steps_per_call(record, side, hidden, algo, slots):
    info = dict(model=f"gru{hidden}", algorithm=algo, slots=slots or 1, per_call=STEPS)
    where = f"{slots or 1} slot(s), {STEPS} steps per call, per step"
    if side == "streamtrace":
        step, name = stack_step("gru", hidden, algo, slots, STEPS), f"streamtrace GRU-{hidden} {algo} {where}"
    elif side == "limit":
        step = make_limit_step(N_IN, hidden, N_OUT, algo, slots, steps=STEPS)
        name, info["adam"] = f"limit GRU-{hidden} {algo} {where}, optax Adam", "optax"
    else:
        if not REFERENCE:
            pytest.skip("reference library braintrace not installed (pip install '.[bench]')")
        step, _, _ = make_step("gru", N_IN, hidden, N_OUT, algo, batch=slots, steps=STEPS)
        name = f"braintrace GRU-{hidden} {algo} {'B=' + str(slots) if slots else '1 slot'}, {STEPS} steps per call, per step"
    record(side, name, step, **info)
