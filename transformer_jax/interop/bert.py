"""BERT checkpoints of Hugging Face `BertForMaskedLM` as this package's EncoderOnly (head "mlm").

BERT is the encoder-only stack with these options of `config.model`: post-LN with
LayerNorm ε 1e-12, learned positions, a LayerNorm on the embeddings, GELU, biases on
the attention projections and on the output logits, the output tied to the token
embedding, and no ×√d_model on the embeddings; its masked-LM head (a dense layer,
GELU, a LayerNorm, the tied projection) is EncoderOnly's. Token-type (segment)
embeddings are folded in: type 0's row is added to every position's, which is
exactly BERT for one-segment input. The WordPiece vocabulary is read through the
`tokenizers` package: [PAD], [UNK], [CLS] and [SEP] take our PAD, UNK, BOS and EOS,
and [MASK] becomes the masked_lm task's <mask>, the model's last row.

`import_bert(model_dir, workdir)` reads a local directory (config.json,
model.safetensors or pytorch_model.bin, tokenizer.json) and writes a masked_lm run
directory that `train --config.init_from` (a classifier, more pre-training) reads.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import jax
import numpy as np

from transformer_jax.data import hf_tokenizer
from transformer_jax.errors import UserError
from transformer_jax.interop.imported_run import (HFWeights, read_hf_config, read_weights,
                                                  run_config, write_hf_run)
from transformer_jax.model.encoder_only import EncoderOnly
from transformer_jax.tasks.masked_lm import MaskedLMTask

ACTIVATIONS = {"gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh"}
_REQUIRED = {"position_embedding_type": "absolute", "is_decoder": False,
             "add_cross_attention": False, "tie_word_embeddings": True}
SPECIAL = {"pad": "[PAD]", "unk": "[UNK]", "bos": "[CLS]", "eos": "[SEP]"}
MASK = "[MASK]"


@dataclasses.dataclass(frozen=True)
class ImportReport:
  workdir: str
  num_parameters: int
  vocab_size: int  # The model's: the tokenizer's, then [MASK].
  their_ids: np.ndarray  # int[vocab_size]: BERT's id of each of our ids, [MASK]'s last.


def read_config(model_dir: str) -> dict:
  """config.json of a Hugging Face BERT directory, checked to be one this model expresses."""
  hf = read_hf_config(model_dir, "bert", "BERT (BertForMaskedLM)", _REQUIRED)
  if hf.get("hidden_act", "gelu") not in ACTIVATIONS:
    raise UserError(f"config.json hidden_act={hf['hidden_act']!r} is not supported; supported: "
                    f"{', '.join(ACTIVATIONS)}")
  return hf


def model_section(hf: dict, vocab_size: int) -> dict:
  """`config.model` for the BERT of config.json `hf`, with our `vocab_size` ([MASK] included)."""
  return dict(
      vocab_size=vocab_size, num_layers=hf["num_hidden_layers"], d_model=hf["hidden_size"],
      d_ff=hf["intermediate_size"], num_heads=hf["num_attention_heads"],
      dropout_rate=float(hf.get("hidden_dropout_prob", 0.1)),
      attention_dropout_rate=float(hf.get("attention_probs_dropout_prob", 0.1)),
      relu_dropout_rate=0.0, positions="learned", max_len=hf["max_position_embeddings"],
      activation=ACTIVATIONS[hf.get("hidden_act", "gelu")], attention_bias=True,
      logits_bias=True, tie_output=True, embedding_scale=False, embedding_norm=True,
      layer_norm_epsilon=float(hf.get("layer_norm_eps", 1e-12)), norm="post")


def vocabulary_of(published: dict, name: str = "the tokenizer") -> tuple[np.ndarray, int]:
  """(BERT's id of each of our tokenizer's ids, [MASK]'s id) from a tokenizer.json's content."""
  try:
    vocab = published["model"]["vocab"]
  except (KeyError, TypeError):
    raise UserError(f"{name} holds no WordPiece vocabulary") from None
  missing = [token for token in (*SPECIAL.values(), MASK) if token not in vocab]
  if missing:
    raise UserError(f"{name} lacks {', '.join(missing)}; not a BERT vocabulary")
  ids = hf_tokenizer.reserved_ids(len(vocab), {role: vocab[t] for role, t in SPECIAL.items()})
  return ids[ids != vocab[MASK]], int(vocab[MASK])


def convert_params(weights: dict[str, np.ndarray], hf: dict, rows: np.ndarray,
                   model_dir: str = "the model") -> dict:
  """Our EncoderOnly's params from BertForMaskedLM tensors; `rows[i]` is the BERT row that
  our row i takes."""
  w = HFWeights(weights, model_dir, "bert.", "BertForMaskedLM")
  get, norm, dense = w.get, w.layer_norm, w.dense

  heads, d_model = hf["num_attention_heads"], hf["hidden_size"]
  positions = get("embeddings.position_embeddings.weight")
  segment = get("embeddings.token_type_embeddings.weight")[0]  # Type 0, folded in.
  params: dict[str, Any] = {
      "token_embedding": {"embedding": get("embeddings.word_embeddings.weight")[rows]},
      "embed": {"positions": {"position_embedding": positions + segment},
                "norm": norm("embeddings.LayerNorm")},
      "head_transform": dense("cls.predictions.transform.dense"),
      "head_norm": norm("cls.predictions.transform.LayerNorm"),
      "logits_bias": {"bias": get("cls.predictions.bias")[rows]},
  }
  for i in range(hf["num_hidden_layers"]):
    prefix = f"encoder.layer.{i}"
    attention = {}
    for name in ("query", "key", "value"):  # Linear: [out, in].
      attention[name] = get(f"{prefix}.attention.self.{name}.weight").T.reshape(
          d_model, heads, -1)
      attention[f"{name}_bias"] = get(f"{prefix}.attention.self.{name}.bias").reshape(heads, -1)
    attention["out"] = get(f"{prefix}.attention.output.dense.weight").T.reshape(
        heads, -1, d_model)
    attention["out_bias"] = get(f"{prefix}.attention.output.dense.bias")
    params[f"encoder_{i}"] = {
        "self_attention": attention,
        "self_attention_block": {"norm": norm(f"{prefix}.attention.output.LayerNorm")},
        "feed_forward": {"wi": dense(f"{prefix}.intermediate.dense"),
                         "wo": dense(f"{prefix}.output.dense")},
        "feed_forward_block": {"norm": norm(f"{prefix}.output.LayerNorm")},
    }
  return params


def import_bert(model_dir: str, workdir: str) -> ImportReport:
  """Writes the run directory `workdir` for the BERT in `model_dir` (module docstring)."""
  model_dir = os.path.abspath(model_dir)
  hf = read_config(model_dir)
  tokenizer_json = os.path.join(model_dir, "tokenizer.json")
  published = hf_tokenizer.read_published(tokenizer_json)
  ids, mask = vocabulary_of(published, tokenizer_json)
  rows = np.append(ids, mask)
  config = run_config(MaskedLMTask.name, model_section(hf, len(rows)))
  model = EncoderOnly(config.model, head="mlm")  # Validates the model section first.
  params = convert_params(read_weights(model_dir), hf, rows, model_dir)
  count = write_hf_run(workdir, config, params,
                       lambda: model.init(jax.random.key(0), np.ones((1, 2), np.int32)),
                       published, ids)
  return ImportReport(os.path.abspath(workdir), count, len(rows), rows)
