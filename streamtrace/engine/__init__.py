"""The streaming engine: ZeroMQ in, one compiled step per batch of messages, answers out."""
from .config import ConfigError, EngineConfig, build_model, load_config
from .core import EngineCore
from .server import Engine, serve

__all__ = ["EngineConfig", "ConfigError", "load_config", "build_model", "EngineCore", "Engine", "serve"]
