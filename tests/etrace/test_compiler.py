"""The eligibility-trace compiler: rejected models, explain(), stable names, instant parameters.

Every rejected pattern must raise ``streamtrace.CompileError`` naming the weight / state at
fault and what to change; every accepted model must say, per parameter, how it learns.
"""
from paths import TESTS
import json
import os
import re
import subprocess
import sys

import brainstate
import jax
import jax.numpy as jnp
import pytest

import streamtrace as st
from streamtrace import nn
from streamtrace.nn import ops

from models import alif_net, diag_rnn_net, gru_net, lif_net, lstm_net

B, I, N, O = 2, 3, 4, 2
X = jnp.ones((B, I))
TESTS_DIR = str(TESTS)


# ------------------------------------------------------------------------------------------
# a tiny harness: Net.cell holds the weights and hidden states, so every name is "cell.<attr>"
# ------------------------------------------------------------------------------------------
class Holder(brainstate.nn.Module):
    def __init__(self, params, hidden, extra_states=()):
        super().__init__()
        keys = jax.random.split(jax.random.PRNGKey(0), len(params))
        for k, (name, shape) in zip(keys, params.items()):
            setattr(self, name, brainstate.ParamState(0.3 * jax.random.normal(k, shape)))
        self._hidden = tuple(hidden)
        self._extra = tuple(extra_states)

    def init_state(self, batch_size=None, **kwargs):
        for name in self._hidden:
            setattr(self, name, brainstate.HiddenState(jnp.zeros((batch_size, N))))
        for name in self._extra:
            setattr(self, name, brainstate.ShortTermState(jnp.zeros(())))


class Net(brainstate.nn.Module):
    def __init__(self, step, params=None, hidden=("h",), extra_states=()):
        super().__init__()
        self.cell = Holder(params or {"W": (I, N)}, hidden, extra_states)
        self._step = step

    def update(self, x):
        return self._step(self.cell, x)


def build(step, batch=B, **kw):
    model = Net(step, **kw)
    brainstate.nn.init_all_states(model, batch)
    return model


def rejects(model, *phrases, x=X):
    """compile_graph must raise CompileError whose message contains every phrase."""
    with pytest.raises(st.etrace.CompileError) as info:
        st.etrace.compile_graph(model, x)
    msg = str(info.value)
    for p in phrases:
        assert re.search(p, msg), f"{p!r} not in CompileError message: {msg}"
    return msg


def leaky(c, drive):
    c.h.value = 0.5 * c.h.value + drive
    return c.h.value


# ------------------------------------------------------------------------------------------
# control: the harness itself builds an acceptable model
# ------------------------------------------------------------------------------------------
def test_harness_valid_model_compiles():
    g = st.etrace.compile_graph(build(lambda c, x: leaky(c, ops.matmul(x, c.W.value))), X)
    assert g.param_names == ("cell.W",)
    assert g.hidden_names == ("cell.h",)
    assert [gr.members for gr in g.groups] == [("cell.h",)]
    assert g.trace_params == ("cell.W",)
    assert g.instant_params == ()


def test_compile_error_is_a_value_error():
    assert issubclass(st.etrace.CompileError, ValueError)


# ------------------------------------------------------------------------------------------
# 1a. op output reaches a hidden state through a non-element-wise op
# ------------------------------------------------------------------------------------------
NON_ELEMENTWISE = {
    "roll": lambda y: jnp.roll(y, 1, axis=-1),
    "flip": lambda y: jnp.flip(y, axis=-1),
    "sum": lambda y: jnp.sum(y, axis=-1, keepdims=True) * jnp.ones_like(y),
    "transpose": lambda y: y.T,            # batch == N below: same shape, mixed neurons
    "matmul-plain": lambda y: y @ jnp.ones((N, N)),
    "cumsum": lambda y: jnp.cumsum(y, axis=-1),
}


@pytest.mark.parametrize("mix", NON_ELEMENTWISE.values(), ids=NON_ELEMENTWISE.keys())
def test_op_reaching_hidden_through_non_elementwise_op_is_rejected(mix):
    def step(c, x):
        c.h.value = jnp.tanh(mix(ops.matmul(x, c.W.value)) + c.h.value)
        return c.h.value
    x = jnp.ones((N, I))
    rejects(build(step, batch=N), r"weight 'cell\.W'", r"hidden state 'cell\.h'", "not element-wise",
            "drive only its own neuron", x=x)


# ------------------------------------------------------------------------------------------
# 1b. one weight op drives two separate hidden groups
# ------------------------------------------------------------------------------------------
def test_one_op_driving_two_hidden_groups_is_rejected():
    def step(c, x):
        y = ops.matmul(x, c.W.value)
        c.h1.value = 0.5 * c.h1.value + y
        c.h2.value = 0.9 * c.h2.value + y
        return c.h1.value + c.h2.value
    rejects(build(step, hidden=("h1", "h2")), r"weight 'cell\.W'", "drives two hidden groups",
            r"cell\.h1", r"cell\.h2", "one op per group")


def test_two_ops_one_per_group_is_accepted():
    """Control for 1b: split into one op per group, it compiles into two groups."""
    def step(c, x):
        c.h1.value = 0.5 * c.h1.value + ops.matmul(x, c.W1.value)
        c.h2.value = 0.9 * c.h2.value + ops.matmul(x, c.W2.value)
        return c.h1.value + c.h2.value
    g = st.etrace.compile_graph(build(step, params={"W1": (I, N), "W2": (I, N)}, hidden=("h1", "h2")), X)
    assert sorted(gr.name for gr in g.groups) == ["cell.h1", "cell.h2"]
    assert {r.weight: g.groups[r.group].name for r in g.traced_relations} == {
        "cell.W1": "cell.h1", "cell.W2": "cell.h2"}


# ------------------------------------------------------------------------------------------
# 1c. a weight op inside a loop
# ------------------------------------------------------------------------------------------
def _fori(c, x):
    W = c.W.value
    acc = jax.lax.fori_loop(0, 2, lambda i, a: a + ops.matmul(x, W), jnp.zeros((B, N)))
    return leaky(c, acc)


def _scan(c, x):
    W = c.W.value
    _, ys = jax.lax.scan(lambda carry, xi: (carry, ops.matmul(xi, W)), None, jnp.stack([x, x]))
    return leaky(c, ys.sum(0))


def _while(c, x):
    W = c.W.value
    _, acc = jax.lax.while_loop(lambda s: s[0] < 2, lambda s: (s[0] + 1, s[1] + ops.matmul(x, W)),
                                (0, jnp.zeros((B, N))))
    return leaky(c, acc)


@pytest.mark.parametrize("step", [_fori, _scan, _while], ids=["fori_loop", "scan", "while_loop"])
def test_weight_op_inside_loop_is_rejected(step):
    rejects(build(step), "weight op", r"sits inside control flow `(scan|while)`", r"reads parameters: cell\.W",
            "unroll the loop")


# ------------------------------------------------------------------------------------------
# 1d. hidden recurrence through a plain (non-marked) dense op
# ------------------------------------------------------------------------------------------
def test_plain_dense_self_recurrence_names_the_hidden_state():
    # (a plain `h @ R` on a parameter is recognised as a weight op; `R.T` is not the (in, out) layout)
    def step(c, x):
        c.h.value = jnp.tanh(x @ c.W.value + c.h.value @ c.R.value.T)
        return c.h.value
    rejects(build(step, params={"W": (I, N), "R": (N, N)}),
            r"hidden state 'cell\.h' depends on the previous value of 'cell\.h'", "dot_general",
            "not a marked weight op", r"streamtrace\.nn\.ops\.matmul")


def test_plain_dense_cross_state_recurrence_names_both_states():
    def step(c, x):
        c.h1.value = 0.5 * c.h1.value + ops.matmul(x, c.W.value)
        c.h2.value = jnp.tanh(c.h1.value @ c.R.value.T) + 0.5 * c.h2.value  # R.T: not recognised
        return c.h2.value
    rejects(build(step, params={"W": (I, N), "R": (N, N)}, hidden=("h1", "h2")),
            r"hidden state 'cell\.h2' depends on the previous value of 'cell\.h1'", "mixes neurons",
            r"ops\.matmul")


def test_marked_dense_recurrence_is_accepted():
    """Control for 1d: the same recurrence through ops.matmul compiles (the path is cut)."""
    def step(c, x):
        c.h.value = jnp.tanh(ops.matmul(x, c.W.value) + ops.matmul(c.h.value, c.R.value))
        return c.h.value
    g = st.etrace.compile_graph(build(step, params={"W": (I, N), "R": (N, N)}), X)
    assert set(g.trace_params) == {"cell.W", "cell.R"}


# ------------------------------------------------------------------------------------------
# 1e. output depends on a traced op / the previous hidden value other than via the new state
# ------------------------------------------------------------------------------------------
def _out_tanh_y(c, x):
    y = ops.matmul(x, c.W.value)
    c.h.value = 0.5 * c.h.value + y
    return jnp.tanh(y)


def _out_new_plus_y(c, x):
    y = ops.matmul(x, c.W.value)
    c.h.value = 0.5 * c.h.value + y
    return c.h.value * y


@pytest.mark.parametrize("step", [_out_tanh_y, _out_new_plus_y], ids=["tanh(y)", "h_new*y"])
def test_output_depending_on_traced_op_directly_is_rejected(step):
    rejects(build(step), r"output depends on weight 'cell\.W'", r"other than through the new value",
            r"hidden group 'cell\.h'", "compute the output from the updated state")


def _out_old(c, x):
    old = c.h.value
    c.h.value = 0.5 * old + ops.matmul(x, c.W.value)
    return old


def _out_old_and_new(c, x):
    old = c.h.value
    c.h.value = 0.5 * old + ops.matmul(x, c.W.value)
    return c.h.value + jnp.tanh(old)


@pytest.mark.parametrize("step", [_out_old, _out_old_and_new], ids=["old", "old+new"])
def test_output_depending_on_previous_hidden_is_rejected(step):
    rejects(build(step), r"output depends on the previous value of hidden state 'cell\.h'",
            "compute the output from the updated state")


def _readout_of_old(c, x):
    # a common ordering mistake: read the state out before updating it
    out = ops.matmul(c.h.value, c.R.value)
    c.h.value = 0.5 * c.h.value + ops.matmul(x, c.W.value)
    return out


def _readout_of_y(c, x):
    y = ops.matmul(x, c.W.value)
    c.h.value = 0.5 * c.h.value + y
    return ops.matmul(jnp.tanh(y), c.R.value)


@pytest.mark.parametrize("step", [_readout_of_old, _readout_of_y], ids=["readout(old h)", "readout(y)"])
def test_output_through_readout_op_bypassing_new_state_is_rejected(step):
    rejects(build(step, params={"W": (I, N), "R": (N, O)}), r"output depends on",
            r"cell\.(h|W)")


# ------------------------------------------------------------------------------------------
# 1f. a traced weight also used outside its op
# ------------------------------------------------------------------------------------------
def _w_sum_in_output(c, x):
    return leaky(c, ops.matmul(x, c.W.value)) + jnp.sum(c.W.value)


def _w_sum_in_hidden(c, x):
    return leaky(c, ops.matmul(x, c.W.value) + jnp.sum(c.W.value))


def _w_in_two_ops(c, x):
    return leaky(c, ops.matmul(x, c.W.value) + ops.matmul(2.0 * x, c.W.value))


@pytest.mark.parametrize("step,where", [(_w_sum_in_output, "reduce_sum"), (_w_sum_in_hidden, "reduce_sum"),
                                        (_w_in_two_ops, "weight op #1")],
                         ids=["sum(W)->output", "sum(W)->h", "two ops"])
def test_traced_weight_used_outside_its_op_is_rejected(step, where):
    rejects(build(step), r"parameter 'cell\.W' carries an eligibility trace but is also used by",
            re.escape(where), "would get no gradient", "exactly one weight op")


# ------------------------------------------------------------------------------------------
# 1g. non-Hidden/non-Param state; no hidden state at all
# ------------------------------------------------------------------------------------------
def test_short_term_state_is_rejected_by_name():
    def step(c, x):
        c.count.value = c.count.value + 1.0
        return leaky(c, ops.matmul(x, c.W.value))
    rejects(build(step, extra_states=("count",)), r"state 'cell\.count' is a ShortTermState",
            "ParamState", "HiddenState", "constant attribute")


def test_model_without_hidden_state_is_rejected():
    rejects(build(lambda c, x: ops.matmul(x, c.W.value), hidden=()), "no HiddenState", "init_all_states")


def test_uninitialised_model_is_rejected_with_the_fix():
    from models import CellNet
    rejects(CellNet(nn.GRUCell), "no HiddenState", r"init_all_states\(model")


# ------------------------------------------------------------------------------------------
# 1h. weight op inside a nested jax.jit
# ------------------------------------------------------------------------------------------
def _nested_jit(c, x):
    return leaky(c, jax.jit(lambda x, W: ops.matmul(x, W))(x, c.W.value))


def test_weight_op_inside_nested_jit_is_rejected():
    rejects(build(_nested_jit), r"weight 'cell\.W' \(streamtrace_matmul\)", "nested jit",
            "top level of update", r"do not wrap layers in jax\.jit")


def test_weight_op_inside_nested_jit_names_the_weight():
    rejects(build(_nested_jit), "nested jit", r"cell\.W")


def test_nested_jit_without_weight_op_is_analysed_through():
    """A nested jit with no weight op inside is fine when element-wise, rejected when mixing."""
    ok = lambda c, x: leaky(c, jax.jit(lambda h: 0.9 * h)(c.h.value) + ops.matmul(x, c.W.value))
    st.etrace.compile_graph(build(ok), X)
    mixing = lambda c, x: leaky(c, jax.jit(lambda h: jnp.roll(h, 1, -1))(c.h.value) + ops.matmul(x, c.W.value))
    rejects(build(mixing), r"hidden state 'cell\.h' depends on the previous value of 'cell\.h'")


# ------------------------------------------------------------------------------------------
# 2. explain()
# ------------------------------------------------------------------------------------------
ROW = re.compile(r"^(weight|param|hidden) '([^']+)': (.*)$")


def rows(text):
    out = []
    for line in text.splitlines():
        m = ROW.match(line)
        assert m, f"unparseable explain() row: {line!r}"
        out.append(m.groups())
    return out


GRU_PARAMS = {f"cell.{g}.{p}" for g in "zrn" for p in "Wb"} | {"out.W", "out.b"}


def test_gru_explain_lists_every_parameter_exactly_once():
    g = st.etrace.compile_graph(gru_net(), X)
    assert set(g.param_names) == GRU_PARAMS
    r = rows(g.explain())
    named = [name for kind, name, _ in r if kind in ("weight", "param")]
    assert sorted(named) == sorted(g.param_names)          # every parameter, exactly once
    verdict = {name: v for kind, name, v in r if kind in ("weight", "param")}
    for p in ("out.W", "out.b"):
        assert verdict[p].startswith("instant"), verdict[p]
        assert "reaches no hidden state" in verdict[p]
    for p in ("cell.z.W", "cell.z.b", "cell.n.W", "cell.n.b"):
        assert "eligibility trace" in verdict[p] and "into group 'cell.h'" in verdict[p], verdict[p]
    hidden_rows = [(name, v) for kind, name, v in r if kind == "hidden"]
    assert [n for n, _ in hidden_rows] == ["cell.h"]
    assert "group 'cell.h' (S=1" in hidden_rows[0][1]
    assert set(g.instant_params) >= {"out.W", "out.b"}


def _stacked_ops(c, x):
    # element-wise recurrence fed by a two-op feed-forward path: x -W-> tanh -R-> h
    return leaky(c, ops.matmul(jnp.tanh(ops.matmul(x, c.W.value)), c.R.value))


@pytest.mark.parametrize("case", ["gru-reset-gate", "stacked-ops"])
def test_weight_feeding_hidden_via_another_op_is_explained_truthfully(case):
    if case == "gru-reset-gate":
        g, names, hidden = st.etrace.compile_graph(gru_net(), X), ("cell.r.W", "cell.r.b"), "cell.h"
    else:
        g = st.etrace.compile_graph(build(_stacked_ops, params={"W": (I, N), "R": (N, N)}), X)
        names, hidden = ("cell.W",), "cell.h"
    verdict = {name: v for kind, name, v in rows(g.explain()) if kind != "hidden"}
    for p in names:
        assert "reaches no hidden state" not in verdict[p], verdict[p]
        assert hidden in verdict[p], verdict[p]


def test_explain_filters():
    g = st.etrace.compile_graph(gru_net(), X)
    out_rows = rows(g.explain(weight="out"))
    assert sorted(n for _, n, _ in out_rows) == ["out.W", "out.b"]
    assert all(v.startswith("instant") for _, _, v in out_rows)
    z_rows = rows(g.explain(weight="cell.z"))
    assert sorted(n for _, n, _ in z_rows) == ["cell.z.W", "cell.z.b"]
    h_rows = rows(g.explain(hidden="cell.h"))
    assert [(k, n) for k, n, _ in h_rows] == [("hidden", "cell.h")]
    assert "group 'cell.h'" in h_rows[0][2]
    assert g.explain(weight="no-such-weight") == ""
    # summary = counts + the full explanation
    assert g.summary().endswith(g.explain())
    assert f"{len(g.instant_params)} instant parameter(s)" in g.summary()


@pytest.mark.parametrize("make,members", [
    (lstm_net, ("cell.c", "cell.h")),
    (alif_net, ("cell.V", "cell.b")),
    (lif_net, ("cell.V",)),
], ids=["lstm", "alif", "lif"])
def test_hidden_groups(make, members):
    g = st.etrace.compile_graph(make(), X)
    assert len(g.groups) == 1
    grp = g.groups[0]
    assert grp.members == members
    assert grp.size == len(members)
    assert grp.name == "+".join(members)
    assert grp.shape == (B, 5)
    for s, m in enumerate(members):
        assert g.group_of(m) == (grp, s)
    h_rows = rows(g.explain(hidden=members[0]))
    assert any(f"group '{grp.name}' (S={grp.size}" in v for _, _, v in h_rows)
    # every traced weight goes into that group, the readout is instant
    assert all(g.groups[r.group] is grp for r in g.traced_relations)
    assert set(g.instant_params) == {"out.W", "out.b"}


def test_lstm_all_gates_traced_into_the_two_state_group():
    g = st.etrace.compile_graph(lstm_net(), X)
    verdict = {n: v for k, n, v in rows(g.explain()) if k != "hidden"}
    for gate in "ifgo":
        for p in "Wb":
            assert "into group 'cell.c+cell.h' (S=2)" in verdict[f"cell.{gate}.{p}"]


# ------------------------------------------------------------------------------------------
# 3. stable, readable names
# ------------------------------------------------------------------------------------------
NAMES_SRC = """
import jax.numpy as jnp
import streamtrace as st
from models import alif_net, gru_net, lstm_net

def all_names():
    x = jnp.ones((2, 3))
    out = {}
    for mk in (gru_net, lstm_net, alif_net):
        m = mk()
        g = st.etrace.compile_graph(m, x)
        out[mk.__name__] = {
            "params": list(g.param_names),
            "hidden": list(g.hidden_names),
            "groups": [gr.name for gr in g.groups],
            "d_rtrl": list(st.etrace.D_RTRL(m, x).init_traces().keys()),
            "es_d_rtrl": list(st.etrace.ES_D_RTRL(m, x, decay=0.5).init_traces().keys()),
        }
    return out
"""


def _names_in_process():
    ns = {}
    exec(NAMES_SRC, ns)
    return ns["all_names"]()


NAME_RE = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")


def test_names_are_readable_module_paths():
    names = _names_in_process()
    gru = names["gru_net"]
    assert set(gru["params"]) == GRU_PARAMS
    assert gru["hidden"] == ["cell.h"]
    assert set(gru["d_rtrl"]) == {"eps.cell.z.W", "eps.cell.z.b", "eps.cell.n.W", "eps.cell.n.b"}
    assert set(gru["es_d_rtrl"]) == {"xbar.cell.z.W", "fbar.cell.z.W", "xbar.cell.z.b",
                                     "xbar.cell.n.W", "fbar.cell.n.W", "xbar.cell.n.b"}
    for model in names.values():
        for key in ("params", "hidden", "d_rtrl", "es_d_rtrl"):
            for n in model[key]:
                assert NAME_RE.match(n), n              # dotted identifiers, no ids / addresses
                assert not re.search(r"\d{3,}", n), n
            assert len(set(model[key])) == len(model[key])


def test_names_identical_for_separately_built_models():
    assert _names_in_process() == _names_in_process()


def test_names_identical_across_processes():
    code = NAMES_SRC + "\nimport json\nprint(json.dumps(all_names()))\n"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([TESTS_DIR, os.environ.get("PYTHONPATH", "")]),
               PYTHONHASHSEED="12345")
    proc = subprocess.run([sys.executable, "-c", code], cwd=TESTS_DIR, env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    other = json.loads(proc.stdout.strip().splitlines()[-1])
    assert other == _names_in_process()


# ------------------------------------------------------------------------------------------
# 4. instant parameters
# ------------------------------------------------------------------------------------------
class TauCell(brainstate.nn.Module):
    """h = a h + (1 - a) x W with a learnable a = sigmoid(theta), applied element-wise."""

    def __init__(self):
        super().__init__()
        self.W = brainstate.ParamState(0.3 * jax.random.normal(jax.random.PRNGKey(0), (I, N)))
        self.theta = brainstate.ParamState(jnp.zeros(N))

    def init_state(self, batch_size=None, **kwargs):
        self.h = brainstate.HiddenState(jnp.zeros((batch_size, N)))

    def update(self, x):
        a = jax.nn.sigmoid(self.theta.value)
        self.h.value = a * self.h.value + (1.0 - a) * ops.matmul(x, self.W.value)
        return self.h.value


class TauNet(brainstate.nn.Module):
    def __init__(self):
        super().__init__()
        self.cell = TauCell()
        self.out = nn.Linear(N, O, key=jax.random.PRNGKey(1))

    def update(self, x):
        return self.out(self.cell(x))


def test_learnable_time_constant_is_instant_with_a_reason():
    m = TauNet()
    brainstate.nn.init_all_states(m, B)
    g = st.etrace.compile_graph(m, X)
    assert set(g.param_names) == {"cell.W", "cell.theta", "out.W", "out.b"}
    assert set(g.instant_params) == {"cell.theta", "out.W", "out.b"}
    assert g.trace_params == ("cell.W",)
    r = rows(g.explain(weight="cell.theta"))
    assert len(r) == 1
    kind, name, verdict = r[0]
    assert (kind, name) == ("param", "cell.theta")
    assert verdict.startswith("instant")
    assert "used outside weight ops" in verdict and "one-step gradient" in verdict
    # the parameter list of explain() still covers every parameter exactly once
    assert sorted(n for k, n, _ in rows(g.explain()) if k != "hidden") == sorted(g.param_names)
    # every parameter gets a gradient: instant ones by backprop through the step
    algo = st.etrace.D_RTRL(g)
    p, h, tr = algo.init_state()
    grads = jax.grad(lambda p: jnp.sum(algo(p, h, tr, X)[0] ** 2))(p)
    assert float(jnp.abs(grads["cell.theta"]).max()) > 0


def test_time_constant_through_marked_elementwise_op_is_traced():
    """Contrast with the above: DiagRNNCell's w_rec goes through ops.elementwise and gets a trace."""
    g = st.etrace.compile_graph(diag_rnn_net(), X)
    assert "cell.w_rec" in g.trace_params
    assert "cell.w_rec" not in g.instant_params
    (_, _, v), = rows(g.explain(weight="cell.w_rec"))
    assert "eligibility trace (elementwise" in v and "into group 'cell.h'" in v


@pytest.mark.parametrize("make", [gru_net, lstm_net, lif_net, alif_net], ids=["gru", "lstm", "lif", "alif"])
def test_linear_readout_is_instant(make):
    g = st.etrace.compile_graph(make(), X)
    assert {"out.W", "out.b"} <= set(g.instant_params)
    assert not {"out.W", "out.b"} & set(g.trace_params)
    readout = [r for r in g.relations if r.weight == "out.W"]
    assert len(readout) == 1 and not readout[0].traced and readout[0].bias == "out.b"
