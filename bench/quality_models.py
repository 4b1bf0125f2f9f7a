"""Model factories for the quality benchmark's configs (``model.factory = "quality_models:..."``;
bench/ is on the path when bench/quality.py runs): spiking stacks with the settings that beat
persistence on Mackey-Glass (bench/readout_choice.py measured them)."""
from streamtrace.nn import Stack


def lif256():
    return Stack("lif", 1, 256, 1, tau=(1.0, 30.0), bias_spread=1.0, gain=2.0)


def alif256():
    return Stack("alif", 1, 256, 1, tau=(1.0, 30.0), bias_spread=1.0, gain=4.0)
