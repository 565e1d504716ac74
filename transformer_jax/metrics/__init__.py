"""Translation metrics (BLEU, chrF)."""
