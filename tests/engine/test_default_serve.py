"""The one default: ``streamtrace serve`` with a config that names no model serves the default
learner (recipe/defaults.py DEFAULT_LEARNER), the one ``evaluate`` scores. Through a real engine
process and ``streamtrace replay --serve`` it forecasts Mackey-Glass, and its answers are
scored here again from the predictions it wrote (an independent recomputation)."""
import json
import shutil
import tempfile
from pathlib import Path

import numpy as np
import pytest

from streamtrace.commands.cli import main
from streamtrace.engine.launch import write_config
from streamtrace.engine import load_config
from streamtrace.evaluation.scoring import default_config
from streamtrace.evaluation.tasks import get_task


def test_a_config_that_names_no_model_is_the_default_learner():
    cfg = load_config(None, {"sockets": {"router": "ipc:///tmp/x"}})
    task = get_task("mackey-glass", 100)
    want = default_config(task)
    for section, values in want.items():
        for key, value in values.items():
            assert getattr(getattr(cfg, section), key) == value, f"{section}.{key}"
    # ... and that is the learner the README documents (not only what DEFAULT_LEARNER says today)
    assert (cfg.model.stack, cfg.model.n_hidden, cfg.model.precision, cfg.transform.normalise, cfg.transform.normalise_rate,
            cfg.transform.residual, cfg.readout.kind, cfg.learning.optimizer, cfg.combine.experts) == \
        ("reservoir", 200, 64, True, 0.003, True, "rls", "frozen", True)
    assert (cfg.learned.stack, cfg.learned.n_hidden, cfg.learned.optimizer, cfg.learned.lr) == ("gru", 16, "sgd", 3e-3)
    # the user can turn the learned cell off; a named stack gets none
    assert load_config(None, {"model": {"stack": "gru"}}).learned.stack == ""
    assert load_config(None, {"learned": {"stack": ""}}).learned.stack == ""
    # a key the config sets wins; a named stack keeps its own defaults (no preset)
    assert load_config(None, {"model": {"n_hidden": 50}}).model.n_hidden == 50
    gru = load_config(None, {"model": {"stack": "gru"}})
    assert (gru.model.n_hidden, gru.readout.kind, gru.learning.optimizer, gru.combine.experts) == (32, "", "adam", False)
    sup = load_config(None, {"learning": {"mode": "supervised"}})
    assert sup.transform.residual is False and sup.transform.normalise and sup.combine.experts
    # seasons are detected (2..59 steps) unless a period is given or detection is turned off
    assert (cfg.combine.max_period, cfg.combine.period) == (60, 0)
    assert (load_config(None, {"combine": {"period": 52}}).combine.max_period,
            load_config(None, {"combine": {"period": 52}}).combine.period) == (0, 52)
    assert load_config(None, {"combine": {"max_period": 0}}).combine.max_period == 0


@pytest.mark.slow
def test_default_serve_forecasts_mackey_glass_through_replay(tmp_path, capsys):
    series = get_task("mackey-glass", 6000, seed=0)
    x = np.concatenate([series.inputs[:, 0], series.targets[-1:, 0]])          # 6,001 samples
    csv = tmp_path / "mg.csv"
    np.savetxt(csv, x[:, None], delimiter=",", header="x", comments="", fmt="%.17g")
    sock = Path(tempfile.mkdtemp(prefix="st-", dir="/tmp"))
    try:
        cfg = write_config(tmp_path / "serve.toml", {"sockets": {"router": f"ipc://{sock}/r", "pull": "",
                                                                 "pub": ""}})
        out = tmp_path / "pred.csv"
        rc = main(["replay", str(csv), "--serve", str(cfg), "--window", "1000", "--out", str(out)])
    finally:
        shutil.rmtree(sock, ignore_errors=True)
    stdout = capsys.readouterr().out
    assert rc == 0, stdout
    summary = json.loads(stdout.strip().splitlines()[-1])
    assert summary["nrmse"] <= 3e-4, summary
    # recomputed from the written predictions: row r's prediction is of row r + 1
    got = np.loadtxt(out, delimiter=",", skiprows=1)
    rows, pred = got[:, 0].astype(int), got[:, 1]
    keep = rows + 1 < len(x)
    target = x[rows[keep] + 1]
    p = pred[keep][-1000:]
    y = target[-1000:]
    mine = np.sqrt(np.mean((p - y) ** 2)) / np.std(y)
    assert mine <= 3e-4 and abs(mine - summary["nrmse"]) <= 1e-6 + 1e-3 * mine, (mine, summary["nrmse"])
