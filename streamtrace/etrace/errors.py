"""Errors raised by the eligibility-trace compiler."""


class CompileError(ValueError):
    """The model cannot be handled correctly by the eligibility-trace algorithms.

    Raised at compile time, naming the state or weight at fault and what to change, so that
    no model ever runs with silently wrong gradients.
    """


class CompileWarning(UserWarning):
    """The model compiles, but some parameter learns from an approximate gradient
    (``ETraceGraph.explain()`` says which and why)."""
