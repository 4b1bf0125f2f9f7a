"""Transport edges, installed as ``streamtrace.adapters``: ZeroMQ sensor clients and
subscribers for predictions and weights."""
from .client import EngineError, Prediction, PushClient, SensorClient
from .subscriber import Subscriber, WeightsSubscriber

__all__ = ["SensorClient", "PushClient", "EngineError", "Prediction", "Subscriber", "WeightsSubscriber"]
