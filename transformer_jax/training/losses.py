"""Label-smoothed cross-entropy (§5.4), normalised per non-PAD target token."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from transformer_jax.special_tokens import PAD_ID

Array = jax.Array


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

  The smoothed target puts 1 - ε on the target and ε' = ε / (vocab - 1) on
  every other token. Because it sums to one, its cross-entropy has a closed
  form in the logits z,

    loss = logsumexp(z) - (1 - ε - ε') z_target - ε' Σ_v z_v,

  so neither a one-hot nor a [batch, length, vocab] target tensor is built
  (a quarter of the base train step's temporaries on the CPU).

  Args:
    logits: float[batch, length, vocab].
    targets: int[batch, length].

  Returns:
    (smoothed_loss, nll), each float32[batch, length].
  """
  logits = logits.astype(jnp.float32)
  vocab_size = logits.shape[-1]
  low_confidence = label_smoothing / (vocab_size - 1)
  log_normalizer = jax.nn.logsumexp(logits, axis=-1)
  target_logits = jnp.take_along_axis(logits, targets[..., None], axis=-1)[..., 0]
  nll = log_normalizer - target_logits
  smoothed_loss = (log_normalizer
                   - (1.0 - label_smoothing - low_confidence) * target_logits
                   - low_confidence * jnp.sum(logits, axis=-1))
  return smoothed_loss, nll


def loss_sums(logits: Array, targets: Array, label_smoothing: float
              ) -> tuple[Array, dict[str, Array]]:
  """(summed smoothed loss, sums) over the non-PAD targets, the `LossFn` form of step.py.

  Args:
    logits: float[batch, length, vocab].
    targets: int[batch, length]; PAD (0) positions carry no loss.

  Returns:
    (loss_sum, {'loss_sum', 'nll_sum', 'tokens'}).
  """
  smoothed, nll = token_losses(logits, targets, label_smoothing)
  weights = (targets != PAD_ID).astype(jnp.float32)
  loss_sum = jnp.sum(smoothed * weights)
  return loss_sum, dict(loss_sum=loss_sum, nll_sum=jnp.sum(nll * weights), tokens=jnp.sum(weights))


def symmetric_kl_sum(logits_a: Array, logits_b: Array, weights: Array) -> Array:
  """Σ over weighted positions of KL(p_a ‖ p_b) + KL(p_b ‖ p_a), R-Drop's consistency term.

  The symmetric sum is Σ_v (p_a − p_b)(log p_a − log p_b), and since both distributions sum
  to one the normalisers cancel: Σ_v (p_a − p_b)(z_a − z_b) in the logits z. So no log-softmax
  is built, one pass over the vocabulary serves both directions.

  Args:
    logits_a, logits_b: float[batch, length, vocab], two predictions of the same targets.
    weights: float[batch, length]; 0 where a position carries no loss (PAD).
  """
  logits_a = logits_a.astype(jnp.float32)
  logits_b = logits_b.astype(jnp.float32)
  probs_difference = jax.nn.softmax(logits_a, axis=-1) - jax.nn.softmax(logits_b, axis=-1)
  per_position = jnp.sum(probs_difference * (logits_a - logits_b), axis=-1)
  return jnp.sum(per_position * weights)
