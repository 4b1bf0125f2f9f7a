"""The README's example runs as written (its Python blocks under "## Example", in order, in a
fresh folder), and what it claims of the result holds: the forecaster learned the sine."""
from paths import ROOT
import os
import re
from pathlib import Path

import numpy as np

README = ROOT / "README.md"


def example_blocks() -> list[str]:
    text = README.read_text()
    section = text[text.index("\n## Example"):]
    section = section[:section.index("\n## ", 1)]
    return re.findall(r"```python\n(.*?)```", section, flags=re.S)


def test_the_readme_example_runs_and_learns(tmp_path, capsys):
    blocks = example_blocks()
    assert len(blocks) >= 2, "the README's Example section lost its code"
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        scope: dict = {}
        exec(compile(blocks[0], "README.md#example", "exec"), scope)
        assert (tmp_path / "ckpt.npz").exists()
        nrmse = float(np.asarray(scope["learner"].stats()["metrics"]["nrmse"]).reshape(-1)[0])
        assert nrmse < 0.3, nrmse           # a sine after 5,000 steps (predicting 0 scores 1.0)
        exec(compile(blocks[1], "README.md#example-reservoir", "exec"), scope)
        assert scope["learner"].step(np.zeros(1)).prediction.shape == (1,)
    finally:
        os.chdir(cwd)
        import brainstate
        brainstate.environ.set(precision=32)    # the second block switched to float64
    assert "weight" in capsys.readouterr().out  # explain() printed why each weight is traced
