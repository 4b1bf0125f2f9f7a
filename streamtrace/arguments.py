"""The command line's parser and argument types: every bad argument is one line on stderr and
exit status 2, and every option's help shows its default.

:class:`Parser` is the ``argparse.ArgumentParser`` each ``streamtrace`` command is built with
(its sub-commands inherit it); the types below (:func:`positive_int`, :func:`port`, ...) refuse a
bad value while the command line is read, before anything starts.
"""
from __future__ import annotations

import argparse
import math
import os
import sys

__all__ = ["Parser", "HelpFormatter", "positive_int", "nonnegative_int", "positive_float",
           "nonnegative_float", "port", "existing_file", "output_file", "index_list",
           "STACK_CHOICES"]

# the built-in stacks (streamtrace.nn.STACKS, named here so that reading the command line loads no jax)
STACK_CHOICES = ("gru", "lstm", "rnn", "lif", "alif", "leaky")


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Descriptions as written; each option's help ends with its default unless it names one
    already (a flag's default, off, is not shown).

    Example::

        >>> p = argparse.ArgumentParser(formatter_class=HelpFormatter)
        >>> _ = p.add_argument("--rate", type=float, default=10.0, help="updates per second")
        >>> "updates per second (default: 10.0)" in p.format_help()
        True
    """

    def _get_help_string(self, action):
        text = action.help or ""
        if "default" in text.lower() or action.nargs == 0 or action.default is argparse.SUPPRESS:
            return text
        if not action.option_strings and action.nargs not in ("?", "*"):
            return text                       # a required positional has no default
        shown = "none" if action.default is None else "%(default)s"
        return f"{text} (default: {shown})".strip()


class Parser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose errors are one line on stderr and exit status 2, and whose help
    shows defaults (:class:`HelpFormatter`); sub-command parsers are made of the same class.

    Example::

        >>> p = Parser(prog="x"); _ = p.add_argument("--n", type=positive_int, default=1, help="count")
        >>> p.parse_args(["--n", "3"]).n
        3
    """

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message):
        print(f"{self.prog}: error: {' '.join(str(message).split())}", file=sys.stderr)
        self.exit(2)


def _number(kind, text: str, what: str, ok) -> float | int:
    try:
        value = kind(text)
    except (TypeError, ValueError):
        raise argparse.ArgumentTypeError(f"expected {what}; got {text!r}") from None
    if (kind is float and not math.isfinite(value)) or not ok(value):
        raise argparse.ArgumentTypeError(f"expected {what}; got {text!r}")
    return value


def positive_int(text: str) -> int:
    """An integer >= 1 (argparse type). Example: ``positive_int("4")`` is 4."""
    return _number(int, text, "an integer >= 1", lambda v: v >= 1)


def nonnegative_int(text: str) -> int:
    """An integer >= 0 (argparse type). Example: ``nonnegative_int("0")`` is 0."""
    return _number(int, text, "an integer >= 0", lambda v: v >= 0)


def positive_float(text: str) -> float:
    """A finite number > 0 (argparse type). Example: ``positive_float("1e-3")`` is 0.001."""
    return _number(float, text, "a number > 0", lambda v: v > 0)


def frequency(text: str) -> float:
    """A rate > 0 in hertz: a number, or a frequency such as "250 Hz" or "2 kHz" (argparse type;
    streamtrace.units). Example: ``frequency("2 kHz")`` is 2000.0."""
    from .units import UnitError, to_hz
    try:
        hz = to_hz(text, key="")
    except UnitError as e:
        raise argparse.ArgumentTypeError(f"expected a number > 0 or a frequency such as '250 Hz'; got {text!r} "
                                         f"({e.problem})") from None
    if not (math.isfinite(hz) and hz > 0):
        raise argparse.ArgumentTypeError(f"expected a number > 0 or a frequency such as '250 Hz'; got {text!r}")
    return hz


def nonnegative_float(text: str) -> float:
    """A finite number >= 0 (argparse type). Example: ``nonnegative_float("0")`` is 0.0."""
    return _number(float, text, "a number >= 0", lambda v: v >= 0)


def port(text: str) -> int:
    """A TCP port, 0..65535 (argparse type; 0: any free port). Example: ``port("5555")`` is 5555."""
    return _number(int, text, "a port 0..65535", lambda v: 0 <= v < 65536)


def existing_file(text: str) -> str:
    """A path to a file that exists (argparse type, for configs and inputs).

    Example: ``existing_file(__file__)`` is that path."""
    if not os.path.isfile(text):
        raise argparse.ArgumentTypeError(f"no such file: {text!r}")
    return text


def output_file(text: str) -> str:
    """A path a file can be written to: its folder exists ('' for none; argparse type).

    Example: ``output_file("plot.png")`` is "plot.png" (the current folder)."""
    folder = os.path.dirname(text) or "."
    if text and (os.path.isdir(text) or not os.path.isdir(folder)):
        raise argparse.ArgumentTypeError(f"cannot write {text!r}: " +
                                         ("it is a folder" if os.path.isdir(text) else f"no folder {folder!r}"))
    return text


def index_list(text: str) -> list[int]:
    """Comma-separated positions, each an integer >= 0 (argparse type).

    Example: ``index_list("1, 2")`` is [1, 2]."""
    parts = [p.strip() for p in text.split(",") if p.strip()]
    if not parts or not all(p.isdigit() for p in parts):
        raise argparse.ArgumentTypeError(f"expected positions 0, 1, ... separated by commas; got {text!r}")
    return [int(p) for p in parts]
