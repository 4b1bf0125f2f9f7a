"""Reference timings: one online learning step of the ``braintrace`` library (PyPI, optional).

The benchmark suite times streamtrace and braintrace on the same model shapes in the same
run, so that speed ratios come from one process on one machine. This module builds the
braintrace side only through braintrace's public API (checked against braintrace 0.2.6,
brainstate 0.5.4, jax 0.10.2):

* models: ``braintrace.nn.GRUCell`` + ``braintrace.nn.Linear`` readout ("gru"), or
  ``braintrace.nn.Linear`` input layer -> ``brainpy.state.LIF`` / ``brainpy.state.ALIF``
  -> ``braintrace.nn.LeakyRateReadout`` ("lif" / "alif"; the same layout as streamtrace's
  ``Stack``, whose neuron stacks read out through a leaky readout by default);
* algorithms: ``braintrace.D_RTRL`` ("d-rtrl", parameter-dimension traces) and
  ``braintrace.pp_prop`` (== ``braintrace.ES_D_RTRL``, "es-d-rtrl", input/output-dimension
  traces, ``decay_or_rank=decay``);
* set-up: ``brainstate.nn.init_all_states`` -> ``Algo(model, ...)`` -> ``compile_graph(x)``
  (the same three calls ``braintrace.compile`` makes);
* one step: ``learner(x)`` inside the loss, ``brainstate.transform.grad(loss, learner.param_states)``
  (the single-step pattern of braintrace's ``etrace_grad``), ``optax.adam`` written back into
  the ``ParamState``s, all under one ``brainstate.transform.jit``.

Caveats (measured with braintrace 0.2.6, see the self-check at the bottom):

* Under braintrace's default ``vjp_method="single-step"`` a weight that reaches no hidden
  state (a plain Linear readout, ``braintrace.nn.Linear`` or ``brainstate.nn.Linear`` alike)
  gets an exactly-zero gradient: braintrace files every ``ParamState`` as an "etrace"
  parameter, and the single-step backward pass returns gradients only through the traces.
  So the "gru" readout never learns in single-step mode. ``vjp_method="multi-step"`` does give
  it a gradient (and also backpropagates within the step), at a different cost.
* braintrace's GRU reset-gate weight ``Wr`` reaches the hidden state only through ``Wh`` and is
  excluded from the traces (braintrace warns about it); it also gets a zero gradient in
  single-step mode.
* The "lif"/"alif" readout is braintrace's ``LeakyRateReadout`` (``r = a r + x W``, no bias,
  no ``(1 - a)`` factor), so it has a hidden state and its weight gets a trace and a gradient.
  Pass ``readout="linear"`` to use a ``braintrace.nn.Linear`` readout instead.
* ``brainpy.state`` neurons are used unit-free (``dt = 1``, ``tau = 10``, ``V_th = 1``,
  ``V_reset = V_rest = 0``, ``R = 1``; ALIF ``tau_a = 100``, ``beta = 0.5``), with the input
  current scaled by ``gain`` as in streamtrace's ``Stack``. Their spike reset and surrogate
  (``ReluGrad``) are brainpy's, not streamtrace's.
"""
from __future__ import annotations

import warnings

try:  # optional extra: the suite runs without it
    import braintrace
    import brainpy.state as _bp_state
    import brainstate
    import braintools
    import jax
    import jax.numpy as jnp
    import optax

    AVAILABLE = True
except Exception:  # pragma: no cover - depends on the environment
    AVAILABLE = False

__all__ = ["AVAILABLE", "KINDS", "ALGORITHMS", "make_step"]

KINDS = ("gru", "lif", "alif")
ALGORITHMS = ("d-rtrl", "es-d-rtrl")
DT = 1.0  # unit-free time step for the brainpy.state neurons and the leaky readout


def _algorithm_class(algorithm: str):
    name = algorithm.strip().lower().replace("_", "-")
    if name == "d-rtrl":
        return braintrace.D_RTRL, False
    if name in ("es-d-rtrl", "esd-rtrl", "pp-prop"):
        return braintrace.pp_prop, True  # braintrace.ES_D_RTRL is the same class
    raise ValueError(f"unknown algorithm {algorithm!r}; choose one of {ALGORITHMS}")


def _build_model(kind: str, n_in: int, n_hidden: int, n_out: int, readout: str, gain: float):
    neuron_kw = dict(R=1.0, tau=10.0, V_th=1.0, V_reset=0.0, V_rest=0.0,
                     V_initializer=braintools.init.Constant(0.0))

    class Model(brainstate.nn.Module):
        def __init__(self):
            super().__init__()
            if kind == "gru":
                self.inp = None
                self.cell = braintrace.nn.GRUCell(n_in, n_hidden)
            else:
                self.inp = braintrace.nn.Linear(n_in, n_hidden)
                if kind == "lif":
                    self.cell = _bp_state.LIF(n_hidden, **neuron_kw)
                else:
                    self.cell = _bp_state.ALIF(n_hidden, tau_a=100.0, beta=0.5,
                                               a_initializer=braintools.init.Constant(0.0), **neuron_kw)
            if readout == "linear":
                self.out = braintrace.nn.Linear(n_hidden, n_out)
            else:
                self.out = braintrace.nn.LeakyRateReadout(n_hidden, n_out, tau=5.0)

        def update(self, x):
            h = self.cell(x) if self.inp is None else self.cell(self.inp(x) * gain)
            return self.out(h)

    return Model()


def make_step(kind: str, n_in: int, n_hidden: int, n_out: int, algorithm: str,
              batch: int | None = None, seed: int = 0, *, readout: str | None = None,
              decay: float = 0.9, gain: float = 2.0, vjp_method: str = "single-step",
              lr: float = 1e-3, steps: int = 1):
    """Return ``(step, x, y)``: ``step()`` runs ONE braintrace online learning step on x/y.

    ``step()`` runs the model forward through the braintrace learner (advancing hidden states
    and eligibility traces), takes the mean squared error against ``y``, gets the weight
    gradients from the learner via ``brainstate.transform.grad``, applies ``optax.adam(lr)``
    to the ``ParamState``s, and returns the loss after ``jax.block_until_ready``. The whole
    step is one ``brainstate.transform.jit``; it compiles on the first call.

    ``batch=None`` is an unbatched single sample (braintrace supports it; x has shape
    ``(n_in,)``); ``batch=B`` initialises batched states (braintrace's in-graph batch axis,
    x has shape ``(B, n_in)``). ``readout`` defaults to "linear" for "gru" and "leaky" for the
    neuron kinds, as in streamtrace's ``Stack``. ``decay`` is es-d-rtrl's ``decay_or_rank``.
    ``steps`` > 1: ``step()`` runs that many online steps in one jit, a
    ``brainstate.transform.for_loop`` over stacked x/y (x and y get a leading steps axis).

    For inspection, ``step`` carries ``learner``, ``model``, ``weights`` (path -> ParamState)
    and ``compile_warnings`` (braintrace's compile-time warnings, as strings).
    """
    if not AVAILABLE:
        raise ImportError("braintrace is not installed (optional extra); the reference timings are unavailable")
    kind = kind.strip().lower()
    if kind not in KINDS:
        raise ValueError(f"unknown kind {kind!r}; choose one of {KINDS}")
    cls, io_dim = _algorithm_class(algorithm)
    readout = readout or ("linear" if kind == "gru" else "leaky")
    if readout not in ("linear", "leaky"):
        raise ValueError(f"readout must be 'linear' or 'leaky'; got {readout!r}")
    if batch is not None and (not isinstance(batch, int) or batch < 1):
        raise ValueError(f"batch must be None or a positive integer; got {batch!r}")

    kx, ky = jax.random.split(jax.random.PRNGKey(seed))
    shape_in = (n_in,) if batch is None else (batch, n_in)
    shape_out = (n_out,) if batch is None else (batch, n_out)
    x = jax.random.normal(kx, shape_in, dtype=jnp.float32)
    y = jax.random.normal(ky, shape_out, dtype=jnp.float32)

    options = {"vjp_method": vjp_method}
    if io_dim:
        options["decay_or_rank"] = decay

    with warnings.catch_warnings(record=True) as caught, brainstate.environ.context(dt=DT):
        warnings.simplefilter("always")
        try:
            with brainstate.random.seed_context(seed):
                model = _build_model(kind, n_in, n_hidden, n_out, readout, gain)
                brainstate.nn.init_all_states(model, batch_size=batch)
            learner = cls(model, **options)
            learner.compile_graph(x)  # once, before any step
        except (braintrace.NotSupportedError, braintrace.CompilationError) as e:
            raise NotImplementedError(f"braintrace cannot compile {kind}/{algorithm}: {e}") from e
    compile_warnings = [str(w.message) for w in caught]

    weights = learner.param_states  # path -> ParamState, every trainable weight of the model
    if len(weights) == 0 or len(learner.graph.hidden_param_op_relations) == 0:
        raise NotImplementedError(f"braintrace found no trace-carrying weight in {kind}; nothing to learn online")

    opt = optax.adam(lr)
    opt_state = brainstate.State(opt.init({k: v.value for k, v in weights.items()}))

    def loss_fn(x_, y_):
        return jnp.mean((learner(x_) - y_) ** 2)

    grad_fn = brainstate.transform.grad(loss_fn, weights, return_value=True)

    def _online_step(x_, y_):
        with brainstate.environ.context(dt=DT):  # read at trace time by the neurons
            grads, loss = grad_fn(x_, y_)
        params = {k: v.value for k, v in weights.items()}
        updates, new_opt_state = opt.update(grads, opt_state.value, params)
        new_params = optax.apply_updates(params, updates)
        for k, st in weights.items():
            st.value = new_params[k]
        opt_state.value = new_opt_state
        return loss

    if steps > 1:
        x, y = jnp.stack([x] * steps), jnp.stack([y] * steps)
        run = brainstate.transform.jit(lambda xs, ys: brainstate.transform.for_loop(_online_step, xs, ys))
    else:
        run = brainstate.transform.jit(_online_step)

    def step():
        return jax.block_until_ready(run(x, y))

    step.learner, step.model, step.weights = learner, model, weights
    step.compile_warnings = compile_warnings
    return step, x, y


if __name__ == "__main__":
    import sys
    import time

    import numpy as np

    if not AVAILABLE:
        print("braintrace not installed; nothing to check")
        sys.exit(0)

    def snapshot(weights):
        return {"/".join(map(str, k)): [np.asarray(l) for l in jax.tree.leaves(v.value)] for k, v in weights.items()}

    print(f"braintrace {braintrace.__version__}, brainstate {brainstate.__version__}, jax {jax.__version__}, "
          f"device {jax.devices()[0]}")
    failures = []
    for vjp_method in ("single-step", "multi-step"):
        for kind in KINDS:
            for algorithm in ALGORITHMS:
                tag = f"{kind:4s} {algorithm:9s} {vjp_method:11s}"
                try:
                    step, x, y = make_step(kind, 4, 64, 1, algorithm, vjp_method=vjp_method)
                except NotImplementedError as e:
                    print(f"{tag} NOT IMPLEMENTED: {e}")
                    continue
                w0 = snapshot(step.weights)
                losses = [float(step()) for _ in range(200)]
                w1 = snapshot(step.weights)
                changed = {k: any(not np.array_equal(a, b) for a, b in zip(w0[k], w1[k])) for k in w0}
                loss_changes = len(set(losses)) > 1
                readout_changed = any(v for k, v in changed.items() if k.startswith("out"))
                times = []
                for _ in range(1000):
                    t0 = time.perf_counter()
                    step()
                    times.append(time.perf_counter() - t0)
                med = 1e6 * float(np.median(times))
                frozen = [k for k, v in changed.items() if not v]
                print(f"{tag} median {med:8.1f} us/step | loss {losses[0]:.4f} -> {losses[-1]:.4f} "
                      f"| readout changes: {readout_changed} | frozen weights: {frozen or 'none'}")
                if not loss_changes or not any(changed.values()):
                    failures.append(tag)
    if failures:
        print("NOT A REAL STEP (loss or weights did not change):", failures)
        sys.exit(1)
    print("ok")
