"""Models for the online learner: recurrent cells, spiking and rate neurons, stacks, reservoirs.

Every model is a ``brainstate.nn.Module`` stepped once per sample; its hidden state lives in
brainstate states, and its weights go through the marked weight ops of ``ops`` so that the
eligibility-trace compiler (``streamtrace.etrace``) can see how each weight drives the state.

- ``Stack(kind, n_in, n_hidden, n_out)``: the ready-made model, one hidden layer of a kind in
  ``STACKS`` ("gru", "lstm", "rnn"; spiking "lif", "alif"; "leaky" rate neurons) and a linear
  readout.
- Cells and layers to build others: ``Linear``, ``RNNCell``, ``DiagRNNCell``, ``GRUCell``,
  ``LSTMCell``; neuron groups ``LIF``, ``ALIF``, ``LeakyRate``, ``LeakyRateReadout`` (with
  the surrogate-gradient ``spike``).
- Feature models under a closed-form readout (``st.rls()``): ``Reservoir`` (a fixed
  echo-state network), ``Rotations`` (a bank of damped rotations: a learnable linear memory);
  ``Beside`` runs several models side by side on one input, their features concatenated.

>>> import brainstate, jax.numpy as jnp, streamtrace as st
>>> st.nn.STACKS
('gru', 'lstm', 'rnn', 'lif', 'alif', 'leaky')
>>> model = st.nn.Stack("gru", n_in=3, n_hidden=8, n_out=2)
>>> _ = brainstate.nn.init_all_states(model)  # the learner does this itself
>>> model(jnp.zeros(3)).shape                  # one step: the prediction
(2,)
"""
from .._imports import import_brainstate

import_brainstate()     # before brainstate is first imported: without matplotlib (see _imports)

from . import ops
from .beside import Beside
from .layers import DiagRNNCell, GRUCell, Linear, LSTMCell, RNNCell
from .neurons import ALIF, LIF, LeakyRate, LeakyRateReadout
from .reservoir import Reservoir
from .rotation import Rotations
from .stacks import STACKS, Stack
from .surrogate import spike

__all__ = ["ops", "spike", "Linear", "RNNCell", "DiagRNNCell", "GRUCell", "LSTMCell",
           "LIF", "ALIF", "LeakyRate", "LeakyRateReadout", "Reservoir", "Rotations", "Beside", "Stack", "STACKS"]
