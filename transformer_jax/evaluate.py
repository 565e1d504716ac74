"""`python -m transformer_jax.evaluate`: the command line is transformer_jax/cli/evaluate.py."""

from transformer_jax.cli import evaluate

if __name__ == "__main__":
  evaluate.run()
