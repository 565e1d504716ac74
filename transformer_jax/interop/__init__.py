"""Other implementations: published checkpoints in (Marian), deployment engines out (CTranslate2)."""
