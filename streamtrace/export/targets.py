"""IREE compiler flags per export target (``--target`` of ``streamtrace export``)."""
from __future__ import annotations

__all__ = ["TARGETS", "compiler_flags"]

# target -> (LLVM triple or None for this machine's, what it is)
TARGETS = {
    "host": (None, "this machine's CPU and its instruction set extensions (fastest; runs here only)"),
    "x86_64": ("x86_64-unknown-linux-gnu", "any 64-bit x86 Linux CPU"),
    "aarch64": ("aarch64-unknown-linux-gnu", "any 64-bit ARM Linux CPU (Raspberry Pi 4/5, Jetson, Graviton)"),
}

_COMMON = [
    "--iree-hal-target-device=local",
    "--iree-hal-local-target-device-backends=llvm-cpu",
    # IREE narrows float64 and int64 programs to 32 bits unless told not to: the exported
    # program computes in the learner's own precision
    "--iree-input-demote-f64-to-f32=false",
    "--iree-input-demote-i64-to-i32=false",
    # each dispatch as one workgroup: the runner calls the module on one thread (IREE's
    # local-sync driver), where splitting a dispatch into workgroups only adds calls (the
    # default learner's step: 12% faster, the same results)
    "--iree-llvmcpu-disable-distribution",
    # a dispatch's mutable bindings into one buffer where they share it (the default's step
    # 3-8% faster in IREE's own benchmark, the same results)
    "--iree-stream-resource-alias-mutable-bindings=true",
    # vector sizes chosen for speed, the last partial vector of a row done apart ("peel"), not
    # sizes that divide the row's length (a row of 218: vectors of two)
    "--iree-llvmcpu-vector-pproc-strategy=peel",
]


def compiler_flags(target: str) -> list[str]:
    """The ``iree.compiler.compile_str`` flags for ``target`` (a key of ``TARGETS``); the
    executables are IREE's portable embedded ELF, with no libc or libm to link.

    >>> compiler_flags("aarch64")[-1]
    '--iree-llvmcpu-target-triple=aarch64-unknown-linux-gnu'
    """
    if target not in TARGETS:
        raise ValueError(f"unknown target {target!r}: one of {', '.join(TARGETS)}")
    triple = TARGETS[target][0]
    # a named triple: its baseline instruction set ("generic"), so the module runs on every
    # CPU of that architecture
    return _COMMON + (["--iree-llvmcpu-target-cpu=host"] if triple is None
                      else ["--iree-llvmcpu-target-cpu=generic", f"--iree-llvmcpu-target-triple={triple}"])
