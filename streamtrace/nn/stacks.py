"""Built-in model stacks by name: what a config file or the CLI asks for."""
from __future__ import annotations

import brainstate
import jax
import numpy as np

from .layers import GRUCell, Linear, LSTMCell, RNNCell
from .neurons import ALIF, LIF, LeakyRate, LeakyRateReadout
from .rotation import Rotations

__all__ = ["Stack", "STACKS", "LEARNED_CELLS"]

CELLS = {"gru": GRUCell, "lstm": LSTMCell, "rnn": RNNCell}
NEURONS = {"lif": LIF, "alif": ALIF, "leaky": LeakyRate}
STACKS = tuple(CELLS) + tuple(NEURONS)
# cells a config may put beside a model under its readout ([learned] stack): their state is
# their output, read by the readout (a rotation bank's features, not one squashed output)
LEARNED_CELLS = {**CELLS, "rotation": Rotations}


class Stack(brainstate.nn.Module):
    """``kind`` in STACKS, with a readout to ``n_out``.

    Rate cells (gru, lstm, rnn) take the input themselves; neuron groups (lif, alif, leaky) are
    fed by an input Linear scaled by ``gain``. Both read out through a Linear (an instant
    weight), so D-RTRL is exact for the neuron stacks. ``readout="leaky"`` reads out through a
    leaky rate readout instead (a second hidden group, which smooths spikes): its input weight's
    D-RTRL gradient is then approximate, and it forecast Mackey-Glass worse in 35 of 37 measured
    settings and in the best setting of each kind (bench/readout_choice.py).
    Neuron stacks only: ``tau`` is the neurons' time constant in steps, or a (min, max) pair
    spread log-uniformly over the neurons (memory at several time scales); ``bias_spread``
    draws the input biases from U(-bias_spread, bias_spread) instead of zero.
    """

    def __init__(self, kind: str, n_in: int, n_hidden: int, n_out: int, *, readout: str | None = None,
                 gain: float = 2.0, tau: float | tuple[float, float] | None = None, bias_spread: float = 0.0,
                 seed: int = 0):
        super().__init__()
        kind = kind.lower()
        if kind not in STACKS:
            raise ValueError(f"unknown stack {kind!r}; choose one of {STACKS}")
        for name, v in (("n_in", n_in), ("n_hidden", n_hidden), ("n_out", n_out)):
            if not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be a positive integer; got {v!r}")
        k_in, k_out, k_b = jax.random.split(jax.random.PRNGKey(seed), 3)
        self.kind, self.gain = kind, gain
        if (tau is not None or bias_spread) and kind in CELLS:
            raise ValueError(f"tau and bias_spread apply to neuron stacks {tuple(NEURONS)}, not {kind!r}")
        if bias_spread < 0:
            raise ValueError(f"bias_spread must be >= 0; got {bias_spread}")
        if isinstance(tau, (tuple, list)):
            if len(tau) != 2 or not 0 < tau[0] <= tau[1]:
                raise ValueError(f"tau must be a positive number or a (min, max) pair; got {tau!r}")
            tau = np.geomspace(tau[0], tau[1], n_hidden)
        if kind in CELLS:
            self.inp = None
            self.cell = CELLS[kind](n_in, n_hidden, key=k_in)
        else:
            self.inp = Linear(n_in, n_hidden, key=k_in)
            # tau: the neurons' membrane / leak time constant in steps (their default if None)
            self.cell = NEURONS[kind](n_hidden) if tau is None else NEURONS[kind](n_hidden, tau=tau)
            if bias_spread:  # thresholds spread over the input range: no dead zone around x = 0
                self.inp.b.value = jax.random.uniform(k_b, (n_hidden,), self.inp.b.value.dtype,
                                                      -bias_spread, bias_spread)
        readout = readout or "linear"
        if readout == "linear":
            self.out = Linear(n_hidden, n_out, key=k_out)
        elif readout == "leaky":
            self.out = LeakyRateReadout(n_hidden, n_out, key=k_out)
        else:
            raise ValueError(f"readout must be 'linear' or 'leaky'; got {readout!r}")

    def update(self, x):
        h = self.cell(x) if self.inp is None else self.cell(self.inp(x) * self.gain)
        return self.out(h)
