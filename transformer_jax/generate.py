"""`python -m transformer_jax.generate`: the command line is transformer_jax/cli/generate.py."""

from transformer_jax.cli import generate

if __name__ == "__main__":
  generate.run()
