"""BERT import: the imported model computes what Hugging Face's BertForMaskedLM computes.

A small BertForMaskedLM with random weights and a WordPiece trained here (no download) is
saved with `save_pretrained`, imported, and compared with PyTorch: the tokenizer's ids,
the logits of a padded batch, and the predictions at [MASK]ed positions.
"""

from __future__ import annotations

import json
import random
import re

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the BERT tests need torch and transformers "
                            "(pip install -e '.[test]')")
transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

from transformer_jax.data.generated import sample_pair  # noqa: E402
from transformer_jax.errors import UserError  # noqa: E402
from transformer_jax.interop import bert  # noqa: E402
from transformer_jax.special_tokens import BOS_ID, EOS_ID, PAD_ID  # noqa: E402
from transformer_jax.tasks.registry import load_run, make_task  # noqa: E402

TEXTS = [en for en, _ in (sample_pair(random.Random(i)) for i in range(800))]
SENTENCES = ["The dog sees the cat.", "Two big birds", "Zebras ☃ wander — naïve café",
             "the teacher gives the child a red apple ."]


@pytest.fixture(scope="module")
def bert_dir(tmp_path_factory):
  folder = tmp_path_factory.mktemp("bert")
  wordpiece = tokenizers.BertWordPieceTokenizer(lowercase=True)
  wordpiece.train_from_iterator(TEXTS, vocab_size=300, min_frequency=2, show_progress=False,
                                special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"])
  wordpiece.save(str(folder / "tokenizer.json"))
  config = transformers.BertConfig(vocab_size=wordpiece.get_vocab_size(), hidden_size=32,
                                   num_hidden_layers=2, num_attention_heads=4,
                                   intermediate_size=64, max_position_embeddings=256)
  torch.manual_seed(0)
  model = transformers.BertForMaskedLM(config).eval()
  with torch.no_grad():  # Larger biases and norms than the initialisation's, so they count.
    for name, parameter in model.named_parameters():
      if name.endswith("bias") or "LayerNorm" in name or "token_type" in name:
        parameter.add_(0.1 * torch.randn_like(parameter))
  model.save_pretrained(folder)
  return folder


@pytest.fixture(scope="module")
def hf(bert_dir):
  model = transformers.BertForMaskedLM.from_pretrained(bert_dir).eval()
  tokenizer = transformers.PreTrainedTokenizerFast(tokenizer_file=str(bert_dir / "tokenizer.json"))
  return model, tokenizer


@pytest.fixture(scope="module")
def imported(bert_dir, tmp_path_factory):
  workdir = tmp_path_factory.mktemp("run") / "bert"
  report = bert.import_bert(str(bert_dir), str(workdir))
  return report, load_run(str(workdir), expected_task="masked_lm")


def test_the_tokenizer_gives_transformers_ids_in_our_numbering(hf, imported, data_dir):
  _, tokenizer = hf
  report, run = imported
  ours_of_theirs = {int(theirs): ours for ours, theirs in enumerate(report.their_ids)}
  with open(data_dir / "multi30k" / "val.en", encoding="utf-8") as f:
    multi30k = [line.rstrip("\n") for _, line in zip(range(300), f)]
  for text in SENTENCES + TEXTS[:50] + multi30k:
    theirs = tokenizer(text, add_special_tokens=False)["input_ids"]
    ours = run.tokenizer.encode(text)
    assert ours[:-1] == [ours_of_theirs[t] for t in theirs] and ours[-1] == EOS_ID, text
    assert run.tokenizer.decode(ours) == tokenizer.decode(theirs)


def _batch(run, report, mask_every: int = 0):
  """[CLS] sentence [SEP] rows, PAD after; with `mask_every`, every k-th word piece is [MASK]."""
  rows = [[BOS_ID] + run.tokenizer.encode(s) for s in SENTENCES]
  mask_id = len(report.their_ids) - 1
  if mask_every:
    rows = [[mask_id if 0 < i < len(r) - 1 and i % mask_every == 0 else t
             for i, t in enumerate(r)] for r in rows]
  width = max(map(len, rows))
  tokens = np.full((len(rows), width), PAD_ID, np.int32)
  for i, r in enumerate(rows):
    tokens[i, :len(r)] = r
  return tokens


def _theirs(model, report, tokens):
  ids = np.where(tokens == PAD_ID, 0, report.their_ids[tokens])
  with torch.no_grad():
    return model(torch.tensor(ids), attention_mask=torch.tensor((tokens != PAD_ID).astype(np.int64)),
                 token_type_ids=torch.zeros(tokens.shape, dtype=torch.long)).logits.numpy()


def test_logits_of_a_padded_batch_equal_pytorch(hf, imported):
  model, _ = hf
  report, run = imported
  tokens = _batch(run, report)
  ours = np.asarray(run.model.apply({"params": run.params}, tokens))
  theirs = _theirs(model, report, tokens)
  real = tokens != PAD_ID
  np.testing.assert_allclose(ours[real], theirs[real][:, report.their_ids], rtol=1e-4, atol=1e-4)


def test_masked_tokens_are_predicted_as_pytorch_predicts_them(hf, imported):
  model, _ = hf
  report, run = imported
  tokens = _batch(run, report, mask_every=2)
  masked = tokens == len(report.their_ids) - 1
  assert masked.sum() >= 8
  task = make_task(run.config)
  assert task.mask_id == len(report.their_ids) - 1  # The masked_lm task's <mask> is [MASK].
  ours = np.argmax(np.asarray(run.model.apply({"params": run.params}, tokens)), axis=-1)
  theirs = np.argmax(_theirs(model, report, tokens), axis=-1)
  np.testing.assert_array_equal(report.their_ids[ours[masked]], theirs[masked])


@pytest.mark.parametrize("field, value, message", [
    ("model_type", "roberta", "is not a BERT (BertForMaskedLM) model"),
    ("hidden_act", "relu", "hidden_act='relu' is not supported"),
    ("position_embedding_type", "relative_key", "position_embedding_type='relative_key'"),
])
def test_an_unsupported_config_is_a_one_line_refusal_that_writes_nothing(
    bert_dir, tmp_path, field, value, message):
  changed = tmp_path / "changed"
  changed.mkdir()
  for file in bert_dir.iterdir():
    (changed / file.name).write_bytes(file.read_bytes())
  config = json.loads((changed / "config.json").read_text())
  config[field] = value
  (changed / "config.json").write_text(json.dumps(config))
  with pytest.raises(UserError, match=re.escape(message)) as error:
    bert.import_bert(str(changed), str(tmp_path / "run"))
  assert "\n" not in str(error.value)
  assert not (tmp_path / "run").exists()


def test_exported_back_transformers_loads_it_with_equal_logits(hf, imported, tmp_path):
  from transformer_jax.interop.hf_export import export_hf

  model, tokenizer = hf
  _, run = imported
  assert export_hf(run, str(tmp_path / "out")) == "bert"
  exported = transformers.BertForMaskedLM.from_pretrained(tmp_path / "out").eval()
  ids = torch.tensor([tokenizer(SENTENCES[3])["input_ids"]])
  with torch.no_grad():
    np.testing.assert_allclose(exported(ids).logits.numpy(), model(ids).logits.numpy(),
                               rtol=1e-5, atol=1e-5)


def test_bert_finetune_trains_the_pair_classifier_from_the_import(imported, data_dir, tmp_path):
  """experiments/configs/bert_finetune.py: Multi30k pairs through BERT's own WordPiece, the
  imported encoder as the start, a few steps."""
  import pathlib

  from transformer_jax.configs import load_module, validate_config
  from transformer_jax.training.loop import train_and_evaluate

  report, _ = imported
  repo = pathlib.Path(__file__).resolve().parents[2]
  config = load_module(repo / "experiments" / "configs" / "bert_finetune.py",
                       "config_bert_finetune").get_config(report.workdir)
  config.data.update(dict(data_dir=str(data_dir), prepared_dir=str(tmp_path / "prepared"),
                          max_len=32, tokens_per_batch=512))
  config.update(dict(num_train_steps=4, eval_every_steps=4, checkpoint_every_steps=4,
                     log_every_steps=2, warmup_steps=2))
  validate_config(config)
  train_and_evaluate(config, str(tmp_path / "ft"), make_task(config))
  dev = [json.loads(line) for line in (tmp_path / "ft" / "metrics.jsonl").read_text().splitlines()]
  evaluations = [r for r in dev if r["split"] == "eval"]
  assert [r["step"] for r in evaluations] == [4] and 0.0 <= evaluations[0]["accuracy"] <= 1.0
