"""Network building blocks: marked weight ops, rate cells, neuron groups."""
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
