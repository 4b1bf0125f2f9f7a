"""Evaluation: data sets and generated tasks (``tasks``), reading recorded files (``files``), and
prequential scoring (``scoring``: predict, score, then learn, one step at a time), what
``streamtrace evaluate`` runs and ``replay`` scores with.

>>> from streamtrace.evaluation import get_task
>>> task = get_task("mackey-glass", 300)
>>> task.inputs.shape, task.mode
((300, 1), 'forecast')
"""
from .scoring import Result, evaluate, prequential
from .tasks import Task, get_task

__all__ = ["Task", "get_task", "Result", "evaluate", "prequential"]
