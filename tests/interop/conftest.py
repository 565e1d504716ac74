"""Fixtures of the interop tests: a random Marian (opus-mt) model saved as Hugging Face saves it."""

from __future__ import annotations

import json
import os
import random

import pytest
import sentencepiece as spm

from transformer_jax.data.generated import sample_pair

# </s> likely enough that some outputs end on it, others at the length limit.
EOS_BIAS = 8.0


def _train_spm(texts: list[str], path: str) -> None:
  spm.SentencePieceTrainer.train(sentence_iterator=iter(texts), model_prefix=path[:-4],
                                 vocab_size=200, model_type="unigram", minloglevel=2)
  os.replace(path[:-4] + ".model", path)


def _save_random_marian(directory: str, eos_bias: float = EOS_BIAS) -> None:
  """A saved random MarianMTModel with opus-mt's layout at d_model 32 (its files only)."""
  torch = pytest.importorskip("torch", reason="the Marian tests need torch and transformers "
                              "(pip install -e '.[test]')")
  transformers = pytest.importorskip("transformers")
  sentences = [sample_pair(random.Random(i)) for i in range(1500)]
  _train_spm([en for en, _ in sentences], os.path.join(directory, "source.spm"))
  _train_spm([de for _, de in sentences], os.path.join(directory, "target.spm"))
  vocab = {"</s>": 0, "<unk>": 1}
  for side in ("source", "target"):
    processor = spm.SentencePieceProcessor(model_file=os.path.join(directory, f"{side}.spm"))
    for i in range(processor.get_piece_size()):
      piece = processor.id_to_piece(i)
      if not processor.is_control(i) and not processor.is_unknown(i) and piece not in vocab:
        vocab[piece] = len(vocab)
  vocab["<pad>"] = len(vocab)
  with open(os.path.join(directory, "vocab.json"), "w") as f:
    json.dump(vocab, f)
  pad = vocab["<pad>"]
  config = transformers.MarianConfig(
      vocab_size=len(vocab), decoder_vocab_size=len(vocab), d_model=32, encoder_layers=2,
      decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=4,
      encoder_ffn_dim=64, decoder_ffn_dim=64, activation_function="swish",
      max_position_embeddings=128, pad_token_id=pad, decoder_start_token_id=pad,
      eos_token_id=0, forced_eos_token_id=None, scale_embedding=True,
      share_encoder_decoder_embeddings=True, bad_words_ids=[[pad]])
  torch.manual_seed(0)
  model = transformers.MarianMTModel(config).eval()
  with torch.no_grad():  # Random weights everywhere: biases and LayerNorms too, to be seen.
    for name, parameter in model.named_parameters():
      if "embed_positions" not in name:
        parameter.normal_(0.0, 0.5 if "layer_norm" not in name else 0.2)
        if name.endswith("layer_norm.weight"):
          parameter.add_(1.0)
    model.final_logits_bias.normal_(0.0, 0.5)
    model.final_logits_bias[0, 0] = eos_bias
  model.save_pretrained(directory)




@pytest.fixture(scope="session")
def marian_dir(tmp_path_factory) -> str:
  """A saved random MarianMTModel (d_model 32, opus-mt's layout): never modify it."""
  directory = str(tmp_path_factory.mktemp("opus-mt-tiny"))
  _save_random_marian(directory)
  return directory
