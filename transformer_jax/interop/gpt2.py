"""GPT-2 checkpoints of Hugging Face `GPT2LMHeadModel` as this package's DecoderOnly.

GPT-2 is the decoder-only stack with these options of `config.model`: pre-LN with a
final norm, learned positions, GELU's tanh approximation, biases on the attention
projections, LayerNorm ε 1e-5, the output tied to the token embedding, and no
×√d_model on the embeddings. Its byte-level BPE is read through the `tokenizers`
package (`data/hf_tokenizer.py`): <|endoftext|> becomes our BOS and EOS, and GPT-2,
which has no PAD or UNK, gets zero rows for them that `unused_tokens` keeps from ever
being predicted.

`import_gpt2(model_dir, workdir)` reads a local directory (config.json,
model.safetensors or pytorch_model.bin, tokenizer.json) and writes a causal_lm run
directory that `generate` and `train --config.init_from` read like any other.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import jax
import numpy as np

from transformer_jax.data import hf_tokenizer
from transformer_jax.interop.imported_run import (HFWeights, read_hf_config, read_weights,
                                                  run_config, write_hf_run)
from transformer_jax.model.decoder_only import DecoderOnly
from transformer_jax.tasks.causal_lm import CausalLMTask

# config.json fields whose other values this model does not express: field -> the value needed.
_REQUIRED = {"activation_function": "gelu_new", "scale_attn_weights": True,
             "scale_attn_by_inverse_layer_idx": False, "add_cross_attention": False,
             "tie_word_embeddings": True}


@dataclasses.dataclass(frozen=True)
class ImportReport:
  workdir: str
  num_parameters: int
  vocab_size: int  # Ours: GPT-2's, plus PAD and UNK, with <|endoftext|> as BOS and EOS.
  their_ids: np.ndarray  # int[vocab_size]: GPT-2's id of each of our ids (-1: none).


def read_config(model_dir: str) -> dict:
  """config.json of a Hugging Face GPT-2 directory, checked to be one this model expresses."""
  return read_hf_config(model_dir, "gpt2", "GPT-2 (GPT2LMHeadModel)", _REQUIRED)


def model_section(hf: dict, ids: np.ndarray) -> dict:
  """`config.model` for the GPT-2 of config.json `hf`; `ids`: GPT-2's id of each of ours."""
  return dict(
      vocab_size=len(ids), unused_tokens=tuple(int(i) for i in np.flatnonzero(ids < 0)), num_layers=hf["n_layer"], d_model=hf["n_embd"],
      d_ff=hf.get("n_inner") or 4 * hf["n_embd"], num_heads=hf["n_head"],
      dropout_rate=float(hf.get("resid_pdrop", 0.1)),
      attention_dropout_rate=float(hf.get("attn_pdrop", 0.1)), relu_dropout_rate=0.0,
      positions="learned", max_len=hf["n_positions"], activation="gelu_tanh",
      attention_bias=True, tie_output=True, embedding_scale=False,
      layer_norm_epsilon=float(hf.get("layer_norm_epsilon", 1e-5)), norm="pre")


def their_ids(hf: dict) -> np.ndarray:
  """GPT-2's id of each of our ids: no PAD or UNK, <|endoftext|> as BOS and EOS."""
  eos = int(hf.get("eos_token_id", hf["vocab_size"] - 1))
  bos = int(hf.get("bos_token_id", eos))
  return hf_tokenizer.reserved_ids(hf["vocab_size"], dict(bos=bos, eos=eos))


def convert_params(weights: dict[str, np.ndarray], hf: dict, ids: np.ndarray,
                   model_dir: str = "the model") -> dict:
  """Our DecoderOnly's params (nested dicts of float32 arrays) from GPT2LMHeadModel tensors;
  `ids[i]` is the GPT-2 row that our row i takes (-1: a zero row)."""
  w = HFWeights(weights, model_dir, "transformer.", "GPT2LMHeadModel")
  get, norm = w.get, w.layer_norm

  heads, d_model = hf["n_head"], hf["n_embd"]
  embedding = get("wte.weight")
  rows = np.where(ids[:, None] >= 0, embedding[np.maximum(ids, 0)], 0.0).astype(np.float32)
  params: dict[str, Any] = {
      "token_embedding": {"embedding": rows},
      "embed": {"positions": {"position_embedding": get("wpe.weight")}},
      "decoder_norm": norm("ln_f"),
  }
  for i in range(hf["n_layer"]):
    prefix = f"h.{i}"
    qkv, qkv_bias = get(f"{prefix}.attn.c_attn.weight"), get(f"{prefix}.attn.c_attn.bias")
    attention = {}
    for j, name in enumerate(("query", "key", "value")):  # Conv1D: [in, out], x @ W + b.
      attention[name] = qkv[:, j * d_model:(j + 1) * d_model].reshape(d_model, heads, -1)
      attention[f"{name}_bias"] = qkv_bias[j * d_model:(j + 1) * d_model].reshape(heads, -1)
    attention["out"] = get(f"{prefix}.attn.c_proj.weight").reshape(heads, -1, d_model)
    attention["out_bias"] = get(f"{prefix}.attn.c_proj.bias")
    params[f"decoder_{i}"] = {
        "self_attention": attention,
        "self_attention_block": {"norm": norm(f"{prefix}.ln_1")},
        "feed_forward": {
            "wi": dict(kernel=get(f"{prefix}.mlp.c_fc.weight"), bias=get(f"{prefix}.mlp.c_fc.bias")),
            "wo": dict(kernel=get(f"{prefix}.mlp.c_proj.weight"),
                       bias=get(f"{prefix}.mlp.c_proj.bias"))},
        "feed_forward_block": {"norm": norm(f"{prefix}.ln_2")},
    }
  return params


def import_gpt2(model_dir: str, workdir: str) -> ImportReport:
  """Writes the run directory `workdir` for the GPT-2 in `model_dir` (module docstring)."""
  model_dir = os.path.abspath(model_dir)
  hf = read_config(model_dir)
  ids = their_ids(hf)
  config = run_config(CausalLMTask.name, model_section(hf, ids))
  model = DecoderOnly(config.model)  # Validates the model section before anything is written.
  params = convert_params(read_weights(model_dir), hf, ids, model_dir)
  published = hf_tokenizer.read_published(os.path.join(model_dir, "tokenizer.json"))
  count = write_hf_run(workdir, config, params,
                       lambda: model.init(jax.random.key(0), np.ones((1, 2), np.int32)),
                       published, ids)
  return ImportReport(os.path.abspath(workdir), count, len(ids), ids)
