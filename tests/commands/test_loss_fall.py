"""The demos' loss summary over a short run whose first steps have no loss (the learner's
warm-up): numbers computed by hand, no 'nan' printed, no RuntimeWarning."""
import math
import warnings

import numpy as np

from streamtrace.commands.demo import _summary
from streamtrace.commands.loss_fall import finite_mean, first_last, number_or_dash


def test_first_last_skip_the_steps_without_a_loss():
    losses = [math.nan] * 5 + [4.0, 2.0, 3.0, 1.0, 0.5, 0.25]
    assert first_last(losses, 2) == (3.0, 0.375)
    assert first_last([math.nan] * 3, 2)[0] != first_last([math.nan] * 3, 2)[0]     # NaN: nothing to average
    assert finite_mean([]) != finite_mean([])
    assert number_or_dash(math.nan, "10.4f") == " " * 9 + "-" and number_or_dash(0.5, "6.2f") == "  0.50"


def test_a_demo_shorter_than_the_warm_up_prints_no_nan(capsys):
    steps, tenth = 400, 40
    series = [np.sin(0.05 * np.arange(steps + 1)).astype(np.float32)]
    loss = np.full(steps, np.nan)
    loss[100:] = np.linspace(0.01, 0.001, steps - 100)        # no loss for the first 100 steps
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ratios = _summary(series, [loss], [steps], tenth)
    text = capsys.readouterr().out
    first, last = loss[100:140].mean(), loss[-40:].mean()
    assert "nan" not in text.lower()
    assert f"{first:10.4f} {last:10.5f} {first / last:5.1f}x" in text
    assert ratios == [first / last]
