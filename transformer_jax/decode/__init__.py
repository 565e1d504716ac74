"""Decoding with a trained model: the KV-cached step, beam/greedy/sampling search, Translator."""
