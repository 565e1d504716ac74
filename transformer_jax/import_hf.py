"""`python -m transformer_jax.import_hf`: the command line is transformer_jax/cli/import_hf.py."""

from transformer_jax.cli import import_hf

if __name__ == "__main__":
  import_hf.run()
