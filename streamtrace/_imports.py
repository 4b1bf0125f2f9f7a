"""brainstate without matplotlib.

brainstate's unit library (saiunit) imports matplotlib, if installed, to register a unit
converter for plots of Quantities: ~0.7 s and ~25 MB on every start, engine included, before
anything is computed. streamtrace never plots Quantities, so brainstate is imported with
matplotlib hidden from that one check; matplotlib stays importable (our plots import it when
they draw). A program that imported matplotlib before streamtrace keeps saiunit's converter.
"""
from __future__ import annotations

import sys


def import_brainstate():
    if "brainstate" in sys.modules or "matplotlib" in sys.modules:
        import brainstate  # noqa: F401
        return
    sys.modules["matplotlib"] = None          # importlib.util.find_spec("matplotlib") -> None
    try:
        import brainstate  # noqa: F401
    finally:
        if sys.modules.get("matplotlib", 0) is None:
            del sys.modules["matplotlib"]
