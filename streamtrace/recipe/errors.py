"""The one error a recipe or a config raises for a bad value."""
from __future__ import annotations

__all__ = ["ConfigError"]


class ConfigError(ValueError):
    """A configuration value is missing, of the wrong type, or inconsistent.

    ``ConfigError("section.key", "what is wrong")`` reads ``section.key: what is wrong``, the
    one line ``streamtrace serve`` prints; ``key`` names the blamed setting."""

    def __init__(self, key: str, problem: str | None = None):
        self.key = key if problem is not None else ""
        super().__init__(key if problem is None else f"{key}: {problem}")

