"""`python -m transformer_jax.precompile`: the command line is transformer_jax/cli/precompile.py."""

from transformer_jax.cli import precompile

if __name__ == "__main__":
  precompile.run()
