"""An encoder-decoder run as a CTranslate2 model, for serving on CPUs and GPUs.

`export_ctranslate2(run, out_dir)` fills CTranslate2's own `TransformerSpec`
(post- or pre-LN, the activation, embeddings ×√d_model, the position table
this model adds, biases where the model has them, tied or separate output
weights) and saves it with the vocabulary in this package's ids, so
CTranslate2 reads the same SentencePiece pieces: give it
`tokenizer.encode`'s pieces without the final `</s>` (the model adds it, as
`add_source_eos`) and it starts the decoder from `<s>`, as `translate` does.

ctranslate2 is an optional dependency (`pip install -e '.[export]'`).
"""

from __future__ import annotations

import os
from typing import Any

import jax
import numpy as np

from transformer_jax.errors import UserError
from transformer_jax.model.config import ModelConfig
from transformer_jax.model.positions import sinusoidal_encoding
from transformer_jax.training.run_dir import LoadedRun

# Positions CTranslate2 can encode: the sinusoid table is written out to this length.
MAX_POSITIONS = 1024


def _ctranslate2():
  try:
    import ctranslate2  # Optional: only the export needs it.
  except ImportError:
    raise UserError("exporting to CTranslate2 needs ctranslate2: pip install -e '.[export]'") from None
  return ctranslate2


def _input_projection(kernel: np.ndarray) -> np.ndarray:
  """Our [d_model, heads, depth] kernel as a [heads·depth, d_model] (out, in) weight."""
  return kernel.reshape(kernel.shape[0], -1).T


def _attention(spec: Any, params: dict, has_bias: bool, self_attention: bool) -> None:
  names = ("query", "key", "value")
  weights = [_input_projection(np.asarray(params[name])) for name in names]
  biases = [np.asarray(params[f"{name}_bias"]).reshape(-1) for name in names] if has_bias else None
  groups = [(0, 1, 2)] if self_attention else [(0,), (1, 2)]
  for linear, group in zip(spec.linear, groups):
    linear.weight = np.concatenate([weights[i] for i in group])
    if has_bias:
      linear.bias = np.concatenate([biases[i] for i in group])
  out = np.asarray(params["out"])
  spec.linear[-1].weight = out.reshape(-1, out.shape[-1]).T
  if has_bias:
    spec.linear[-1].bias = np.asarray(params["out_bias"])


def _layer_norm(spec: Any, params: dict) -> None:
  spec.gamma, spec.beta = np.asarray(params["scale"]), np.asarray(params["bias"])


def _feed_forward(spec: Any, params: dict) -> None:
  for linear, name in ((spec.linear_0, "wi"), (spec.linear_1, "wo")):
    linear.weight = np.asarray(params[name]["kernel"]).T
    linear.bias = np.asarray(params[name]["bias"])


def _positions(config: ModelConfig, params: dict, scope: str) -> np.ndarray:
  if config.positions == "learned":
    return np.asarray(params[scope]["positions"]["position_embedding"])
  return np.asarray(sinusoidal_encoding(np.arange(MAX_POSITIONS), config.d_model,
                                        config.sinusoid_layout))


def model_spec(config: ModelConfig, params: dict, tokens: list[str]) -> Any:
  """CTranslate2's TransformerSpec holding `params` of an encoder-decoder of `config`."""
  ctranslate2 = _ctranslate2()
  specs = ctranslate2.specs
  if config.positions not in ("sinusoidal", "learned"):
    raise UserError(f"config.model.positions={config.positions!r} has no CTranslate2 "
                    "encoder-decoder equivalent; export a model with sinusoidal or learned "
                    "positions")
  if config.d_k != config.d_model // config.num_heads or config.d_v != config.d_k:
    raise UserError(f"d_k={config.d_k}, d_v={config.d_v} with d_model={config.d_model} and "
                    f"{config.num_heads} heads: CTranslate2 needs d_k = d_v = d_model / heads")
  if config.num_kv_heads != config.num_heads:
    raise UserError(f"config.model.num_kv_heads={config.num_kv_heads} with {config.num_heads} "
                    "heads: CTranslate2's encoder-decoder has one key/value head per head; "
                    "export a model with num_kv_heads=0")
  if config.norm_type != "layernorm" or config.attention_scale:
    raise UserError("CTranslate2's encoder-decoder has LayerNorm and a 1/sqrt(d_k) attention "
                    "scale; export a model with config.model.norm_type='layernorm' and "
                    "attention_scale=0")
  activations = {"relu": specs.Activation.RELU, "gelu": specs.Activation.GELU,
                 "swish": specs.Activation.SWISH}
  if config.activation not in activations:
    raise UserError(f"config.model.activation={config.activation!r} has no CTranslate2 "
                    f"encoder-decoder equivalent; export a model with one of "
                    f"{', '.join(activations)}")
  activation = activations[config.activation]
  spec = specs.TransformerSpec.from_config(
      (config.num_encoder_layers, config.num_decoder_layers), config.num_heads,
      pre_norm=config.norm == "pre", activation=activation)
  source_table = "target_embedding" if config.share_embeddings else "source_embedding"
  for stack, table, scope, layers in (
      (spec.encoder, source_table, "embed_source", config.num_encoder_layers),
      (spec.decoder, "target_embedding", "embed_target", config.num_decoder_layers)):
    embeddings = stack.embeddings[0] if isinstance(stack.embeddings, list) else stack.embeddings
    embeddings.weight = np.asarray(params[table]["embedding"])
    stack.scale_embeddings = True  # ×√d_model (§3.4).
    stack.position_encodings.encodings = _positions(config, params, scope)
    if config.norm == "pre":
      _layer_norm(stack.layer_norm, params["encoder_norm" if stack is spec.encoder else "decoder_norm"])
    prefix = "encoder" if stack is spec.encoder else "decoder"
    for i, layer in enumerate(stack.layer[:layers]):
      ours = params[f"{prefix}_{i}"]
      _attention(layer.self_attention, ours["self_attention"], config.attention_bias, True)
      _layer_norm(layer.self_attention.layer_norm, ours["self_attention_block"]["norm"])
      if prefix == "decoder":
        _attention(layer.attention, ours["cross_attention"], config.attention_bias, False)
        _layer_norm(layer.attention.layer_norm, ours["cross_attention_block"]["norm"])
      _feed_forward(layer.ffn, ours["feed_forward"])
      _layer_norm(layer.ffn.layer_norm, ours["feed_forward_block"]["norm"])
  projection = spec.decoder.projection
  projection.weight = (np.asarray(params["target_embedding"]["embedding"]) if config.tie_output
                       else np.asarray(params["output_projection"]["kernel"]).T)
  if config.logits_bias:
    projection.bias = np.asarray(params["logits_bias"]["bias"])
  spec.config.layer_norm_epsilon = config.layer_norm_epsilon
  spec.config.add_source_eos = True
  spec.config.decoder_start_token = "<s>"
  spec.register_source_vocabulary(tokens)
  spec.register_target_vocabulary(tokens)
  return spec


def export_ctranslate2(run: LoadedRun, out_dir: str, quantization: str = "") -> str:
  """Writes the CTranslate2 model of an encoder-decoder run to `out_dir`; returns it.

  `quantization`: "" keeps float32; else a CTranslate2 compute type for the
  weights ("int8", "int8_float32", "float16", "bfloat16", ...).
  """
  config = run.model.config
  tokens = [run.tokenizer.id_to_piece(i) for i in range(run.tokenizer.vocab_size)]
  if len(tokens) != config.vocab_size:
    raise UserError(f"the model has {config.vocab_size} output rows and the tokenizer "
                    f"{len(tokens)} pieces; only a translation run exports")
  params = jax.tree.map(np.array, run.params)  # Writable host copies: quantizing edits them.
  if os.path.isdir(out_dir) and os.listdir(out_dir):
    raise UserError(f"--out={out_dir} exists and is not empty; choose a new directory")
  write_model(model_spec(config, params, tokens), out_dir, quantization)
  return out_dir


def write_model(spec: Any, out_dir: str, quantization: str = "") -> None:
  """Validates `spec`, quantizes its weights if asked, and saves it to `out_dir`."""
  try:
    spec.validate()
    if quantization:
      spec.optimize(quantization=quantization)
    os.makedirs(out_dir, exist_ok=True)
    spec.save(out_dir)
  except (ValueError, TypeError) as e:
    hint = f"; check --quantization={quantization}" if quantization else ""
    raise UserError(f"CTranslate2 refused the model ({e}){hint}") from None
