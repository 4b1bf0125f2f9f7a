import brainstate
import pytest


@pytest.fixture
def x64():
    """float64 for gradient-correctness tests (brainstate's import resets jax's x64 flag)."""
    brainstate.environ.set(precision=64)
    yield
    brainstate.environ.set(precision=32)
