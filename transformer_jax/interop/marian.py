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
import struct
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import ml_dtypes
import numpy as np
from flax import traverse_util

from transformer_jax.configs import default_config
from transformer_jax.data import marian_vocab
from transformer_jax.data.tokenizer import Tokenizer
from transformer_jax.errors import UserError
from transformer_jax.model.transformer import Transformer
from transformer_jax.training import checkpoints
from transformer_jax.training.schedules import OptimizerConfig, make_optimizer
from transformer_jax.training.state import TrainState

ACTIVATIONS = {"relu": "relu", "gelu": "gelu", "swish": "swish", "silu": "swish"}
_SAFETENSORS_DTYPES = {"F32": np.float32, "F16": np.float16, "BF16": ml_dtypes.bfloat16,
                       "F64": np.float64}
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
  path = os.path.join(model_dir, "config.json")
  if not os.path.isdir(model_dir):
    raise UserError(f"--model_dir={model_dir} is not a directory; pass a downloaded Hugging "
                    "Face Marian model (e.g. Helsinki-NLP/opus-mt-en-de)")
  try:
    with open(path, encoding="utf-8") as f:
      hf = json.load(f)
  except FileNotFoundError:
    raise UserError(f"{path} does not exist; --model_dir must be a Hugging Face model "
                    "directory") from None
  except (json.JSONDecodeError, UnicodeDecodeError) as e:
    raise UserError(f"{path} is not JSON ({e})") from None
  if hf.get("model_type") != "marian":
    raise UserError(f"{model_dir} is not a Marian model (config.json model_type="
                    f"{hf.get('model_type')!r}); only MarianMTModel (opus-mt) checkpoints import")
  for field, value in _REQUIRED.items():
    if hf.get(field, value) != value:
      raise UserError(f"config.json {field}={hf[field]!r} is not supported (only {value}); "
                      "this model cannot express that checkpoint")
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


def read_safetensors(path: str) -> dict[str, np.ndarray]:
  """{name: array} of a .safetensors file (8-byte header size, JSON header, raw data)."""
  with open(path, "rb") as f:
    data = f.read()
  try:
    (header_size,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + header_size])
  except (struct.error, json.JSONDecodeError, UnicodeDecodeError):
    raise UserError(f"{path} is not a safetensors file") from None
  start = 8 + header_size
  arrays = {}
  for name, entry in header.items():
    if name == "__metadata__":
      continue
    if entry["dtype"] not in _SAFETENSORS_DTYPES:
      raise UserError(f"{path}: tensor {name} has dtype {entry['dtype']}; supported: "
                      f"{', '.join(_SAFETENSORS_DTYPES)}")
    begin, end = entry["data_offsets"]
    arrays[name] = np.frombuffer(data[start + begin:start + end],
                                 _SAFETENSORS_DTYPES[entry["dtype"]]).reshape(entry["shape"])
  return arrays


def read_weights(model_dir: str) -> dict[str, np.ndarray]:
  """{Hugging Face name: float32 array} from model.safetensors, else pytorch_model.bin."""
  safetensors_path = os.path.join(model_dir, "model.safetensors")
  torch_path = os.path.join(model_dir, "pytorch_model.bin")
  if os.path.exists(safetensors_path):
    weights = read_safetensors(safetensors_path)
  elif os.path.exists(torch_path):
    try:
      import torch  # Optional and heavy: only a pytorch_model.bin needs it.
    except ImportError:
      raise UserError(f"{torch_path} is a PyTorch pickle and torch is not installed; "
                      "pip install torch, or save the model as model.safetensors") from None
    state = torch.load(torch_path, map_location="cpu", weights_only=True)
    weights = {name: tensor.float().numpy() for name, tensor in state.items()}
  else:
    raise UserError(f"{model_dir} holds neither model.safetensors nor pytorch_model.bin")
  return {name: np.asarray(value, np.float32) for name, value in weights.items()}


class _Weights:
  """Hugging Face tensors by name; a missing one is a one-line error naming it."""

  def __init__(self, weights: dict[str, np.ndarray], model_dir: str):
    self.weights, self.model_dir = weights, model_dir

  def get(self, *names: str) -> np.ndarray:
    for name in names:
      for prefixed in (name, f"model.{name}"):
        if prefixed in self.weights:
          return self.weights[prefixed]
    raise UserError(f"{self.model_dir}: the weights lack {names[0]}; not a complete "
                    "MarianMTModel checkpoint")

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

  def layer_norm(self, name: str) -> dict[str, np.ndarray]:
    return dict(scale=self.get(f"{name}.weight"), bias=self.get(f"{name}.bias"))

  def dense(self, name: str) -> dict[str, np.ndarray]:
    return dict(kernel=self.get(f"{name}.weight").T, bias=self.get(f"{name}.bias"))


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


def check_against_model(params: dict, model: Transformer) -> None:
  """Every parameter the model has, with its shape, and nothing else; else a one-line error."""
  expected = traverse_util.flatten_dict(jax.eval_shape(
      lambda: model.init(jax.random.key(0), np.ones((1, 2), np.int32), np.ones((1, 2), np.int32))
  )["params"])
  got = traverse_util.flatten_dict(params)
  for path, leaf in expected.items():
    name = "/".join(path)
    shape = getattr(leaf, "value", leaf).shape
    if path not in got:
      raise UserError(f"the import left parameter {name} unset; the checkpoint does not fit "
                      "this model")
    if got[path].shape != shape:
      raise UserError(f"parameter {name} has shape {got[path].shape} in the checkpoint and "
                      f"{shape} here; config.json does not describe its weights")
  extra = sorted("/".join(path) for path in set(got) - set(expected))
  if extra:
    raise UserError(f"the import made parameter {extra[0]}, which this model lacks")


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
  check_against_model(params, model)

  workdir = os.path.abspath(workdir)
  if os.path.isdir(checkpoints.checkpoint_dir(workdir)):
    raise UserError(f"--workdir={workdir} already holds checkpoints; choose a new directory")
  os.makedirs(workdir, exist_ok=True)
  tokenizer_path = os.path.join(workdir, "tokenizer.model")
  marian_vocab.write_model(vocabulary, tokenizer_path)
  tokenizer = Tokenizer(tokenizer_path)
  with open(os.path.join(workdir, "config.json"), "w") as f:
    f.write(config.to_json_best_effort(indent=2))
  with open(os.path.join(workdir, "marian.json"), "w") as f:
    json.dump(dict(model_dir=model_dir, hf_config=hf,
                   marian_id_of_each_id=vocabulary.marian_ids.tolist(),
                   missing_source_pieces=list(vocabulary.missing_source_pieces)), f, indent=2)

  params = jax.tree.map(jnp.asarray, params)
  state = TrainState(step=jnp.array(0, jnp.int32), params=params,
                     opt_state=make_optimizer(OptimizerConfig.from_config(config)).init(params))
  meta = dict(config=json.loads(config.to_json_best_effort()), tokenizer_sha256=tokenizer.sha256)
  manager = checkpoints.make_manager(checkpoints.checkpoint_dir(workdir), None, async_save=False)
  checkpoints.save(manager, 0, state, None, meta)
  checkpoints.wait_until_finished(manager)
  return ImportReport(workdir, sum(x.size for x in jax.tree.leaves(params)),
                      tokenizer.vocab_size, len(vocab), vocabulary.marian_ids,
                      vocabulary.missing_source_pieces)
