"""A run as a Hugging Face model folder: GPT-2 (`GPT2LMHeadModel`) from a causal_lm run, BERT
(`BertForMaskedLM`) from a masked_lm run, each with its tokenizer.json.

The inverse of `interop/gpt2.py` and `interop/bert.py`: a run imported from Hugging
Face, or trained or fine-tuned here from one, goes back to the ecosystem with the
same logits. Only a run whose `config.model` is what GPT-2 or BERT computes can be
written; another is a one-line refusal naming the option. Where two of our ids share
a published id (GPT-2's BOS and EOS are both <|endoftext|>), the EOS row is written.
BERT's token-type embeddings are written as zeros, with type 0's row kept in the
positions (as the import folds it): exact for one-segment input.
"""

from __future__ import annotations

import json
import os
from typing import Any

import numpy as np
from flax import traverse_util
from safetensors.numpy import save_file

from transformer_jax.data.hf_tokenizer import NO_ID, HFTokenizer
from transformer_jax.errors import UserError
from transformer_jax.interop import bert
from transformer_jax.model.config import ModelConfig
from transformer_jax.special_tokens import BOS_ID, EOS_ID, PAD_ID
from transformer_jax.tasks.causal_lm import CausalLMTask
from transformer_jax.tasks.masked_lm import MaskedLMTask
from transformer_jax.training.run_dir import LoadedRun

_COMMON = dict(positions="learned", attention_bias=True, tie_output=True, embedding_scale=False,
               norm_type="layernorm", attention_window=0, attention_scale=0.0,
               rope_fraction=1.0)
GPT2_OPTIONS = dict(_COMMON, norm="pre", activation="gelu_tanh", logits_bias=False,
                    embedding_norm=False)
BERT_OPTIONS = dict(_COMMON, norm="post", logits_bias=True, embedding_norm=True)
BERT_ACTIVATIONS = {"gelu": "gelu", "gelu_tanh": "gelu_new"}


def _check_options(model: ModelConfig, options: dict[str, Any], what: str) -> None:
  for key, value in options.items():
    if getattr(model, key) != value:
      raise UserError(f"config.model.{key}={getattr(model, key)!r} cannot be written as {what} "
                      f"(it needs {value!r})")
  if model.num_kv_heads != model.num_heads or model.d_k * model.num_heads != model.d_model:
    raise UserError(f"{what} has as many key/value heads as heads, each d_model / num_heads "
                    f"wide; this model has num_kv_heads={model.num_kv_heads}, d_k={model.d_k}")


def _table(rows: np.ndarray, their_ids: np.ndarray, size: int) -> np.ndarray:
  """[size, ...]: our `rows` placed at their published ids (rows of ids without one dropped)."""
  table = np.zeros((size, *rows.shape[1:]), np.float32)
  for ours in _published_rows_of(their_ids):
    table[their_ids[ours]] = rows[ours]
  return table


def _published_rows_of(their_ids: np.ndarray) -> list[int]:
  order = list(range(4, len(their_ids))) + list(range(4))
  return [i for i in order if their_ids[i] != NO_ID]


def _save(out_dir: str, config: dict, weights: dict[str, np.ndarray], tokenizer: HFTokenizer
          ) -> str:
  if os.path.isdir(out_dir) and os.listdir(out_dir):
    raise UserError(f"--out={out_dir} is not empty; choose a new directory")
  os.makedirs(out_dir, exist_ok=True)
  with open(os.path.join(out_dir, "config.json"), "w") as f:
    json.dump(config, f, indent=2)
  save_file({k: np.ascontiguousarray(v, np.float32) for k, v in weights.items()},
            os.path.join(out_dir, "model.safetensors"), metadata={"format": "pt"})
  with open(os.path.join(out_dir, "tokenizer.json"), "w", encoding="utf-8") as f:
    json.dump(tokenizer.published, f, ensure_ascii=False)
  return out_dir


def export_gpt2(run: LoadedRun, out_dir: str) -> str:
  """Writes `run` (a causal_lm run) as a GPT2LMHeadModel folder."""
  model, tokenizer = run.model.config, run.tokenizer
  _check_options(model, GPT2_OPTIONS, "GPT-2")
  params = traverse_util.flatten_dict(run.params, sep="/")
  params = {k: np.asarray(v) for k, v in params.items()}
  their_ids = tokenizer.their_ids
  size = int(their_ids.max()) + 1
  d = model.d_model
  weights = {"transformer.wte.weight": _table(params["token_embedding/embedding"], their_ids, size),
             "transformer.wpe.weight": params["embed/positions/position_embedding"],
             "transformer.ln_f.weight": params["decoder_norm/scale"],
             "transformer.ln_f.bias": params["decoder_norm/bias"]}
  for i in range(model.num_decoder_layers):
    ours, theirs = f"decoder_{i}", f"transformer.h.{i}"
    attention = f"{ours}/self_attention"
    weights[f"{theirs}.attn.c_attn.weight"] = np.concatenate(
        [params[f"{attention}/{n}"].reshape(d, d) for n in ("query", "key", "value")], axis=1)
    weights[f"{theirs}.attn.c_attn.bias"] = np.concatenate(
        [params[f"{attention}/{n}_bias"].reshape(d) for n in ("query", "key", "value")])
    weights[f"{theirs}.attn.c_proj.weight"] = params[f"{attention}/out"].reshape(d, d)
    weights[f"{theirs}.attn.c_proj.bias"] = params[f"{attention}/out_bias"]
    for norm, name in (("ln_1", "self_attention_block"), ("ln_2", "feed_forward_block")):
      weights[f"{theirs}.{norm}.weight"] = params[f"{ours}/{name}/norm/scale"]
      weights[f"{theirs}.{norm}.bias"] = params[f"{ours}/{name}/norm/bias"]
    for layer, name in (("c_fc", "wi"), ("c_proj", "wo")):  # Conv1D: [in, out], as ours.
      weights[f"{theirs}.mlp.{layer}.weight"] = params[f"{ours}/feed_forward/{name}/kernel"]
      weights[f"{theirs}.mlp.{layer}.bias"] = params[f"{ours}/feed_forward/{name}/bias"]
  config = dict(
      model_type="gpt2", architectures=["GPT2LMHeadModel"], vocab_size=size,
      n_positions=model.max_len, n_embd=d, n_layer=model.num_decoder_layers,
      n_head=model.num_heads, n_inner=model.d_ff, activation_function="gelu_new",
      resid_pdrop=model.dropout_rate, embd_pdrop=model.dropout_rate,
      attn_pdrop=model.attention_dropout_rate, layer_norm_epsilon=model.layer_norm_epsilon,
      bos_token_id=int(their_ids[BOS_ID]), eos_token_id=int(their_ids[EOS_ID]),
      tie_word_embeddings=True)
  return _save(out_dir, config, weights, tokenizer)


def export_bert(run: LoadedRun, out_dir: str) -> str:
  """Writes `run` (a masked_lm run) as a BertForMaskedLM folder."""
  model, tokenizer = run.model.config, run.tokenizer
  _check_options(model, BERT_OPTIONS, "BERT")
  if model.activation not in BERT_ACTIVATIONS:
    raise UserError(f"config.model.activation={model.activation!r} cannot be written as BERT "
                    f"(it needs one of {', '.join(BERT_ACTIVATIONS)})")
  _, mask = bert.vocabulary_of(tokenizer.published)
  their_ids = np.append(tokenizer.their_ids, mask)  # The model's last row is [MASK].
  size = int(their_ids.max()) + 1
  params = {k: np.asarray(v) for k, v in traverse_util.flatten_dict(run.params, sep="/").items()}
  d = model.d_model

  def dense(ours: str) -> dict[str, np.ndarray]:
    return {"weight": params[f"{ours}/kernel"].T, "bias": params[f"{ours}/bias"]}

  def norm(ours: str) -> dict[str, np.ndarray]:
    return {"weight": params[f"{ours}/scale"], "bias": params[f"{ours}/bias"]}

  def put(prefix: str, tensors: dict[str, np.ndarray]) -> None:
    weights.update({f"{prefix}.{k}": v for k, v in tensors.items()})

  weights = {
      "bert.embeddings.word_embeddings.weight": _table(params["token_embedding/embedding"],
                                                       their_ids, size),
      "bert.embeddings.position_embeddings.weight": params["embed/positions/position_embedding"],
      "bert.embeddings.token_type_embeddings.weight": np.zeros((2, d), np.float32),
      "cls.predictions.bias": _table(params["logits_bias/bias"][:, None], their_ids, size)[:, 0],
  }
  put("bert.embeddings.LayerNorm", norm("embed/norm"))
  put("cls.predictions.transform.dense", dense("head_transform"))
  put("cls.predictions.transform.LayerNorm", norm("head_norm"))
  for i in range(model.num_encoder_layers):
    ours, theirs = f"encoder_{i}", f"bert.encoder.layer.{i}"
    for name in ("query", "key", "value"):
      put(f"{theirs}.attention.self.{name}", {
          "weight": params[f"{ours}/self_attention/{name}"].reshape(d, d).T,
          "bias": params[f"{ours}/self_attention/{name}_bias"].reshape(d)})
    put(f"{theirs}.attention.output.dense", {
        "weight": params[f"{ours}/self_attention/out"].reshape(d, d).T,
        "bias": params[f"{ours}/self_attention/out_bias"]})
    put(f"{theirs}.attention.output.LayerNorm", norm(f"{ours}/self_attention_block/norm"))
    put(f"{theirs}.intermediate.dense", dense(f"{ours}/feed_forward/wi"))
    put(f"{theirs}.output.dense", dense(f"{ours}/feed_forward/wo"))
    put(f"{theirs}.output.LayerNorm", norm(f"{ours}/feed_forward_block/norm"))
  config = dict(
      model_type="bert", architectures=["BertForMaskedLM"], vocab_size=size, hidden_size=d,
      num_hidden_layers=model.num_encoder_layers, num_attention_heads=model.num_heads,
      intermediate_size=model.d_ff, hidden_act=BERT_ACTIVATIONS[model.activation],
      hidden_dropout_prob=model.dropout_rate,
      attention_probs_dropout_prob=model.attention_dropout_rate,
      max_position_embeddings=model.max_len, type_vocab_size=2,
      layer_norm_eps=model.layer_norm_epsilon, pad_token_id=int(their_ids[PAD_ID]),
      tie_word_embeddings=True)
  return _save(out_dir, config, weights, tokenizer)


def export_hf(run: LoadedRun, out_dir: str) -> str:
  """Writes `run` as the Hugging Face model its task is: GPT-2 or BERT. Returns its kind."""
  if not isinstance(run.tokenizer, HFTokenizer):
    raise UserError("the run's tokenizer is a SentencePiece model, which Hugging Face's GPT-2 "
                    "and BERT do not read; export a run imported with import_hf, or trained "
                    "with --config.init_from one")
  if run.config.task == CausalLMTask.name:
    export_gpt2(run, out_dir)
    return "gpt2"
  if run.config.task == MaskedLMTask.name:
    export_bert(run, out_dir)
    return "bert"
  raise UserError(f"a {run.config.task} run has no Hugging Face form here; export a causal_lm "
                  "(GPT-2) or masked_lm (BERT) run")
