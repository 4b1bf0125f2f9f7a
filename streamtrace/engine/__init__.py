"""The streaming engine: ZeroMQ in, one compiled step per batch of messages, answers out.

The config names are imported at once; the engine itself (jax and the learner) only when first
used, so a bridge or a tool that reads the serve TOML does not pay for jax."""
from .config import ConfigError, EngineConfig, load_config

__all__ = ["EngineConfig", "ConfigError", "load_config", "build_model", "EngineCore", "Engine", "serve"]

_LAZY = {"EngineCore": ".core", "Engine": ".server", "serve": ".server", "build_model": "..recipe.build"}


def __getattr__(name):
    if name in _LAZY:
        import importlib
        return getattr(importlib.import_module(_LAZY[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
