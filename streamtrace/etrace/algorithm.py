"""ETraceVjpAlgorithm: one step (or a window) as a ``jax.custom_vjp``.

Forward: output, new hidden state, new eligibility traces. Backward: the cotangent of the
output / new hidden state (dL/dh_t) is turned into weight gradients through the traces, so an
ordinary ``jax.grad`` of a loss on the step's output yields the online gradient:

    def loss(params, hidden, traces, x, y):
        out, hidden, traces = algo(params, hidden, traces, x)
        return mse(out, y), (hidden, traces)
    grads, (hidden, traces) = jax.grad(loss, has_aux=True)(params, hidden, traces, x, y)

Every parameter gets a gradient: traced weights through their traces, all others (readouts,
time constants, ...) by ordinary backprop through the step. ``vjp_method="multi-step"`` with a
``MultiStepData`` window backpropagates exactly inside the window and through the traces from
before it; ``"single-step"`` over a window sums the per-step online gradients.
"""
from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp

from . import kernel
from .data import MultiStepData, SingleStepData
from .graph import ETraceGraph, compile_graph
from .signals import SignalContext, as_signal

__all__ = ["ETraceVjpAlgorithm"]

VJP_METHODS = ("single-step", "multi-step")


class ETraceVjpAlgorithm:
    """Base class. Subclasses define the trace state and its two uses:

    * ``base_traces()``: zero traces, a flat dict ``{readable name: array}``;
    * ``update_traces(traces, xs, D, F)``: the forward trace recursion;
    * ``weight_grads(traces, g)``: contract the learning signal (per group, (..., O, S)) with
      the traces into ``{param name: gradient}``.
    """

    name = "etrace"

    def __init__(self, model, *example_args, vjp_method: str = "single-step", signal=None, fixed=()):
        if vjp_method not in VJP_METHODS:
            raise ValueError(f"vjp_method must be one of {VJP_METHODS}; got {vjp_method!r}")
        if isinstance(model, ETraceGraph):
            if example_args or fixed:
                raise TypeError("pass example inputs and fixed parameters only with a model, not with a "
                                "compiled graph")
            self.graph = model
        else:
            if not example_args:
                raise TypeError(f"{type(self).__name__}(model, *example_inputs): example inputs are needed "
                                "to compile the model")
            self.graph = compile_graph(model, *example_args, fixed=fixed)
        self.vjp_method = vjp_method
        if vjp_method == "multi-step" and signal is not None:
            raise ValueError("learning-signal hooks apply to vjp_method='single-step' only")
        self.signal = as_signal(signal).bind(self)
        self._step = self._make_step()
        self._window = self._make_window()
        self._slots_step = self._make_step(slots=True) if self.batched_grads else None

    # ---- what subclasses provide ------------------------------------------------------
    @property
    def traced_params(self) -> tuple:
        """Parameters whose gradient comes from the traces."""
        return self.graph.trace_params

    def base_traces(self) -> dict:
        raise NotImplementedError

    def update_traces(self, traces, xs, D, F):
        raise NotImplementedError

    def weight_grads(self, traces, g) -> dict:
        raise NotImplementedError

    # ---- state ------------------------------------------------------------------------
    def init_traces(self) -> dict:
        return {**self.base_traces(), **self.signal.init(self)}

    def init_state(self):
        """(params, hidden, traces) from the model's current values and zero traces."""
        return self.graph.init_params(), self.graph.init_hidden(), self.init_traces()

    # ---- one step ---------------------------------------------------------------------
    def forward(self, params, hidden, traces, args, keep=None):
        """The forward pass without the custom VJP: (output, new hidden, new traces)."""
        return self._forward(params, hidden, traces, args, keep)[:3]

    def _advance(self, params, hidden, traces, args):
        """(output, new hidden, new traces, residual for the learning signal)."""
        out, new_h, xs, D, F, P = kernel.forward(self.graph, params, hidden, args)
        new_tr = self.signal.forward({**traces, **self.update_traces(traces, xs, D, F)})
        return out, new_h, new_tr, P

    def _forward(self, params, hidden, traces, args, keep=None):
        """``_advance``, guarded when ``keep`` (a scalar, 0 or 1) is given: with 0 the old
        traces come back, and a trace value that is not finite keeps its old value. The guard
        sits here, before the gradient reads the traces, so that XLA fuses it into the trace
        update's one pass (a select after the step took a second full pass over the traces)."""
        out, new_h, new_tr, P = self._advance(params, hidden, traces, args)
        if keep is not None:
            new_tr = jax.tree_util.tree_map(
                lambda n, o: jnp.where((keep > 0) & jnp.isfinite(n), n, o), new_tr, traces)
        return out, new_h, new_tr, P

    def learning_signal(self, g_total, residual):
        """From dL/dh_t (all paths) to the signal the traces expect."""
        return kernel.partial_signal(g_total, residual)

    # RTRL's sensitivity holds every path through h_t, so it contracts the signal from h_t on
    cut_hidden = False
    # weight_grads sums over leading batch axes (D-RTRL, ES-D-RTRL): ``over_slots`` can then
    # contract all slots at once instead of vmapping the one-slot step
    batched_grads = False

    def _direct_params(self):
        """Parameters differentiated by backprop through the step (not through traces)."""
        skip = set(self.traced_params) | set(self.graph.fixed_params)
        return tuple(n for n in self.graph.param_names if n not in skip)

    def _make_step(self, slots: bool = False):
        """The step with its custom VJP: the traces give the weight gradients. ``slots``: a
        leading slot axis on hidden, traces and args (params shared), the backward pass
        contracting all slots' learning signals and traces at once."""
        graph = self.graph
        fixed = set(graph.fixed_params)
        each = jax.vmap if slots else (lambda f: f)
        forward = jax.vmap(self._forward, in_axes=(None, 0, 0, 0, 0)) if slots else self._forward

        def signal(g, aux, out, ct_out, new_h):
            return self.signal.transform(self.learning_signal(g, aux), SignalContext(graph, out, ct_out, new_h))

        @jax.custom_vjp
        def step(params, hidden, traces, args, keep):
            return forward(params, hidden, traces, args, keep)[:3]

        def fwd(params, hidden, traces, args, keep):
            out, new_h, new_tr, aux = forward(params, hidden, traces, args, keep)
            return (out, new_h, new_tr), (params, hidden, traces, args, keep, out, new_h, new_tr, aux)

        def bwd(res, cts):
            params, hidden, traces, args, keep, out, new_h, new_tr, aux = res
            ct_out, ct_h, _ = cts
            g, dparams, dargs = kernel.backward(graph, params, hidden, args, ct_out, ct_h,
                                                diff_params=self._direct_params(),
                                                cut_hidden=self.cut_hidden, slots=slots)
            g = each(signal)(g, aux, out, ct_out, new_h)
            # every traced weight frozen (a readout learning alone): no traces to contract
            dtrace = self.weight_grads(each(self.signal.contraction_traces)(new_tr), g) if new_tr else {}
            grads = {n: _grad(params[n], dtrace.get(n), dparams.get(n), n in fixed) for n in params}
            return (grads, kernel.zeros_like_tree(hidden), kernel.zeros_like_tree(traces), dargs,
                    None if keep is None else jnp.zeros_like(keep))

        step.defvjp(fwd, bwd)
        return step

    def over_slots(self, params, hidden, traces, x, keep=None):
        """One step of N slots (a leading slot axis on hidden, traces and x; shared params)
        with the same gradient as ``vmap`` of the one-slot step. With ``batched_grads`` the
        backward pass contracts the learning signal with all slots' traces in one pass (a
        matrix product over slots for ES-D-RTRL, one multiply-sum for D-RTRL) rather than
        forming a (slots, I, O) gradient per slot and summing it. ``keep`` (N,): the guard of
        ``_forward`` per slot (None: no guard)."""
        keep = None if keep is None else jnp.asarray(keep, jnp.float32)
        if self._slots_step is None:
            return jax.vmap(lambda p, h, tr, x, k: self._step(p, h, tr, (x,), k),
                            in_axes=(None, 0, 0, 0, 0))(params, hidden, traces, x, keep)
        return self._slots_step(params, hidden, traces, (x,), keep)

    def _make_window(self):
        graph = self.graph

        def run_window(params, hidden, traces, seq_args, const_args, mask):
            return _scan_steps(self.forward, params, hidden, traces, seq_args, const_args, mask)

        def unrolled(params, hidden, seq_args, const_args, mask):
            def body(h, xs_t):
                out, h = kernel.plain_step(graph, params, h, _merge_args(xs_t, const_args, mask))
                return h, out
            h, outs = jax.lax.scan(body, hidden, seq_args)
            return outs, h

        @partial(jax.custom_vjp, nondiff_argnums=(5,))
        def _window(params, hidden, traces, seq_args, const_args, mask):
            return run_window(params, hidden, traces, seq_args, const_args, mask)

        def fwd(params, hidden, traces, seq_args, const_args, mask):
            res = run_window(params, hidden, traces, seq_args, const_args, mask)
            return res, (params, hidden, traces, seq_args, const_args)

        def bwd(mask, res, cts):
            params, hidden, traces, seq_args, const_args = res
            ct_outs, ct_h, _ = cts
            _, vjp_u = jax.vjp(lambda p, h, s, c: unrolled(p, h, s, c, mask), params, hidden, seq_args, const_args)
            dp, dh0, dseq, dconst = vjp_u((ct_outs, ct_h))
            # paths from before the window reach the weights through the traces at its start
            dtrace = self.weight_grads(traces, kernel.group_stack(graph, dh0))
            fixed = set(graph.fixed_params)
            grads = {n: jnp.zeros_like(dp[n]) if n in fixed else _sum_present(dtrace.get(n), dp[n]) for n in params}
            return grads, kernel.zeros_like_tree(hidden), kernel.zeros_like_tree(traces), dseq, dconst

        _window.defvjp(fwd, bwd)
        return _window

    # ---- public call ------------------------------------------------------------------
    def __call__(self, params, hidden, traces, *args):
        """Advance one step (or a MultiStepData window). Returns (output, hidden, traces)."""
        if not any(isinstance(a, MultiStepData) for a in args):
            args = tuple(a.value if isinstance(a, SingleStepData) else a for a in args)
            return self._step(params, hidden, traces, args, None)
        mask = tuple(isinstance(a, MultiStepData) for a in args)
        seq = tuple(a.value for a in args if isinstance(a, MultiStepData))
        const = tuple((a.value if isinstance(a, SingleStepData) else a) for a in args
                      if not isinstance(a, MultiStepData))
        lengths = {jnp.shape(leaf)[0] for leaf in jax.tree_util.tree_leaves(seq)}
        if len(lengths) != 1:
            raise ValueError(f"MultiStepData inputs disagree on the window length (axis 0): {sorted(lengths)}")
        if self.vjp_method == "multi-step":
            return self._window(params, hidden, traces, seq, const, mask)
        return _scan_steps(lambda p, h, tr, a: self._step(p, h, tr, a, None), params, hidden, traces, seq, const, mask)


def _scan_steps(step, params, hidden, traces, seq, const, mask):
    """Run ``step(params, hidden, traces, args)`` over the window: (stacked outputs, hidden, traces)."""
    def body(carry, xs_t):
        h, tr = carry
        out, h, tr = step(params, h, tr, _merge_args(xs_t, const, mask))
        return (h, tr), out
    (h, tr), outs = jax.lax.scan(body, (hidden, traces), seq)
    return outs, h, tr


def _merge_args(seq_t, const, mask):
    seq_it, const_it = iter(seq_t), iter(const)
    return tuple(next(seq_it) if m else next(const_it) for m in mask)


def _sum_present(a, b):
    return b if a is None else a if b is None else a + b


def _grad(param, from_traces, direct, fixed: bool):
    """A parameter's gradient; zero for a fixed one (a fixed weight whose op also has a
    learned bias keeps its trace, but not its gradient)."""
    if fixed or (from_traces is None and direct is None):
        return jnp.zeros_like(param)
    return _sum_present(from_traces, direct)
