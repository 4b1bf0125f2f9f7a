"""float64 ``tanh`` without libm, rewritten in a StableHLO program's text.

IREE's llvm-cpu backend computes float64 ``exp`` and ``expm1`` in the program, but calls libm's
``tanh``, which the portable (embedded) executables it links cannot reach: a cross-compiled
module fails to link ("undefined symbol: tanh"). Every float64 ``stablehlo.tanh`` is therefore
replaced by a call to a function computing ``sign(x) * -e / (e + 2)`` with ``e = expm1(-2|x|)``
(no cancellation for small x, exact limits +-1 for large |x|, NaN kept). One program for every
target: the x86-64 and the aarch64 module compute the same expression.
"""
from __future__ import annotations

import re

__all__ = ["rewrite_tanh64"]

# `%12 = stablehlo.tanh %11 : tensor<1x200xf64> loc(#loc7)` (the form jax prints)
_TANH = re.compile(r"^(\s*)(%[\w.$-]+) = stablehlo\.tanh (%[\w.$#-]+) : (tensor<([0-9x]*)f64>)(.*)$")


def _function(name: str, t: str) -> str:
    return f"""  func.func private @{name}(%x: {t}) -> {t} {{
    %a = stablehlo.abs %x : {t}
    %m2 = stablehlo.constant dense<-2.0> : {t}
    %t = stablehlo.multiply %a, %m2 : {t}
    %e = stablehlo.exponential_minus_one %t : {t}
    %two = stablehlo.constant dense<2.0> : {t}
    %d = stablehlo.add %e, %two : {t}
    %q = stablehlo.divide %e, %d : {t}
    %n = stablehlo.negate %q : {t}
    %s = stablehlo.sign %x : {t}
    %r = stablehlo.multiply %n, %s : {t}
    return %r : {t}
  }}"""


def rewrite_tanh64(text: str) -> tuple[str, int]:
    """(text, count): the module ``text`` with its ``count`` float64 tanh ops calling a
    libm-free function (one per tensor shape, added at the top of the module).

    >>> src = ("module @m {\\n  func.func public @main(%arg0: tensor<3xf64>) -> tensor<3xf64> {\\n"
    ...        "    %0 = stablehlo.tanh %arg0 : tensor<3xf64>\\n    return %0 : tensor<3xf64>\\n  }\\n}")
    >>> out, n = rewrite_tanh64(src)
    >>> n, "stablehlo.tanh" in out, "func.call @streamtrace_tanh64_3(%arg0)" in out
    (1, False, True)
    """
    lines, functions, count = [], {}, 0
    for line in text.split("\n"):
        m = _TANH.match(line)
        if m:
            indent, result, arg, t, dims, rest = m.groups()
            name = "streamtrace_tanh64_" + (dims.rstrip("x").replace("x", "_") or "scalar")
            functions.setdefault(name, _function(name, t))
            line = f"{indent}{result} = func.call @{name}({arg}) : ({t}) -> {t}{rest}"
            count += 1
        lines.append(line)
    if not count:
        return text, 0
    top = next(i for i, line in enumerate(lines) if line.startswith("module")) + 1
    return "\n".join(lines[:top] + list(functions.values()) + lines[top:]), count
