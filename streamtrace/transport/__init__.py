"""The ZeroMQ transport to an engine (``serve``, or anything speaking its wire protocol):
``SensorClient`` (request/reply steps, labels), ``PushClient`` (fire and forget), the
``Subscriber`` and ``WeightsSubscriber`` of its PUB socket, and the echo server that measures
the transport's floor. jax-free: importing it loads pyzmq, msgpack and numpy only.

>>> from streamtrace.transport import SensorClient
>>> SensorClient.__module__
'streamtrace.transport.client'
"""
from .client import EngineError, Prediction, PushClient, SensorClient
from .subscriber import Subscriber, WeightsSubscriber

__all__ = ["SensorClient", "PushClient", "EngineError", "Prediction", "Subscriber", "WeightsSubscriber"]
