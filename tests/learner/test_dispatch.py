"""inline_dispatch: jax runs compiled CPU programs on the calling thread when asked before it
starts, and refuses (changing nothing) when asked too late: the setting is read once, when
jax's CPU backend starts."""
import subprocess
import sys

PROBE = """
from streamtrace.learner.dispatch import inline_dispatch
import jax, jax.numpy as jnp
first = inline_dispatch() if {inline} else None
jnp.zeros(1).block_until_ready()          # the backend starts here
print(first, inline_dispatch(), jax.config.read("jax_cpu_enable_async_dispatch"))
"""


def probe(inline: bool) -> list[str]:
    out = subprocess.run([sys.executable, "-c", PROBE.format(inline=inline)], capture_output=True, text=True,
                         timeout=120, env={"JAX_PLATFORMS": "cpu", "PATH": ""}, check=True)
    return out.stdout.split()


def test_asked_before_jax_starts_it_takes_effect_and_asked_late_it_is_refused():
    assert probe(True) == ["True", "False", "False"]


def test_without_it_jax_keeps_its_default():
    assert probe(False) == ["None", "False", "True"]
