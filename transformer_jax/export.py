"""`python -m transformer_jax.export`: the command line is transformer_jax/cli/export.py."""

from transformer_jax.cli import export

if __name__ == "__main__":
  export.run()
