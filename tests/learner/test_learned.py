"""[learned]: a trace-learned cell beside the configured model under its readout. Only the
cell's weights move; the reservoir's stay exactly as drawn; bad settings are refused by name."""
import numpy as np
import pytest

from streamtrace.recipe.build import build_learner
from streamtrace.engine.config import ConfigError, load_config
from streamtrace.evaluation.scoring import default_config
from streamtrace.evaluation.tasks import get_task


def test_only_the_learned_cell_moves_and_its_features_reach_the_readout():
    task = get_task("mackey-glass", 300, 0)
    data = default_config(task)
    data["learned"] = {"stack": "gru", "n_hidden": 4}
    learner = build_learner(load_config(None, overrides=data))
    before = learner.params
    assert {k.split(".")[0] for k in before} == {"fixed", "learned"}
    for x in task.inputs:
        learner.step(np.asarray(x))
    after = learner.params
    for k in before:
        moved = float(np.abs(after[k] - before[k]).max())
        assert (moved > 0) == k.startswith("learned."), (k, moved)
    n_features = 200 + 4 + 1 + 1          # reservoir + cell + input + bias
    assert learner.buffers is not None and any(b.shape[-2:] == (n_features, n_features) for b in learner.buffers)


@pytest.mark.parametrize("learned, readout, key", [
    ({"stack": "transformer"}, {"kind": "rls"}, "learned.stack"),
    ({"stack": "gru"}, {"kind": ""}, "learned.stack"),         # (a GRU stack: a reservoir needs rls anyway)
    ({"stack": "gru", "n_hidden": 0}, {"kind": "rls"}, "learned.n_hidden"),
    ({"stack": "gru", "optimizer": "lbfgs"}, {"kind": "rls"}, "learned.optimizer"),
    ({"stack": "gru", "lr": -1.0}, {"kind": "rls"}, "learned.lr"),
])
def test_bad_learned_settings_are_refused_by_name(learned, readout, key):
    model = {"stack": "reservoir" if readout["kind"] else "gru", "n_hidden": 8}
    data = {"model": model, "readout": readout, "learning": {"optimizer": "frozen"}, "learned": learned}
    with pytest.raises(ConfigError) as e:
        load_config(None, overrides=data)
    assert e.value.key == key, str(e.value)
