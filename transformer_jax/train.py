"""`python -m transformer_jax.train`: the command line is transformer_jax/cli/train.py."""

from transformer_jax.cli import train

if __name__ == "__main__":
  train.run()
