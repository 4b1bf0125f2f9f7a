"""The exported step runs as one command buffer: IREE's schedule of it (``--compile-to=stream``)
has the host wait for the device once, at the end, and read no value back on the way. A
select on one scalar flag (the rollback's), or an optimisation barrier (the learner's, kept
for XLA: learner/barriers.py), each made the host wait mid-step; the default learner's step
took 94 against 82 µs a call with them (docs/devices.md). A constant written into part of an
array (the period search's left neighbours began with one) became a copy IREE ran as a command
buffer of its own before the step's."""
from __future__ import annotations

import re

import pytest

from streamtrace.export.learner import learner_from_config
from streamtrace.export.program import programs_of
from streamtrace.export.targets import compiler_flags

CONFIGS = {"default": None, "gru-d-rtrl": '[model]\nstack = "gru"\nn_hidden = 16\n[learning]\nalgorithm = "d-rtrl"\n'}


def _schedule(text: str) -> str:
    """The body of @main in IREE's stream-level program of ``text``."""
    import iree.compiler as ic
    out = ic.compile_str(text, input_type="stablehlo", extra_args=compiler_flags("host") + ["--compile-to=stream"])
    stream = out.decode() if isinstance(out, bytes) else out
    return stream[stream.index("util.func public @main"):]


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_the_exported_step_has_the_host_wait_once(name, tmp_path):
    config = None
    if CONFIGS[name]:
        config = tmp_path / "config.toml"
        config.write_text(CONFIGS[name])
    step = programs_of(learner_from_config(config)[1])[0]
    assert step.name == "step" and "optimization_barrier" not in step.text
    main = _schedule(step.text)
    assert main.count("stream.timepoint.await") == 1, "the host waits for the device mid-step"
    # one command buffer a call (no constant copied in one of its own before the step)
    assert len(re.findall(r"stream\.cmd\.execute (?!once)", main)) == 1, "the step runs as several command buffers"
    assert not re.search(r"stream\.(resource|async)\.load", main), "a value read back mid-step"
