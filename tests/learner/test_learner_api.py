"""The learner as parts: its settings are values (an algorithm, optax transforms, Slots,
CompileSettings, Metrics, modes), at most ten keywords; every old keyword still works for a
release, warns naming its new form, and gives the same learner bit for bit as that form."""
import inspect
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import streamtrace as st
from streamtrace import nn

N_IN, N_OUT, STEPS = 3, 2, 6


def test_the_learner_takes_at_most_ten_keywords():
    params = inspect.signature(st.OnlineLearner).parameters.values()
    keywords = [p.name for p in params if p.kind == p.KEYWORD_ONLY]
    assert len(keywords) <= 10, keywords
    assert {"algorithm", "optimizer", "mode", "transform", "readout", "combine", "slots"} <= set(keywords)


def _model(kind="gru"):
    return nn.Stack(kind, N_IN, 8, N_OUT, seed=0)


def _reservoir():
    return nn.Reservoir(N_IN, 12, seed=3)


def _run(L, slots=None, forecast=False):
    """A few steps' predictions and losses, the final state and stats."""
    rng = np.random.default_rng(1)
    lead = () if slots is None else (slots,)
    got = []
    for _ in range(STEPS):
        x = rng.normal(size=lead + (N_IN,)).astype(np.float32)
        y = None if forecast else rng.normal(size=lead + L.out_shape).astype(np.float32)
        r = L.step(x, y)
        got += [np.asarray(r.prediction), np.asarray(r.loss)]
    return got, L.state_dict(), L.stats()


def _same(a, b):
    got_a, state_a, stats_a = a
    got_b, state_b, stats_b = b
    for u, v in zip(got_a, got_b):
        np.testing.assert_array_equal(u, v)
    assert state_a.keys() == state_b.keys()
    for k in state_a:
        np.testing.assert_array_equal(state_a[k], state_b[k], err_msg=k)
    assert {k: v for k, v in stats_a.items() if k not in ("prequential_loss", "metrics")} == \
        {k: v for k, v in stats_b.items() if k not in ("prequential_loss", "metrics")}
    np.testing.assert_array_equal(stats_a["prequential_loss"], stats_b["prequential_loss"])


# (old keywords, the same in the new form, model, slots of the run, forecast)
CASES = {
    "decay": (dict(algorithm="es-d-rtrl", decay=0.7), dict(algorithm=st.es_d_rtrl(decay=0.7)), _model, None, False),
    "rank": (dict(algorithm="es-d-rtrl", rank=1), dict(algorithm=st.es_d_rtrl(rank=1)), _model, None, False),
    "signal": (dict(algorithm="d-rtrl", signal=st.etrace.KappaFilter(0.5)),
               dict(algorithm=st.d_rtrl(signal=st.etrace.KappaFilter(0.5))), _model, None, False),
    "lr": (dict(lr=1e-2), dict(optimizer=st.adam(1e-2)), _model, None, False),
    "clip": (dict(clip=0.05), dict(optimizer=optax.chain(optax.clip_by_global_norm(0.05), st.adam(1e-3))),
             _model, None, False),
    "clip-sgd": (dict(clip=0.05, optimizer=optax.sgd(0.1)),
                 dict(optimizer=optax.chain(optax.clip_by_global_norm(0.05), optax.sgd(0.1))), _model, None, False),
    "learn_every": (dict(learn_every=3), dict(mode=st.Supervised(learn_every=3)), _model, None, False),
    "learn_every-forecast": (dict(mode="forecast", learn_every=2), dict(mode=st.Forecast(learn_every=2)),
                             lambda: nn.Stack("gru", N_IN, 8, N_IN, seed=0), None, True),
    "shared_weights": (dict(slots=4, shared_weights=False), dict(slots=st.Slots(4, shared=False)), _model, 4, False),
    "reduce": (dict(slots=4, reduce="sum"), dict(slots=st.Slots(4, reduce="sum")), _model, 4, False),
    "batch_size": (dict(batch_size=None), dict(compile=st.CompileSettings(batch_size=None)), _model, None, False),
    "donate": (dict(donate=False), dict(compile=st.CompileSettings(donate=False)), _model, None, False),
    "standalone": (dict(standalone=16), dict(compile=st.CompileSettings(standalone=16)), _model, None, False),
    "window": (dict(window=3), dict(metrics=st.Metrics(window=3)), _model, None, False),
    "frozen": (dict(optimizer="frozen", readout=st.rls(N_OUT)), dict(optimizer=st.frozen(), readout=st.rls(N_OUT)),
               _reservoir, None, False),
}


@pytest.mark.parametrize("case", list(CASES))
def test_an_old_keyword_warns_and_gives_its_new_form_bit_for_bit(case):
    old, new, model, slots, forecast = CASES[case]
    name = case.split("-")[0]
    match = 'optimizer="frozen"' if name == "frozen" else f"OnlineLearner\\({name}="
    with pytest.warns(DeprecationWarning, match=match) as caught:
        a = st.OnlineLearner(model(), np.zeros(N_IN, np.float32), **old)
    assert all(w.filename == __file__ for w in caught if issubclass(w.category, DeprecationWarning))
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)      # the new form: no warning
        b = st.OnlineLearner(model(), np.zeros(N_IN, np.float32), **new)
    assert a.signature() == b.signature()
    assert (a.fns.in_place, a.donate, a.per_slot) == (b.fns.in_place, b.donate, b.per_slot)
    run_a, run_b = _run(a, slots, forecast), _run(b, slots, forecast)
    _same(run_a, run_b)
    if name == "window":
        for k, v in run_a[2]["metrics"].items():
            np.testing.assert_array_equal(v, run_b[2]["metrics"][k])


def test_each_old_keyword_names_its_new_form():
    from streamtrace.learner.old_keywords import OLD_KEYWORDS
    old = {"decay", "rank", "signal", "lr", "clip", "learn_every", "shared_weights", "reduce", "batch_size",
           "donate", "standalone", "window"}
    assert set(OLD_KEYWORDS) == old
    assert all("=" in form for form in OLD_KEYWORDS.values())


@pytest.mark.parametrize("kw, match", [
    (dict(windw=3), "unexpected keyword argument 'windw'"),
    (dict(window=3, metrics=st.Metrics(5)), "window in Metrics"),
    (dict(donate=True, compile=st.CompileSettings()), "donate in CompileSettings"),
    (dict(decay=0.5, algorithm=st.es_d_rtrl()), "decay/rank/signal in the algorithm value"),
    (dict(slots=st.Slots(2), shared_weights=False), "shared_weights/reduce in slots"),
    (dict(learn_every=2, mode=st.Supervised(learn_every=3)), "learn_every in the mode value"),
    (dict(metrics=1000), "metrics must be st.Metrics"),
    (dict(compile=True), "compile must be st.CompileSettings"),
    (dict(optimizer="adam"), "optimizer must be an optax transform"),
    (dict(algorithm=3), "algorithm must be an Algorithm"),
    (dict(optimizer=optax.chain(optax.scale(0.5), st.frozen())), "frozen\\(\\) and param_groups"),
])
def test_bad_settings_are_refused_naming_them(kw, match):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        with pytest.raises(TypeError, match=match):
            st.OnlineLearner(_model(), np.zeros(N_IN, np.float32), **kw)


@pytest.mark.parametrize("make, match", [
    (lambda: dict(slots=0), "slots must be an integer >= 1"),
    (lambda: dict(mode=st.Supervised(learn_every=0)), "learn_every must be an integer >= 1"),
    (lambda: dict(algorithm=st.Algorithm("d-rtrl", decay=0.5)), "decay/rank apply to es-d-rtrl only"),
    (lambda: dict(algorithm="nope"), "unknown algorithm 'nope'"),
    (lambda: dict(optimizer=optax.chain(optax.clip_by_global_norm(-1.0), st.adam())), "max_norm must be > 0"),
])
def test_bad_values_are_refused_naming_them(make, match):
    with pytest.raises(ValueError, match=match):
        st.OnlineLearner(_model(), np.zeros(N_IN, np.float32), **make())


def test_clipped_adam_steps_in_place_and_follows_optax_chain():
    """optax.chain(clip_by_global_norm, st.adam) is recognised: the learner updates in place
    (as st.adam alone), and follows a twin running optax's own chain (as in test_adam.py)."""
    clip = 0.05
    ours = st.OnlineLearner(_model(), np.zeros(N_IN, np.float32),
                            optimizer=optax.chain(optax.clip_by_global_norm(clip), st.adam(1e-2)))
    ref = st.OnlineLearner(_model(), np.zeros(N_IN, np.float32),
                           optimizer=optax.chain(optax.clip_by_global_norm(clip), optax.adam(1e-2)))
    assert ours.fns.in_place and ours.donate and not ref.fns.in_place
    assert ours.signature()["optimizer"] == ref.signature()["optimizer"]
    rng = np.random.default_rng(2)
    xs = rng.normal(size=(100, N_IN)).astype(np.float32)
    ys = np.tanh(np.cumsum(xs[:, :N_OUT], axis=0) * 0.3).astype(np.float32)
    for x, y in zip(xs, ys):
        a, b = ours.step(x, y), ref.step(x, y)
        np.testing.assert_allclose(a.prediction, b.prediction, rtol=1e-4, atol=1e-5)
    assert ours.stats()["updates"] == ref.stats()["updates"] == 100
    for k, v in ref.params.items():
        np.testing.assert_allclose(ours.params[k], v, rtol=1e-4, atol=1e-5)


def test_param_groups_is_an_optax_transform_over_named_parameters():
    groups = st.param_groups(out=("out.*", optax.sgd(0.5)), fixed=("cell.*", None))
    assert isinstance(groups, optax.GradientTransformation)
    params = {"out.w": jnp.ones(3), "cell.w": jnp.ones(2)}
    updates, _ = groups.update({"out.w": jnp.ones(3), "cell.w": jnp.ones(2)}, groups.init(params), params)
    np.testing.assert_array_equal(updates["out.w"], -0.5 * np.ones(3))
    np.testing.assert_array_equal(updates["cell.w"], np.zeros(2))
    with pytest.raises(ValueError, match="parameter 'other' matches no group"):
        groups.init({"other": jnp.ones(1)})


def test_frozen_is_an_optax_transform_and_freezes_the_model():
    tx = st.frozen()
    assert isinstance(tx, optax.GradientTransformation)
    updates, _ = tx.update({"w": jnp.ones(2)}, tx.init({"w": jnp.ones(2)}))
    np.testing.assert_array_equal(updates["w"], np.zeros(2))
    L = st.OnlineLearner(_reservoir(), np.zeros(N_IN, np.float32), optimizer=st.frozen(), readout=st.rls(N_OUT))
    before = L.params
    _run(L)
    assert L.signature()["frozen"] and L.fns.opt is None
    assert all(np.array_equal(before[k], v) for k, v in L.params.items())


def test_algorithm_values_and_names_build_the_same_algorithm():
    assert st.es_d_rtrl() == st.Algorithm("es-d-rtrl", decay=0.9)
    for name, value in (("d-rtrl", st.d_rtrl()), ("es-d-rtrl", st.es_d_rtrl()), ("pp-prop", st.es_d_rtrl()),
                        ("rtrl", st.rtrl())):
        a = st.OnlineLearner(_model(), np.zeros(N_IN, np.float32), algorithm=name)
        b = st.OnlineLearner(_model(), np.zeros(N_IN, np.float32), algorithm=value)
        assert type(a.algo) is type(b.algo) and a.signature() == b.signature()


def test_the_engine_programs_live_on_learner_programs():
    L = st.OnlineLearner(_model(), np.zeros(N_IN, np.float32), slots=2)
    for name in ("compiled", "compiled_subset", "compiled_loop", "step_unchecked", "decode", "pure_step"):
        assert not hasattr(L, name), name
    P = L.programs
    x, y, a = P.example_inputs(None)
    L.buffers, vec = P.run(L.buffers, x, y, a, a)
    r = P.decode(vec)
    assert r.prediction.shape == (2, N_OUT) and P.is_compiled(None) and P.keys() == [None]
    L.buffers, rows = P.run_subset(L.buffers, np.int32([1]), 1, x[None, :1], y[None, :1], a[None, :1], a[None, :1])
    assert P.decode(rows[0], m=1).prediction.shape == (1, N_OUT) and P.is_compiled(("subset", 1, 1))
    assert jax.tree_util.tree_structure(L.read_slot(0)) == jax.tree_util.tree_structure(P.slot_struct())
