"""Which part of a learner a program's source location belongs to, so that a refused export
names it: IREE's compiler reports the first operation it cannot compile with the jax source
line that made it (``.../streamtrace/learner/screen.py:88:15: error: ...``); the part is the
config key (or section) whose code that file holds."""
from __future__ import annotations

import re

__all__ = ["PARTS", "part_of", "refusal"]

# a file (or folder) of the package -> the part of a learner it implements, by its config key
PARTS = {
    "learner/labels.py": "learning.label_delay (the delayed-label ring)",
    "learner/rls.py": 'readout.kind = "rls"', "learner/lagged_rls.py": 'readout.kind = "rls"',
    "learner/adaptive_forgetting.py": "readout.change_lam (adaptive forgetting)",
    "learner/screen.py": "[screen] (outlier screening)", "learner/rollback.py": "the glitch rollback",
    "learner/experts.py": "combine.experts", "learner/period.py": "combine.period / combine.max_period",
    "learner/normalise.py": "transform.normalise", "learner/residual.py": "transform.residual",
    "learner/feedback.py": "transform.feedback", "learner/transforms.py": "[transform]",
    "learner/adam.py": "learning.optimizer", "learner/optimizers.py": "learning.optimizer",
    "learner/groups.py": "learning.optimizer", "learner/losses.py": "the loss",
    "learner/rolling.py": "[metrics] (rolling metrics)", "learner/algorithms.py": "learning.algorithm",
    "etrace/": "learning.algorithm (the eligibility traces)", "nn/": "model.stack (the model's cells)",
    "learner/": "the learning step",
}
_LOCATION = re.compile(r"(?P<path>[^\s:]+\.py):(?P<line>\d+)(?::\d+)?:\s*error:\s*(?P<why>.*)")


def part_of(path: str) -> str:
    """The part of the learner whose code is the source file ``path`` (a user's model outside
    the package: ``model.factory``).

    >>> part_of("/x/streamtrace/learner/screen.py"), part_of("/x/streamtrace/nn/stacks.py")
    ('[screen] (outlier screening)', "model.stack (the model's cells)")
    >>> part_of("/home/me/my_model.py")
    'model.factory (your model)'
    """
    norm = path.replace("\\", "/")
    if "/streamtrace/" not in norm:
        return "model.factory (your model)"
    inside = norm.rsplit("/streamtrace/", 1)[1]
    return next((part for key, part in PARTS.items() if inside.startswith(key)), "the learning step")


def refusal(program: str, target: str, compiler_output: str) -> str:
    """One line: which program, which part (from the first error's source location) and why.

    >>> refusal("label", "aarch64", "x\\n/a/streamtrace/learner/labels.py:88:15: error: 'scatter' op bad\\n")
    "IREE cannot compile the label program for aarch64: learning.label_delay (the delayed-label ring), at streamtrace/learner/labels.py:88: 'scatter' op bad"
    """
    for line in compiler_output.splitlines():
        m = _LOCATION.search(line)
        if m:
            path = m["path"].replace("\\", "/")
            short = "streamtrace/" + path.rsplit("/streamtrace/", 1)[1] if "/streamtrace/" in path else path
            return (f"IREE cannot compile the {program} program for {target}: {part_of(path)}, at "
                    f"{short}:{m['line']}: {m['why'].strip()}")
    first = next((line for line in compiler_output.splitlines() if "error" in line), compiler_output.strip()[:200])
    return f"IREE cannot compile the {program} program for {target}: {' '.join(first.split())}"
