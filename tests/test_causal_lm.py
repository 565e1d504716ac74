"""The causal_lm task: a decoder-only LM trains, evaluates and resumes through the shared trainer."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from transformer_jax.configs import load_module
from transformer_jax.errors import UserError
from transformer_jax.model.decoder_only import DecoderOnly
from transformer_jax.special_tokens import EOS_ID, PAD_ID
from transformer_jax.tasks.causal_lm import lm_loss_sums
from transformer_jax.tasks.registry import load_run, make_task
from transformer_jax.training.loop import train_and_evaluate

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def prepared_dir(tmp_path_factory):
  return tmp_path_factory.mktemp("lm_prepared")


def lm_config(prepared_dir, steps: int, pack: bool = True):
  config = load_module(REPO_ROOT / "experiments" / "configs" / "tiny.py").get_config()
  config.task = "causal_lm"
  config.data.update(dict(prepared_dir=str(prepared_dir), pack=pack, bucket_boundaries=(48,)))
  config.model.dropout_rate = 0.0
  config.update(dict(num_train_steps=steps, schedule="linear_rsqrt", learning_rate=1e-2,
                     warmup_steps=10, log_every_steps=10, eval_every_steps=steps,
                     checkpoint_every_steps=10, async_checkpoints=False))
  return config


def test_causal_lm_trains_and_reports_perplexity(prepared_dir, tmp_path):
  config = lm_config(prepared_dir, steps=100)
  state = train_and_evaluate(config, str(tmp_path / "run"), make_task(config))

  assert int(state.step) == 100
  rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
  train_rows = [row for row in rows if row["split"] == "train"]
  dev = [row for row in rows if row["split"] == "eval"][-1]
  assert train_rows[-1]["perplexity"] < train_rows[0]["perplexity"] / 3, train_rows
  # Far below the perplexity of a uniform guess over the 600-token vocabulary.
  assert 1 < dev["perplexity"] < 150, dev
  run = load_run(str(tmp_path / "run"))
  assert isinstance(run.model, DecoderOnly) and run.step == 100


def test_causal_lm_resumes_exactly(prepared_dir, tmp_path):
  whole = train_and_evaluate(lm_config(prepared_dir, 20), str(tmp_path / "whole"),
                             make_task(lm_config(prepared_dir, 20)))
  train_and_evaluate(lm_config(prepared_dir, 10), str(tmp_path / "split"),
                     make_task(lm_config(prepared_dir, 10)))
  resumed = train_and_evaluate(lm_config(prepared_dir, 20), str(tmp_path / "split"),
                               make_task(lm_config(prepared_dir, 20)))
  for a, b in zip(jax.tree.leaves(jax.device_get(whole)), jax.tree.leaves(jax.device_get(resumed))):
    np.testing.assert_array_equal(a, b)


def test_eval_rows_beyond_learned_positions_are_a_one_line_error_before_training(prepared_dir):
  """Eval never truncates: a dev sentence longer than data.max_len makes a longer row, which
  learned positions must cover. The error comes when the data loads, not at the first eval."""
  config = lm_config(prepared_dir, steps=10)
  config.model.update(dict(positions="learned", max_len=16))
  config.data.update(dict(max_len=16, bucket_boundaries=(16,)))
  task = make_task(config)
  with pytest.raises(UserError, match=r"^the validation split has pairs longer than "
                     r"data.max_len=16, evaluated in rows of 64 tokens, beyond "
                     r"config.model.max_len=16 learned positions; raise config.model.max_len "
                     r"to 64"):
    task.prepare_data()
  config.model.max_len = 64  # Covers the longest row: loads.
  make_task(config).prepare_data()


def test_a_packed_row_scores_each_sentence_as_if_alone(tiny_model_config):
  """Segment ids and restarting positions keep packed sentences from seeing each other."""
  model = DecoderOnly(tiny_model_config)
  first, second = [5, 6, 7, EOS_ID], [8, 9, 10, 11, 12, EOS_ID]
  params = model.init(jax.random.key(0), jnp.ones((1, 8), jnp.int32))["params"]
  packed = dict(target_tokens=jnp.array([first + second + [PAD_ID] * 2]),
                target_segment_ids=jnp.array([[1] * 4 + [2] * 6 + [0] * 2]),
                target_positions=jnp.array([list(range(4)) + list(range(6)) + [0, 0]]))
  _, packed_sums = lm_loss_sums(model, params, packed, False, None, label_smoothing=0.0)
  alone = 0.0
  for sentence in (first, second):
    _, sums = lm_loss_sums(model, params, dict(target_tokens=jnp.array([sentence])), False,
                           None, label_smoothing=0.0)
    alone += float(sums["nll_sum"])
  assert float(packed_sums["tokens"]) == len(first) + len(second)
  np.testing.assert_allclose(float(packed_sums["nll_sum"]), alone, rtol=1e-5)


@pytest.fixture(scope="module")
def short_run(prepared_dir, tmp_path_factory):
  """A causal_lm run of 20 steps (its text is noise, its files are real)."""
  workdir = tmp_path_factory.mktemp("lm_run") / "run"
  config = lm_config(prepared_dir, steps=20)
  train_and_evaluate(config, str(workdir), make_task(config))
  return workdir


def test_translate_refuses_a_causal_lm_run(short_run):
  with pytest.raises(UserError, match="config.task='causal_lm'; this command needs a translation run"):
    load_run(str(short_run), expected_task="translation")


def test_generate_prints_one_continuation_per_prompt(short_run, prepared_dir):
  prompts = "the small dog\n\nmany old neighbors\n"
  env = dict(os.environ, TRANSFORMER_JAX_CACHE_DIR=str(prepared_dir))
  command = [sys.executable, "-m", "transformer_jax.generate", f"--workdir={short_run}",
             "--max_new_tokens=8", "--top_k=10", "--seed=3"]
  completed = subprocess.run(command, input=prompts, capture_output=True, text=True, env=env,
                             cwd=REPO_ROOT, timeout=300)
  assert completed.returncode == 0, completed.stderr[-2000:]
  lines = completed.stdout.splitlines()
  assert len(lines) == 3, lines  # One line for each prompt, the empty one included.
  assert lines[0].startswith("the small dog") and lines[2].startswith("many old neighbors"), lines
  refused = subprocess.run([sys.executable, "-m", "transformer_jax.translate",
                            f"--workdir={short_run}"], input="a dog\n", capture_output=True,
                           text=True, env=env, cwd=REPO_ROOT, timeout=300)
  assert refused.returncode == 2 and refused.stderr.strip().splitlines()[-1].startswith("error:")
  assert "config.task='causal_lm'" in refused.stderr
