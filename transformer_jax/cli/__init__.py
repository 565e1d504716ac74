"""Thin command lines: flags and main() only; `python -m transformer_jax.<command>` runs them."""
