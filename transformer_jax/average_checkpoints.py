"""`python -m transformer_jax.average_checkpoints`: the command line is transformer_jax/cli/average_checkpoints.py."""

from transformer_jax.cli import average_checkpoints

if __name__ == "__main__":
  average_checkpoints.run()
