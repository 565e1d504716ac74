"""Label-smoothed cross-entropy (§5.4), normalised per non-PAD target token."""

from __future__ import annotations

import jax
import jax.numpy as jnp

Array = jax.Array


def smoothed_targets(targets: Array, vocab_size: int, label_smoothing: float) -> Array:
  """float32[..., vocab]: 1 - ε on the target, ε / (vocab - 1) on every other token."""
  confidence = 1.0 - label_smoothing
  low_confidence = label_smoothing / (vocab_size - 1)
  one_hot = jax.nn.one_hot(targets, vocab_size, dtype=jnp.float32)
  return one_hot * (confidence - low_confidence) + low_confidence


def smoothing_entropy(vocab_size: int, label_smoothing: float) -> float:
  """The entropy of the smoothed target distribution: the loss's floor.

  Subtracting it from the loss gives a number that reaches 0 for a perfect
  model, whatever ε is.
  """
  confidence = 1.0 - label_smoothing
  low_confidence = label_smoothing / (vocab_size - 1)
  entropy = -confidence * jnp.log(confidence)
  if label_smoothing > 0:
    entropy -= (vocab_size - 1) * low_confidence * jnp.log(low_confidence)
  return float(entropy)


def token_losses(
    logits: Array, targets: Array, label_smoothing: float
) -> tuple[Array, Array]:
  """Per-token smoothed cross-entropy and plain negative log-likelihood.

  Args:
    logits: float[batch, length, vocab].
    targets: int[batch, length].

  Returns:
    (smoothed_loss, nll), each float32[batch, length].
  """
  log_probs = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
  soft = smoothed_targets(targets, logits.shape[-1], label_smoothing)
  smoothed_loss = -jnp.sum(soft * log_probs, axis=-1)
  nll = -jnp.take_along_axis(log_probs, targets[..., None], axis=-1)[..., 0]
  return smoothed_loss, nll
