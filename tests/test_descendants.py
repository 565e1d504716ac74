"""prefix_lm, masked_lm and classification through the shared trainer: training, exact resume,
a classifier started from a masked-LM run, and the command lines that take or refuse their runs."""

from __future__ import annotations

import json
import os
import pathlib
import re
import shutil
import subprocess
import sys

import jax
import numpy as np
import pytest
from flax import traverse_util

from transformer_jax.configs import load_module
from transformer_jax.data.tokenizer import train_tokenizer
from transformer_jax.errors import UserError
from transformer_jax.tasks.registry import TRANSLATION_TASKS, load_run, make_task
from transformer_jax.training import loop
from transformer_jax.training.loop import train_and_evaluate

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def prepared_dir(tmp_path_factory):
  return tmp_path_factory.mktemp("descendants_prepared")


def task_config(prepared_dir, task: str, steps: int, **overrides):
  config = load_module(REPO_ROOT / "experiments" / "configs" / "tiny.py").get_config()
  config.task = task
  config.data.update(dict(prepared_dir=str(prepared_dir), bucket_boundaries=(48,),
                          pack=task != "classification"))
  config.model.dropout_rate = 0.1
  config.update(dict(num_train_steps=steps, schedule="linear_rsqrt", learning_rate=1e-2,
                     warmup_steps=10, log_every_steps=10, eval_every_steps=steps,
                     checkpoint_every_steps=10, async_checkpoints=False, eval_bleu_sentences=0))
  if task == "masked_lm":
    config.update(dict(text_side="pair", label_smoothing=0.0))
  config.update(overrides)
  return config


def train(prepared_dir, workdir, task: str, steps: int, dropout_free: bool = False, **overrides):
  config = task_config(prepared_dir, task, steps, **overrides)
  if dropout_free:
    config.model.dropout_rate = 0.0
  return train_and_evaluate(config, str(workdir), make_task(config))


def dev_rows(workdir) -> list[dict]:
  rows = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
  return [row for row in rows if row["split"] == "eval"]


@pytest.fixture(scope="module")
def mlm_run(prepared_dir, tmp_path_factory):
  workdir = tmp_path_factory.mktemp("mlm") / "run"
  train(prepared_dir, workdir, "masked_lm", 40, dropout_free=True)
  return workdir


@pytest.fixture(scope="module")
def prefix_lm_run(prepared_dir, tmp_path_factory):
  workdir = tmp_path_factory.mktemp("prefix_lm") / "run"
  train(prepared_dir, workdir, "prefix_lm", 20)
  return workdir


def test_masked_lm_learns_and_reports_masked_token_accuracy(mlm_run):
  dev = dev_rows(mlm_run)[-1]
  # The generated corpus has ~600 pieces: a uniform guess is right 0.2% of the time.
  assert dev["accuracy"] > 0.02 and dev["perplexity"] < 600, dev


@pytest.mark.parametrize("task", ["prefix_lm", "masked_lm", "classification"])
def test_each_task_resumes_exactly(prepared_dir, tmp_path, task):
  whole = train(prepared_dir, tmp_path / "whole", task, 20)
  train(prepared_dir, tmp_path / "split", task, 10)
  resumed = train(prepared_dir, tmp_path / "split", task, 20)
  for a, b in zip(jax.tree.leaves(jax.device_get(whole)), jax.tree.leaves(jax.device_get(resumed))):
    np.testing.assert_array_equal(a, b)


def test_a_classifier_starts_from_the_masked_lm_encoder(prepared_dir, mlm_run, tmp_path):
  config = task_config(prepared_dir, "classification", 10, init_from=str(mlm_run))
  run, state, train_iter = loop.set_up(config, str(tmp_path / "cls"), make_task(config))
  state = loop.restore_or_start(run, state, train_iter)
  mlm = traverse_util.flatten_dict(load_run(str(mlm_run)).params)
  classifier = traverse_util.flatten_dict(state.params)
  shared = [path for path in classifier if path in mlm]
  assert {path[0] for path in classifier if path not in mlm} == {"pooler", "classifier"}
  assert any(path[0] == "encoder_1" for path in shared) and ("token_embedding", "embedding") in shared
  for path in shared:
    np.testing.assert_array_equal(np.asarray(classifier[path]), np.asarray(mlm[path]))
  checkpoints_dir = tmp_path / "cls" / "checkpoints"
  assert not checkpoints_dir.exists() or not any(checkpoints_dir.iterdir())


def test_init_from_refuses_a_run_with_another_tokenizer(prepared_dir, mlm_run, tmp_path):
  other = tmp_path / "other"
  shutil.copytree(mlm_run, other)
  words = [f"word{i} thing{i % 7} other{i % 13}" for i in range(400)]
  tokenizer = train_tokenizer(words, 100, "bpe", tmp_path / "other.model")
  tokenizer.save_copy(other / "tokenizer.model")
  config = task_config(prepared_dir, "classification", 10, init_from=str(other))
  with pytest.raises(UserError, match="has another tokenizer"):
    train_and_evaluate(config, str(tmp_path / "cls"), make_task(config))


def test_commands_refuse_a_run_of_another_task_in_one_line(mlm_run, prefix_lm_run):
  with pytest.raises(UserError, match="config.task='masked_lm'; this command needs a "
                                      "translation or prefix_lm run"):
    load_run(str(mlm_run), expected_task=TRANSLATION_TASKS)
  with pytest.raises(UserError, match="config.task='prefix_lm'; this command needs a causal_lm"):
    load_run(str(prefix_lm_run), expected_task="causal_lm")


def test_translate_decodes_a_prefix_lm_run(prefix_lm_run, prepared_dir):
  env = dict(os.environ, TRANSFORMER_JAX_CACHE_DIR=str(prepared_dir))
  command = [sys.executable, "-m", "transformer_jax.translate", f"--workdir={prefix_lm_run}",
             "--beam_size=2"]
  completed = subprocess.run(command, input="A small dog.\nTwo cats sleep.\n", capture_output=True,
                             text=True, env=env, cwd=REPO_ROOT, timeout=300)
  assert completed.returncode == 0, completed.stderr[-2000:]
  assert len(completed.stdout.splitlines()) == 2, completed.stdout


@pytest.fixture(scope="module")
def translation_run(prepared_dir, tmp_path_factory):
  workdir = tmp_path_factory.mktemp("translation") / "run"
  train(prepared_dir, workdir, "translation", 20)
  return workdir


def test_translate_and_evaluate_decode_an_ensemble_of_runs(translation_run, prefix_lm_run,
                                                           prepared_dir, tmp_path):
  """`--ensemble`: a run ensembled with itself translates as it does alone; an encoder-decoder
  and a prefix LM of one vocabulary are scored as one model, the runs named in the scores."""
  env = dict(os.environ, TRANSFORMER_JAX_CACHE_DIR=str(prepared_dir))
  sentences = "A small dog.\nTwo cats sleep.\n"

  def command(name: str, *flags: str) -> subprocess.CompletedProcess:
    completed = subprocess.run([sys.executable, "-m", f"transformer_jax.{name}", *flags],
                               input=sentences, capture_output=True, text=True, env=env,
                               cwd=REPO_ROOT, timeout=300)
    assert completed.returncode == 0, completed.stderr[-2000:]
    return completed

  alone = command("translate", f"--workdir={translation_run}", "--method=greedy")
  doubled = command("translate", f"--workdir={translation_run}", "--method=greedy",
                    f"--ensemble={translation_run}")
  assert doubled.stdout == alone.stdout and len(alone.stdout.splitlines()) == 2

  source, reference = tmp_path / "src.txt", tmp_path / "ref.txt"
  source.write_text(sentences)
  reference.write_text("Ein kleiner Hund.\nZwei Katzen schlafen.\n")
  evaluated = command("evaluate", f"--workdir={translation_run}", f"--ensemble={prefix_lm_run}",
                      f"--source={source}", f"--reference={reference}", "--beam_size=2")
  scores = json.loads(evaluated.stdout.strip().splitlines()[-1])
  assert scores["ensemble"] == [str(translation_run), str(prefix_lm_run)]
  assert scores["decoding"]["ensemble"] == 2
  assert re.fullmatch(r"src\.txt\.latest\.ensemble-2-[0-9a-f]{8}\.txt",
                      pathlib.Path(scores["hypotheses_file"]).name)
  assert len(pathlib.Path(scores["hypotheses_file"]).read_text().splitlines()) == 2


def test_an_ensemble_refuses_a_run_of_another_task_in_one_line(translation_run, mlm_run,
                                                               prepared_dir):
  completed = subprocess.run(
      [sys.executable, "-m", "transformer_jax.translate", f"--workdir={translation_run}",
       f"--ensemble={mlm_run}"], input="A dog.\n", capture_output=True, text=True,
      env=dict(os.environ, TRANSFORMER_JAX_CACHE_DIR=str(prepared_dir)), cwd=REPO_ROOT,
      timeout=300)
  assert completed.returncode != 0
  assert "config.task='masked_lm'; this command needs a translation or prefix_lm run" in (
      completed.stderr.strip().splitlines()[-1])


def test_masking_chooses_15_percent_of_ordinary_tokens_and_splits_them_80_10_10():
  from transformer_jax.special_tokens import BOS_ID, EOS_ID, FIRST_PIECE_ID, PAD_ID
  from transformer_jax.tasks.masked_lm import mask_tokens

  mask_id = 1000
  rng = np.random.default_rng(0)
  tokens = rng.integers(FIRST_PIECE_ID, mask_id, size=(400, 500)).astype(np.int32)
  tokens[:, :3] = (BOS_ID, EOS_ID, PAD_ID)
  inputs, chosen = map(np.asarray, mask_tokens(jax.random.key(0), tokens, 0.15, mask_id))
  assert not chosen[:, :3].any()  # Specials are never chosen.
  assert chosen[:, 3:].mean() == pytest.approx(0.15, abs=0.003)
  picked, shown = tokens[chosen], inputs[chosen]
  assert (shown == mask_id).mean() == pytest.approx(0.8, abs=0.01)
  random = (shown != mask_id) & (shown != picked)
  assert random.mean() == pytest.approx(0.1 * (1 - 1 / (mask_id - FIRST_PIECE_ID)), abs=0.01)
  assert ((shown >= FIRST_PIECE_ID) & (shown <= mask_id)).all()
  np.testing.assert_array_equal(inputs[~chosen], tokens[~chosen])  # The rest is unchanged.


def test_the_masked_lm_loss_falls_on_the_chosen_tokens_only(tiny_model_config):
  from transformer_jax.configs import default_config
  from transformer_jax.tasks.masked_lm import MaskedLMTask, eval_key, mask_tokens

  config = default_config()
  config.model = tiny_model_config
  config.update(dict(text_side="target", label_smoothing=0.0))
  task = MaskedLMTask(config)
  model = task.build_model()
  params = task.init_params(model, jax.random.key(0))
  rng = np.random.default_rng(1)
  targets = rng.integers(4, 63, size=(8, 20)).astype(np.int32)
  targets[:, 15] = 3
  targets[:, 16:] = 0
  batch = dict(target_tokens=jax.numpy.asarray(targets))
  _, sums = task.loss_sums(model, params, batch, False, None)
  _, chosen = mask_tokens(eval_key(config.seed, batch["target_tokens"]), batch["target_tokens"],
                          0.15, task.mask_id)
  assert float(sums["tokens"]) == int(np.sum(chosen)) > 0
  _, again = task.loss_sums(model, params, batch, False, None)  # Evaluation masks are fixed.
  assert float(again["loss_sum"]) == float(sums["loss_sum"])


def test_mismatched_pairs_take_another_rows_target():
  from transformer_jax.tasks.classification import MISMATCHED, TRUE_PAIR, mismatch_pairs

  src = np.arange(4, 4 + 64 * 3, dtype=np.int32).reshape(64, 3)
  tgt = src + 1000
  tgt[-1] = 0  # A row that only fills the batch.
  batch, labels, valid = mismatch_pairs(jax.random.key(0), dict(src_tokens=src, target_tokens=tgt))
  labels, valid, target = map(np.asarray, (labels, valid, batch["target_tokens"]))
  assert 20 < np.sum(labels == TRUE_PAIR) < 44
  for row in range(64):
    expected = tgt[row] if labels[row] == TRUE_PAIR else tgt[row - 1]
    np.testing.assert_array_equal(target[row], expected)
  assert valid.sum() == 64 - (labels[-1] == TRUE_PAIR) - (labels[0] == MISMATCHED)


def test_a_mismatched_pair_never_keeps_its_own_target():
  """A micro-batch of one row, or a repeated sentence beside itself: the swapped target is the
  row's own, so those MISMATCHED rows would teach that true pairs are mismatched."""
  from transformer_jax.tasks.classification import MISMATCHED, mismatch_pairs

  src = np.arange(4, 4 + 64 * 3, dtype=np.int32).reshape(64, 3)
  tgt = src + 1000
  tgt[1::2] = tgt[0::2]  # Every target twice in a row.
  _, labels, valid = mismatch_pairs(jax.random.key(0), dict(src_tokens=src, target_tokens=tgt))
  labels, valid = np.asarray(labels), np.asarray(valid)
  odd = np.arange(64) % 2 == 1  # Their row r-1 holds the same target.
  assert np.any(odd & (labels == MISMATCHED))
  assert not np.any(valid & odd & (labels == MISMATCHED))
  assert np.all(valid[~odd | (labels != MISMATCHED)])
  for seed in range(8):  # One row alone.
    _, label, alone = mismatch_pairs(jax.random.key(seed), dict(src_tokens=src[:1], target_tokens=tgt[:1]))
    assert bool(alone[0]) == (int(label[0]) != MISMATCHED)


def test_monolingual_plain_text_is_read_as_both_sides(tmp_path):
  from transformer_jax.data.config import resolve_data_config
  from transformer_jax.data.corpus import resolve_corpus

  text = tmp_path / "de.txt"
  text.write_text("Ein Hund läuft.\nZwei Katzen schlafen.\n", encoding="utf-8")
  corpus = resolve_corpus(resolve_data_config(dict(
      dataset="plain_text", prepared_dir=str(tmp_path), plain_text=dict(train_target=str(text)))))
  assert corpus.files == {"train": (str(text), str(text))}
  with pytest.raises(UserError, match="plain_text.train_source needs plain_text.train_target"):
    resolve_corpus(resolve_data_config(dict(
        dataset="plain_text", prepared_dir=str(tmp_path), plain_text=dict(train_source=str(text)))))


def test_an_unknown_tfds_text_dataset_is_one_line(tmp_path):
  from transformer_jax.data.config import resolve_data_config
  from transformer_jax.data.corpus import resolve_corpus
  from transformer_jax.data.pipeline import load_dataset

  config = dict(dataset="tfds_text", tfds_name="no_such_dataset", prepared_dir=str(tmp_path))
  assert resolve_corpus(resolve_data_config(config)).source_feature == "text"
  with pytest.raises(UserError, match="tfds_name='no_such_dataset' is not a TFDS dataset"):
    load_dataset(config)
