"""Data, one way through: config.py (the data section) -> corpus.py (which corpus, where its
files are) -> builders.py (TFDS array_record, prepared once; generated.py, text_files.py) ->
tokenizer.py (SentencePiece) -> tokenized.py (token ids, cached) -> batching.py (token-budget
batch plans); pipeline.load_dataset runs them in that order. Knows no model."""
