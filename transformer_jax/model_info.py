"""Prints a model's parameter count, in total and by component.

  python -m transformer_jax.model_info --config=experiments/configs/wmt14_base.py
"""

from __future__ import annotations

import collections

import jax
import jax.numpy as jnp
import numpy as np
from absl import app

from transformer_jax.errors import UserError, exit_on_user_error
from transformer_jax.model import Transformer


def abstract_params(model_config) -> dict:
  """The parameter shapes of `Transformer(model_config)`, without allocating them."""
  model = Transformer(model_config)
  tokens = jnp.ones((1, 8), jnp.int32)
  variables = jax.eval_shape(
      lambda: model.init(jax.random.key(0), tokens, tokens, train=False)
  )
  return variables["params"]


def parameter_counts(params) -> dict[str, int]:
  """{'total': n, '<component>': n, ...}; components are the top-level modules,
  with the per-layer modules folded into 'encoder' and 'decoder'."""
  counts = collections.Counter()
  for path, leaf in jax.tree_util.tree_leaves_with_path(params):
    top = str(path[0].key)
    component = top.split("_")[0] if top.split("_")[-1].isdigit() else top
    counts[component] += int(np.prod(leaf.shape))
  return {"total": sum(counts.values()), **dict(sorted(counts.items()))}


def format_counts(counts: dict[str, int]) -> str:
  """A small table: one component a line, counts in millions."""
  lines = [f"{name:<20} {count:>13,} ({count / 1e6:.2f}M)" for name, count in counts.items()]
  return "\n".join(lines)


@exit_on_user_error
def main(argv):
  del argv
  from transformer_jax import cli

  if cli.FLAGS.config is None:
    raise UserError("--config is required, e.g. --config=experiments/configs/wmt14_base.py")
  print(format_counts(parameter_counts(abstract_params(cli.FLAGS.config.model))))


if __name__ == "__main__":
  from transformer_jax import cli

  cli.define_run_flags()
  app.run(main, flags_parser=cli.parse_flags)
