"""Per-step latency of the learner with exact RTRL: the sensitivity propagated directly
(M = J_h M + J_theta, both Jacobians from n_h reverse-mode pullbacks) against the former
forward Jacobian over every parameter, measured side by side in the same run.

    .venv/bin/python -m pytest bench/test_rtrl_speed.py --pin-cpu 0 -q
"""
import jax
import numpy as np
import optax
import pytest
from jax.flatten_util import ravel_pytree

import streamtrace as st
from timing import step_call

N_IN, N_OUT = 1, 1


class DenseJacobianRTRL(st.etrace.RTRL):
    """The former method, kept only as the baseline: jacfwd over all parameters each step
    (one forward tangent per parameter) and M over every parameter."""

    def base_traces(self):
        h, _ = ravel_pytree(self.graph.init_hidden())
        p, _ = ravel_pytree(self.graph.init_params())
        return {"M": jax.numpy.zeros((h.size, p.size), h.dtype)}

    def _advance(self, params, hidden, traces, args):
        flat_h, unravel_h = ravel_pytree(hidden)
        flat_p, unravel_p = ravel_pytree(params)

        def T(fh, fp):
            out, new_h = self.graph.run(unravel_p(fp), unravel_h(fh), args)
            return ravel_pytree(new_h)[0], (out, new_h)

        (J_h, J_p), (out, new_h) = jax.jacfwd(T, argnums=(0, 1), has_aux=True)(flat_h, flat_p)
        return out, new_h, self.signal.forward({**traces, "M": J_h @ traces["M"] + J_p}), None

    def weight_grads(self, traces, g):
        per_hidden = {m: gg[..., s] for grp, gg in zip(self.graph.groups, g)
                      for s, m in enumerate(grp.members)}
        flat_g, _ = ravel_pytree(per_hidden)
        _, unravel_p = ravel_pytree(self.graph.init_params())
        return unravel_p(flat_g @ traces["M"])


METHODS = {"rtrl": "rtrl", "rtrl-dense-jacobian": lambda m, x: DenseJacobianRTRL(m, x)}
CASES = [("gru", 32, None, "rtrl-dense-jacobian"), ("gru", 32, None, "rtrl"),
         ("lstm", 32, None, "rtrl"), ("gru", 64, None, "rtrl"), ("gru", 32, 16, "rtrl")]


def _step_fn(kind, hidden, method, slots):
    learner = st.OnlineLearner(st.nn.Stack(kind, N_IN, hidden, N_OUT), np.zeros(N_IN, np.float32),
                               algorithm=METHODS[method], optimizer=optax.adam(1e-3), slots=slots)
    lead = () if slots is None else (slots,)
    rng = np.random.default_rng(0)
    x = rng.normal(size=lead + (N_IN,)).astype(np.float32)
    y = rng.normal(size=lead + (N_OUT,)).astype(np.float32)
    return step_call(learner, x, y)


@pytest.mark.parametrize("kind,hidden,slots,method", CASES,
                         ids=[f"{k}{h}-{s or 1}slot-{m}" for k, h, s, m in CASES])
def test_rtrl_learner_step(record, kind, hidden, slots, method):
    step = _step_fn(kind, hidden, method, slots)
    name = f"streamtrace {kind.upper()}-{hidden} {method} {slots or 1} slot(s)"
    record("rtrl", name, step, budget_s=1.0, min_rounds=30, model=f"{kind}{hidden}", algorithm=method,
           slots=slots or 1)
