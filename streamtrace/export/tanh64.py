"""float64 ``tanh`` without libm, rewritten in a StableHLO program's text.

IREE's llvm-cpu backend computes float64 ``exp`` and ``expm1`` in the program, but calls libm's
``tanh``, which the portable (embedded) executables it links cannot reach: a cross-compiled
module fails to link ("undefined symbol: tanh"). Every float64 ``stablehlo.tanh`` is therefore
replaced by a call to a function computing ``sign(x) (1 - e) / (1 + e)`` with ``e = exp(-2|x|)``
where |x| >= 0.1 (IREE's float64 exp is within 2.2e-16 of libm's; limits +-1 exact, NaN kept),
and tanh's Taylor series to x^13 below (no cancellation; IREE's float64 expm1 is not accurate
for small arguments: 4e-10 off at 1e-8, 0 below 1e-16). One program for every
target: the x86-64 and the aarch64 module compute the same expression.
"""
from __future__ import annotations

import re

__all__ = ["rewrite_tanh64"]

# `%12 = stablehlo.tanh %11 : tensor<1x200xf64> loc(#loc7)` (the form jax prints)
_TANH = re.compile(r"^(\s*)(%[\w.$-]+) = stablehlo\.tanh (%[\w.$#-]+) : (tensor<([0-9x]*)f64>)(.*)$")


# tanh's odd Taylor series, x * (1 + x^2 (C[0] + x^2 (C[1] + ...))): for |x| < 0.1 the first
# term left out (1.5e-3 x^15) is under 2e-17 of x
_SERIES = (-1 / 3, 2 / 15, -17 / 315, 62 / 2835, -1382 / 155925, 21844 / 6081075)


def _function(name: str, t: str) -> str:
    b = t.replace("f64>", "i1>")
    horner = [f"    %h{len(_SERIES)} = stablehlo.constant dense<{_SERIES[-1]!r}> : {t}"]
    for i in range(len(_SERIES) - 1, 0, -1):
        horner += [f"    %c{i} = stablehlo.constant dense<{_SERIES[i - 1]!r}> : {t}",
                   f"    %p{i} = stablehlo.multiply %x2, %h{i + 1} : {t}",
                   f"    %h{i} = stablehlo.add %c{i}, %p{i} : {t}"]
    body = "\n".join(horner)
    return f"""  func.func private @{name}(%x: {t}) -> {t} {{
    %a = stablehlo.abs %x : {t}
    %m2 = stablehlo.constant dense<-2.0> : {t}
    %t = stablehlo.multiply %a, %m2 : {t}
    %e = stablehlo.exponential %t : {t}
    %one = stablehlo.constant dense<1.0> : {t}
    %num = stablehlo.subtract %one, %e : {t}
    %den = stablehlo.add %one, %e : {t}
    %q = stablehlo.divide %num, %den : {t}
    %s = stablehlo.sign %x : {t}
    %far = stablehlo.multiply %q, %s : {t}
    %x2 = stablehlo.multiply %x, %x : {t}
{body}
    %p0 = stablehlo.multiply %x2, %h1 : {t}
    %h0 = stablehlo.add %one, %p0 : {t}
    %near = stablehlo.multiply %x, %h0 : {t}
    %edge = stablehlo.constant dense<0.1> : {t}
    %small = stablehlo.compare LT, %a, %edge : ({t}, {t}) -> {b}
    %y = stablehlo.select %small, %near, %far : {b}, {t}
    return %y : {t}
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
