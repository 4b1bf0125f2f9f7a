"""Limit programs: the learner's step for a GRU stack written by hand as ONE jax function.

The yardstick for the compiled step (bench/test_step_latency.py times both in one run; the
results table's "x limit" column is step / limit). The math is exactly what
``OnlineLearner(Stack("gru", n_in, H, n_out), algorithm=..., optimizer=optax.adam(lr))``
computes in supervised mode, and tests/etrace/test_limit_programs.py checks that the weights agree:

    xh = [x, h]     z = sigmoid(xh Wz + bz)     r = sigmoid(xh Wr + br)
    xn = [x, r h]   n = tanh(xn Wn + bn)        h' = (1 - z) h + z n     out = h' Wo + bo
    L  = mean over slots of mean_o (out - y)^2,  g = dL/dh' = dL/dout Wo^T

    D = 1 - z,  F_z = (n - h) z (1 - z),  F_n = z (1 - n^2)     (paths through matmuls cut)
    D-RTRL:     eps' = D eps + x F  (per slot, per weight: (I, H)),  dW = sum_b g eps'
    ES-D-RTRL:  xbar' = a xbar + x,  fbar' = a D fbar + (1 - a) F,  dW = xbar'^T (g fbar')
    r (reaches h only through Wn's input): its one-step gradient with h held fixed;
    Wo, bo (the readout): their exact instantaneous gradient; then Adam on every weight.

What the learner does on top (finite guards, counters, prequential and rolling metrics,
slot masks) is left out: the limit is the arithmetic alone. Layout choices a hand-writer
would make: a constant 1 appended to the input carries the bias, so a bias is one more row
of its weight and of its trace; the z and r gates side by side as one (I+H+1, 2H) matrix
(one matmul, no slice copies), the n gate as an (I+H+1, H) matrix, the readout as (H+1, O);
the z and n traces as one array, the slot axis first; few arrays cross the call (each costs microseconds on a small CPU), and the state is
donated, so traces and moments are updated in place.
No limit is written for the LIF/ALIF stacks.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax

from streamtrace.learner.xla_options import step_compiler_options

__all__ = ["GRU_PARAMS", "fused_adam", "make_limit_fn", "init_limit_state", "to_limit_weights",
           "from_limit_weights", "make_limit_step"]

# the learner's parameter names for Stack("gru", ...), the order of the limit's weight tuple
GRU_PARAMS = ("cell.z.W", "cell.z.b", "cell.r.W", "cell.r.b", "cell.n.W", "cell.n.b", "out.W", "out.b")


def fused_adam(lr, b1=0.9, b2=0.999, eps=1e-8):
    """Adam as one element-wise expression per weight, in optax's arithmetic (bias-corrected
    moments, eps outside the square root); ``update`` returns the new weights directly."""
    def init(params):
        zeros = jax.tree_util.tree_map(jnp.zeros_like, params)
        return jnp.zeros((), jnp.int32), zeros, jax.tree_util.tree_map(jnp.zeros_like, params)

    def update(grads, state, params):
        count, mu, nu = state
        count = count + 1
        mu = jax.tree_util.tree_map(lambda m, g: b1 * m + (1 - b1) * g, mu, grads)
        nu = jax.tree_util.tree_map(lambda v, g: b2 * v + (1 - b2) * g * g, nu, grads)

        def step(p, m, v):
            c1 = (1 - b1 ** count).astype(p.dtype)
            c2 = (1 - b2 ** count).astype(p.dtype)
            return p - lr * (m / c1) / (jnp.sqrt(v / c2) + eps)
        return jax.tree_util.tree_map(step, params, mu, nu), (count, mu, nu)
    return init, update


def _adam(kind, lr):
    if kind == "optax":
        opt = optax.adam(lr)

        def update(grads, state, params):
            updates, state = opt.update(grads, state, params)
            return optax.apply_updates(params, updates), state
        return opt.init, update
    if kind == "fused":
        return fused_adam(lr)
    raise ValueError(f"adam must be 'optax' or 'fused'; got {kind!r}")


def make_limit_fn(n_in: int, algorithm: str, *, decay: float = 0.9, lr: float = 1e-3, adam: str = "optax"):
    """``fn(state, x, y) -> (state, prediction)`` for B slots: x (B, n_in), y (B, n_out).
    ``state = ((zr, n, readout), opt_state, h, traces)``, see ``init_limit_state``."""
    if algorithm not in ("d-rtrl", "es-d-rtrl"):
        raise ValueError(f"algorithm must be 'd-rtrl' or 'es-d-rtrl'; got {algorithm!r}")
    _, opt_update = _adam(adam, lr)
    a = decay

    def fn(state, x, y):
        (wzr, wn, ro), opt_state, h, tr = state       # [W; b] of z|r (I+H+1, 2H), of n, of the readout
        B, H, one = x.shape[0], h.shape[-1], jnp.ones((x.shape[0], 1), x.dtype)
        xh = jnp.concatenate([x, h, one], axis=-1)     # a constant 1 carries the bias
        zr = jax.nn.sigmoid(xh @ wzr)
        z, r = zr[:, :H], zr[:, H:]
        xn = jnp.concatenate([x, r * h, one], axis=-1)
        n = jnp.tanh(xn @ wn)
        h1 = (1 - z) * h + z * n
        out = h1 @ ro[:-1] + ro[-1]
        dout = 2.0 * (out - y) / (B * out.shape[-1])
        g = dout @ ro[:-1].T                            # dL/dh'
        d, fz, fn_ = 1 - z, (n - h) * z * (1 - z), z * (1 - n * n)
        # r: one step of backprop, h held fixed: dL/dyr = (dL/dyn Wn_h^T) h r (1 - r)
        dyr = ((g * fn_) @ wn[n_in:-1].T) * h * r * (1 - r)
        xs, fs = jnp.stack([xh, xn], 1), jnp.stack([fz, fn_], 1)       # (B, 2, I+H+1), (B, 2, H)
        if algorithm == "d-rtrl":
            eps = d[:, None, None, :] * tr + xs[..., None] * fs[:, :, None, :]
            g_zn = jnp.sum(g[:, None, None, :] * eps, axis=0)   # one pass; einsum would transpose eps
            tr = eps
        else:
            xbar, fbar = tr
            xbar, fbar = a * xbar + xs, a * d[:, None, :] * fbar + (1 - a) * fs
            g_zn = jnp.einsum("bki,bko->kio", xbar, g[:, None, :] * fbar)
            tr = (xbar, fbar)
        g_zr = jnp.concatenate([g_zn[0], xh.T @ dyr], axis=1)
        g_ro = jnp.concatenate([h1.T @ dout, jnp.sum(dout, 0)[None]])
        weights, opt_state = opt_update((g_zr, g_zn[1], g_ro), opt_state, (wzr, wn, ro))
        return (weights, opt_state, h1, tr), out
    return fn


def to_limit_weights(params: dict):
    """``{learner parameter name: array}`` (GRU_PARAMS) -> (zr (I+H+1, 2H), n (I+H+1, H), readout (H+1, O))."""
    wb = {k: jnp.concatenate([params[f"cell.{k}.W"], params[f"cell.{k}.b"][None]]) for k in "zrn"}
    return (jnp.concatenate([wb["z"], wb["r"]], axis=1), wb["n"],
            jnp.concatenate([params["out.W"], params["out.b"][None]]))


def from_limit_weights(weights) -> dict:
    wzr, wn, ro = weights
    H = wn.shape[1]
    wb = {"z": wzr[:, :H], "r": wzr[:, H:], "n": wn}
    out = {f"cell.{k}.W": wb[k][:-1] for k in "zrn"}
    out.update({f"cell.{k}.b": wb[k][-1] for k in "zrn"})
    out.update({"out.W": ro[:-1], "out.b": ro[-1]})
    return out


def init_limit_state(params: dict, n_slots: int, algorithm: str, *, lr: float = 1e-3, adam: str = "optax"):
    """The limit's state from ``{learner parameter name: array}`` (GRU_PARAMS), zero hidden
    state and traces for ``n_slots`` slots."""
    weights = to_limit_weights(params)
    opt_init, _ = _adam(adam, lr)
    dt, (n_x, hidden) = weights[1].dtype, weights[1].shape
    h = jnp.zeros((n_slots, hidden), dt)
    if algorithm == "d-rtrl":
        tr = jnp.zeros((n_slots, 2, n_x, hidden), dt)
    else:
        tr = (jnp.zeros((n_slots, 2, n_x), dt), jnp.zeros((n_slots, 2, hidden), dt))
    return weights, opt_init(weights), h, tr


def random_gru_params(n_in: int, hidden: int, n_out: int, seed: int = 0, dtype=np.float32) -> dict:
    """Weights drawn like the Stack's (uniform +-1/sqrt(fan_in), zero biases)."""
    rng = np.random.default_rng(seed)
    n_xh = n_in + hidden
    u = lambda shape, fan: rng.uniform(-fan ** -0.5, fan ** -0.5, shape).astype(dtype)
    p = {f"cell.{k}.W": u((n_xh, hidden), n_xh) for k in "zrn"}
    p.update({f"cell.{k}.b": np.zeros(hidden, dtype) for k in "zrn"})
    p.update({"out.W": u((hidden, n_out), hidden), "out.b": np.zeros(n_out, dtype)})
    return p


def make_limit_step(n_in: int, hidden: int, n_out: int, algorithm: str, slots: int | None = None, *,
                    adam: str = "optax", donate: bool = True, seed: int = 0, steps: int = 1):
    """``step()``: one limit step on fixed random x/y (numpy, as the benchmark feeds the learner),
    waiting for the prediction, as bench/test_step_latency.py times the learner. ``steps`` > 1:
    that many steps per call, a scan over queued inputs (as the learner's micro-batch)."""
    n = slots or 1
    fn = make_limit_fn(n_in, algorithm, adam=adam)
    if steps > 1:
        one = fn
        fn = lambda state, xs, ys: jax.lax.scan(lambda s, xy: one(s, *xy), state, (xs, ys))  # noqa: E731
    state = init_limit_state(random_gru_params(n_in, hidden, n_out, seed), n, algorithm, adam=adam)
    state = jax.tree_util.tree_map(lambda v: jnp.array(v, copy=True), state)  # donated: no shared zeros
    rng = np.random.default_rng(seed)
    lead = (steps,) if steps > 1 else ()
    x = rng.normal(size=lead + (n, n_in)).astype(np.float32)
    y = rng.normal(size=lead + (n, n_out)).astype(np.float32)
    # compiled with the default learner's XLA options (st.adam: no per-leaf guards, any slot
    # count): the ratio compares programs, not settings
    compiled = jax.jit(fn, donate_argnums=(0,) if donate else ()).lower(state, x, y).compile(
        step_compiler_options())
    box = [state]

    def step():
        box[0], out = compiled(box[0], x, y)
        return np.asarray(out)
    step.compiled = compiled
    return step
