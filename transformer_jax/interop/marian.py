"""Marian (opus-mt) checkpoints of Hugging Face `MarianMTModel` as this package's encoder-decoder.

A Marian model is the paper's post-LN encoder-decoder with these differences,
each a `config.model` option here: swish in the feed-forward network, sines and
cosines in two halves of the position encoding, biases on the attention
projections and on the output logits, LayerNorm ε 1e-5, and its <pad> as the
decoder's first input (which becomes BOS here: `data/marian_vocab.py` moves
every special token to this package's reserved ids and permutes the embedding
rows to match).

`import_marian(model_dir, workdir)` reads a local Hugging Face directory
(config.json, model.safetensors or pytorch_model.bin, source.spm, target.spm,
vocab.json) and writes a run directory (config.json, tokenizer.model, an
Orbax checkpoint at step 0) that `translate`, `evaluate` and
`train --config.init_from` read like any other run.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

import jax
import ml_collections
import numpy as np

from transformer_jax.configs import default_config
from transformer_jax.data import marian_vocab
from transformer_jax.data.tokenizer import Tokenizer
from transformer_jax.errors import UserError
from transformer_jax.interop import imported_run
from transformer_jax.interop.imported_run import (HFWeights, check_against_model, new_workdir,
                                                  read_weights, save_run)
from transformer_jax.model.transformer import Transformer

ACTIVATIONS = {"relu": "relu", "gelu": "gelu", "swish": "swish", "silu": "swish"}
# config.json fields whose other values this model does not express: field -> the value needed.
_REQUIRED = {"scale_embedding": True, "share_encoder_decoder_embeddings": True,
             "is_encoder_decoder": True}


@dataclasses.dataclass(frozen=True)
class ImportReport:
  """What `import_marian` wrote and how it mapped the vocabulary."""

  workdir: str
  num_parameters: int
  vocab_size: int  # Ours: Marian's + 1 when its decoder start is its <pad> (a BOS row).
  marian_vocab_size: int
  marian_ids: np.ndarray  # int[vocab_size]: the Marian id of each of our ids.
  missing_source_pieces: tuple[str, ...]


def read_hf_config(model_dir: str) -> dict:
  """config.json of a Hugging Face Marian directory, checked to be one this model expresses."""
  hf = imported_run.read_hf_config(model_dir, "marian", "Marian", _REQUIRED)
  for encoder_field, decoder_field in (("encoder_ffn_dim", "decoder_ffn_dim"),
                                       ("encoder_attention_heads", "decoder_attention_heads")):
    if hf.get(encoder_field) != hf.get(decoder_field):
      raise UserError(f"config.json {encoder_field}={hf.get(encoder_field)} differs from "
                      f"{decoder_field}={hf.get(decoder_field)}; not supported (one value serves both)")
  activation = hf.get("activation_function", "swish")
  if activation not in ACTIVATIONS:
    raise UserError(f"config.json activation_function={activation!r} is not supported; "
                    f"supported: {', '.join(ACTIVATIONS)}")
  if hf.get("decoder_vocab_size") not in (None, hf.get("vocab_size")):
    raise UserError(f"config.json decoder_vocab_size={hf['decoder_vocab_size']} differs from "
                    f"vocab_size={hf.get('vocab_size')}: separate vocabularies are not supported")
  return hf


def model_section(hf: dict, vocab_size: int) -> dict:
  """`config.model` for the Marian model of config.json `hf`, with our `vocab_size`."""
  return dict(
      vocab_size=vocab_size, share_embeddings=True,
      tie_output=bool(hf.get("tie_word_embeddings", True)),
      num_layers=hf["encoder_layers"], num_encoder_layers=hf["encoder_layers"],
      num_decoder_layers=hf["decoder_layers"], d_model=hf["d_model"], d_ff=hf["encoder_ffn_dim"],
      num_heads=hf["encoder_attention_heads"],
      dropout_rate=float(hf.get("dropout", 0.1)),
      attention_dropout_rate=float(hf.get("attention_dropout", 0.0)),
      relu_dropout_rate=float(hf.get("activation_dropout", 0.0)),
      positions="sinusoidal", sinusoid_layout="concatenated",
      activation=ACTIVATIONS[hf.get("activation_function", "swish")],
      attention_bias=True, logits_bias=True, layer_norm_epsilon=1e-5, norm="post",
  )


class _Weights(HFWeights):
  """MarianMTModel's tensors, with its attention projections as ours."""

  def __init__(self, weights: dict[str, np.ndarray], model_dir: str):
    super().__init__(weights, model_dir, "model.", "MarianMTModel")

  def attention(self, prefix: str, num_heads: int) -> dict[str, np.ndarray]:
    """Our MultiHeadAttention params from q/k/v/out_proj ([out, in] weights)."""
    params = {}
    for ours, theirs in (("query", "q_proj"), ("key", "k_proj"), ("value", "v_proj")):
      weight = self.get(f"{prefix}.{theirs}.weight")
      d_model = weight.shape[1]
      params[ours] = weight.T.reshape(d_model, num_heads, -1)
      params[f"{ours}_bias"] = self.get(f"{prefix}.{theirs}.bias").reshape(num_heads, -1)
    out = self.get(f"{prefix}.out_proj.weight")
    params["out"] = out.T.reshape(num_heads, -1, out.shape[0])
    params["out_bias"] = self.get(f"{prefix}.out_proj.bias")
    return params




def convert_params(weights: dict[str, np.ndarray], hf: dict, marian_ids: np.ndarray,
                   model_dir: str = "the model") -> dict:
  """Our Transformer's params (nested dicts of float32 arrays) from MarianMTModel tensors.

  `marian_ids[i]` is the Marian row that our vocabulary row i takes.
  """
  w = _Weights(weights, model_dir)
  heads = hf["encoder_attention_heads"]
  embedding = w.get("shared.weight", "encoder.embed_tokens.weight", "decoder.embed_tokens.weight")
  params: dict[str, Any] = {"target_embedding": {"embedding": embedding[marian_ids]}}
  for i in range(hf["encoder_layers"]):
    theirs = f"encoder.layers.{i}"
    params[f"encoder_{i}"] = {
        "self_attention": w.attention(f"{theirs}.self_attn", heads),
        "self_attention_block": {"norm": w.layer_norm(f"{theirs}.self_attn_layer_norm")},
        "feed_forward": {"wi": w.dense(f"{theirs}.fc1"), "wo": w.dense(f"{theirs}.fc2")},
        "feed_forward_block": {"norm": w.layer_norm(f"{theirs}.final_layer_norm")},
    }
  for i in range(hf["decoder_layers"]):
    theirs = f"decoder.layers.{i}"
    params[f"decoder_{i}"] = {
        "self_attention": w.attention(f"{theirs}.self_attn", heads),
        "self_attention_block": {"norm": w.layer_norm(f"{theirs}.self_attn_layer_norm")},
        "cross_attention": w.attention(f"{theirs}.encoder_attn", heads),
        "cross_attention_block": {"norm": w.layer_norm(f"{theirs}.encoder_attn_layer_norm")},
        "feed_forward": {"wi": w.dense(f"{theirs}.fc1"), "wo": w.dense(f"{theirs}.fc2")},
        "feed_forward_block": {"norm": w.layer_norm(f"{theirs}.final_layer_norm")},
    }
  if not hf.get("tie_word_embeddings", True):
    params["output_projection"] = {"kernel": w.get("lm_head.weight")[marian_ids].T}
  bias = weights.get("final_logits_bias", np.zeros((1, embedding.shape[0]), np.float32))
  params["logits_bias"] = {"bias": bias.reshape(-1)[marian_ids]}
  return params


def special_ids(hf: dict, vocab: dict[str, int]) -> dict[str, int]:
  """Marian's ids of marian_vocab.SPECIAL_ROLES from config.json and vocab.json."""
  if "<unk>" not in vocab:
    raise UserError("vocab.json has no <unk>; not a Marian vocabulary")
  pad = hf.get("pad_token_id")
  if pad is None or hf.get("eos_token_id") is None:
    raise UserError("config.json lacks pad_token_id or eos_token_id; a Marian config names both")
  start = hf.get("decoder_start_token_id")
  return dict(pad=int(pad), unk=int(vocab["<unk>"]), start=int(pad if start is None else start),
              eos=int(hf["eos_token_id"]))


def run_config(model: dict) -> ml_collections.ConfigDict:
  """The run directory's config: a translation run of this model, decoded as the paper decodes."""
  config = default_config()
  config.model.update(model)
  config.num_train_steps = 0
  return config


def import_marian(model_dir: str, workdir: str) -> ImportReport:
  """Writes the run directory `workdir` for the Marian model in `model_dir` (module docstring)."""
  model_dir = os.path.abspath(model_dir)
  hf = read_hf_config(model_dir)
  if os.path.exists(os.path.join(model_dir, "target_vocab.json")):
    raise UserError(f"{model_dir} has a target_vocab.json (separate vocabularies); not supported")
  vocab = marian_vocab.read_vocab_json(os.path.join(model_dir, "vocab.json"))
  if len(vocab) != hf.get("vocab_size"):
    raise UserError(f"vocab.json has {len(vocab)} pieces but config.json vocab_size="
                    f"{hf.get('vocab_size')}; they must describe the same vocabulary")
  vocabulary = marian_vocab.convert(os.path.join(model_dir, "source.spm"), vocab,
                                    special_ids(hf, vocab))
  config = run_config(model_section(hf, len(vocabulary.marian_ids)))
  model = Transformer(config.model)  # Validates the model section before anything is written.
  params = convert_params(read_weights(model_dir), hf, vocabulary.marian_ids, model_dir)
  tokens = np.ones((1, 2), np.int32)
  check_against_model(params, lambda: model.init(jax.random.key(0), tokens, tokens))

  workdir = new_workdir(workdir)
  tokenizer_path = os.path.join(workdir, "tokenizer.model")
  marian_vocab.write_model(vocabulary, tokenizer_path)
  tokenizer = Tokenizer(tokenizer_path)
  with open(os.path.join(workdir, "marian.json"), "w") as f:
    json.dump(dict(model_dir=model_dir, hf_config=hf,
                   marian_id_of_each_id=vocabulary.marian_ids.tolist(),
                   missing_source_pieces=list(vocabulary.missing_source_pieces)), f, indent=2)
  count = save_run(workdir, config, params, tokenizer.sha256)
  return ImportReport(workdir, count, tokenizer.vocab_size, len(vocab), vocabulary.marian_ids,
                      vocabulary.missing_source_pieces)
