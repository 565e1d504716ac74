"""`python -m transformer_jax.import_marian`: the command line is transformer_jax/cli/import_marian.py."""

from transformer_jax.cli import import_marian

if __name__ == "__main__":
  import_marian.run()
