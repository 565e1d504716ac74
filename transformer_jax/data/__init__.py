"""Datasets, tokenizer and batching."""
