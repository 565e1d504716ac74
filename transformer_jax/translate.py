"""`python -m transformer_jax.translate`: the command line is transformer_jax/cli/translate.py."""

from transformer_jax.cli import translate

if __name__ == "__main__":
  translate.run()
