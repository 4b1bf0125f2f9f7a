"""Per-stream losses: ``loss(prediction, target) -> scalar`` (mean over the output)."""
from __future__ import annotations

import jax
import jax.numpy as jnp

__all__ = ["get_loss", "LOSSES"]


def mse(pred, target):
    return jnp.mean((pred - target) ** 2)


def mae(pred, target):
    return jnp.mean(jnp.abs(pred - target))


def softmax_cross_entropy(logits, label_index):
    """``target`` is the class index (as a number)."""
    idx = jnp.asarray(label_index).astype(jnp.int32).reshape(logits.shape[:-1])
    return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), idx[..., None], axis=-1))


LOSSES = {"mse": mse, "mae": mae, "cross_entropy": softmax_cross_entropy}


def get_loss(loss):
    if callable(loss):
        return loss
    try:
        return LOSSES[loss]
    except KeyError:
        raise ValueError(f"unknown loss {loss!r}; use one of {sorted(LOSSES)} or a function") from None
