"""`python -m transformer_jax.model_info`: the command line is transformer_jax/cli/model_info.py."""

from transformer_jax.cli import model_info

if __name__ == "__main__":
  model_info.run()
