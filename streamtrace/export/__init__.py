"""A learner compiled ahead of time for a jax-free runtime (IREE), on x86-64 and 64-bit ARM.

``streamtrace export --config FILE --out DIR`` writes a folder (``write.export_learner``): the
engine's one-slot step program as an IREE module, the initial state in the checkpoint format,
where each state array lives in the program's buffers, and a manifest. ``runner.Runner`` steps
that folder with numpy and ``iree.runtime`` only: this package's ``__init__`` imports nothing,
so that importing the runner never loads jax.
"""
