"""Parameter groups: a frozen group never moves, per-group optimizers match optax's own
multi_transform over the parameter dict, every parameter must fall in a group, and the
stored names stay readable."""
import fnmatch

import numpy as np
import optax
import pytest

import streamtrace as st
from streamtrace import nn

T = 40


def gru():
    return nn.Stack("gru", n_in=1, n_hidden=8, n_out=1)


def signal(T=T, dtype=np.float32):
    return (np.sin(0.25 * np.arange(T + 1)) + 0.3 * np.cos(0.9 * np.arange(T + 1)))[:, None].astype(dtype)


def test_frozen_group_does_not_move_while_others_do():
    groups = st.param_groups(readout=("out.*", optax.adam(1e-2)), frozen=("cell.r.*", None),
                             rest=("*", optax.adam(1e-2)))
    L = st.OnlineLearner(gru(), np.zeros(1, np.float32), mode="forecast", optimizer=groups)
    p0 = L.params
    for x in signal():
        L.step(x)
    p1 = L.params
    assert L.stats()["updates"] == T
    for name in p0:
        moved = not np.array_equal(p0[name], p1[name])
        assert moved != fnmatch.fnmatchcase(name, "cell.r.*"), name


def test_per_group_optimizers_equal_optax_multi_transform_reference(x64):
    """Reference loop: a plain learner with sgd(1) yields each step's gradient (old - new
    weights); optax.multi_transform over the parameter dict turns it into the update, which
    is written back into the reference before the next step. The grouped learner must follow
    the same trajectory."""
    lrs = {"readout": optax.adam(3e-2), "gates": optax.sgd(0.2, momentum=0.5), "frozen": None,
           "rest": optax.sgd(0.05)}
    patterns = {"readout": "out.*", "gates": "cell.z.*", "frozen": "cell.r.*", "rest": "*"}
    groups = st.param_groups(**{g: (patterns[g], lrs[g]) for g in lrs})
    xs = signal(dtype=np.float64)
    L = st.OnlineLearner(gru(), np.zeros(1), mode="forecast", optimizer=groups)
    ref = st.OnlineLearner(gru(), np.zeros(1), mode="forecast", optimizer=optax.sgd(1.0))

    def label(name):     # independent of the learner's matching: explicit prefixes
        for g, prefix in (("readout", "out."), ("gates", "cell.z."), ("frozen", "cell.r.")):
            if name.startswith(prefix):
                return g
        return "rest"
    tx = optax.multi_transform({g: optax.set_to_zero() if t is None else t for g, t in lrs.items()},
                               lambda params: {k: label(k) for k in params})
    params = ref.params
    assert params.keys() == L.params.keys()
    for k in params:
        np.testing.assert_array_equal(params[k], L.params[k])
    opt = tx.init(params)
    p_init = dict(params)
    for x in xs:
        applied = L.step(x).applied
        assert ref.step(x).applied == applied
        if not applied:
            continue        # the first forecast step has no target yet: no optimizer step
        grads = {k: params[k] - v for k, v in ref.params.items()}    # sgd(1): new = old - g
        updates, opt = tx.update(grads, opt, params)
        params = {k: np.asarray(v) for k, v in optax.apply_updates(params, updates).items()}
        s = ref.state_dict()
        s.update({f"params.{k}": v for k, v in params.items()})
        ref.load_state_dict(s)
    got = L.params
    for k in params:
        np.testing.assert_allclose(got[k], params[k], rtol=1e-9, atol=1e-11, err_msg=k)
    for k in got:     # the comparison is not vacuous: all but the frozen group moved
        assert np.array_equal(got[k], p_init[k]) == k.startswith("cell.r."), k


def test_a_parameter_in_no_group_is_a_clear_error():
    groups = st.param_groups(readout=("out.*", optax.adam(1e-2)), cell=("cell.z.*", None))
    with pytest.raises(ValueError, match=r"cell\.n\.W.*matches no group"):
        st.OnlineLearner(gru(), np.zeros(1, np.float32), mode="forecast", optimizer=groups)


def test_bad_group_specs_are_refused():
    with pytest.raises(ValueError, match="at least one group"):
        st.param_groups()
    with pytest.raises(TypeError, match="'a'"):
        st.param_groups(a="out.*")
    with pytest.raises(TypeError, match="not an optax transform"):
        st.param_groups(a=("out.*", 0.01))


def test_state_dict_names_are_readable_and_round_trip():
    groups = st.param_groups(readout=("out.*", optax.adam(1e-2)), frozen=("cell.r.*", None),
                             rest=("*", optax.sgd(1e-2)))
    L = st.OnlineLearner(gru(), np.zeros(1, np.float32), mode="forecast", optimizer=groups)
    for x in signal(5):
        L.step(x)
    s = L.state_dict()
    params = {k for k in s if k.startswith("params.")}
    assert params == {"params.readout.out.W", "params.readout.out.b", "params.frozen.cell.r.W",
                      "params.frozen.cell.r.b", "params.rest.cell.n.W", "params.rest.cell.n.b",
                      "params.rest.cell.z.W", "params.rest.cell.z.b"}
    for k, v in L.params.items():
        group = next(g for g in ("readout", "frozen", "rest") if f"params.{g}.{k}" in s)
        assert np.array_equal(s[f"params.{group}.{k}"], v)
    assert any(k.startswith("opt.") and k.endswith("readout.out.W") for k in s)
    # writing one named parameter back changes exactly that parameter
    s["params.rest.cell.n.b"] = np.full(8, 0.25, np.float32)
    L.load_state_dict(s)
    assert np.array_equal(L.params["cell.n.b"], np.full(8, 0.25, np.float32))
    assert np.array_equal(L.params["out.W"], s["params.readout.out.W"])


def test_groups_with_the_same_optimizer_equal_one_group_with_learn_every_and_clip(x64):
    """Adam is element-wise and clipping takes the global norm over all groups together, so
    splitting the weights into groups with the same settings changes nothing, also when
    gradients are summed over learn_every steps."""
    xs = signal(dtype=np.float64)
    kw = dict(mode="forecast", learn_every=3, clip=0.05)
    plain = st.OnlineLearner(gru(), np.zeros(1), optimizer=optax.adam(2e-2), **kw)
    grouped = st.OnlineLearner(gru(), np.zeros(1), **kw, optimizer=st.param_groups(
        readout=("out.*", optax.adam(2e-2)), rest=("*", optax.adam(2e-2))))
    for x in xs:
        a, b = plain.step(x), grouped.step(x)
        assert a.applied == b.applied
        np.testing.assert_allclose(b.prediction, a.prediction, rtol=1e-10, atol=1e-12)
    assert plain.stats()["updates"] == grouped.stats()["updates"] == T // 3
    for k, v in plain.params.items():
        np.testing.assert_allclose(grouped.params[k], v, rtol=1e-10, atol=1e-12, err_msg=k)


def test_a_readout_learns_alone_when_every_traced_weight_is_frozen():
    """Freezing every recurrent weight (no trace left) and training the readout: the readout's
    steps equal those of the same learner whose cell learns at rate 0 (traces kept, then unused)."""
    import optax

    def run(rest):
        L = st.OnlineLearner(st.nn.Stack("gru", 1, 4, 1, seed=3), np.zeros(1, np.float32),
                             optimizer=st.param_groups(readout=("out.*", optax.sgd(0.1)), rest=("*", rest)))
        start = {k: np.array(v) for k, v in L.params.items()}
        for t in range(6):
            L.step(np.float32([np.sin(t)]), np.float32([np.cos(t)]))
        return start, L.params
    (start, alone), (_, beside) = run(None), run(optax.sgd(0.0))
    assert not np.allclose(alone["out.W"], start["out.W"])              # the readout learned ...
    np.testing.assert_array_equal(alone["cell.z.W"], start["cell.z.W"])  # ... the cell did not
    for k in ("out.W", "out.b"):
        np.testing.assert_allclose(alone[k], beside[k], rtol=1e-6, atol=1e-7)
