"""The algorithmic problems: their answers, their stream, exact match as greedy decoding's,
a run through the trainer with its report by length, and the length study's rows."""

from __future__ import annotations

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from transformer_jax.configs import load_module, validate_config
from transformer_jax.data import algorithmic
from transformer_jax.errors import UserError
from transformer_jax.special_tokens import EOS_ID, PAD_ID
from transformer_jax.tasks.algorithmic import AlgorithmicTask, exact_matches, length_buckets
from transformer_jax.tasks.registry import make_task
from transformer_jax.training.loop import train_and_evaluate

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG = os.path.join(REPO, "experiments", "configs", "length_generalisation.py")


def study_config(**changes):
  config = load_module(CONFIG, "config_length_generalisation").get_config(
      changes.pop("architecture", "decoder_only"))
  for key, value in changes.items():
    section, _, name = key.rpartition(".")
    (config[section] if section else config)[name] = value
  return config


def _numbers(text: str) -> list[int]:
  return [int(token) for token in text.split() if token != "+"]


@pytest.mark.parametrize("problem", algorithmic.PROBLEMS)
def test_targets_solve_the_problem_and_fill_their_stated_lengths(problem):
  rng = np.random.default_rng(0)
  items = np.array([1, 3, 7, 12])
  src_len = algorithmic.source_length(problem, 12)
  target_len = algorithmic.target_length(problem, 12)
  batch = algorithmic.make_batch(problem, items, rng, src_len, target_len)
  for row, n in enumerate(items):
    src, target = batch["src_tokens"][row], batch["target_tokens"][row]
    assert np.sum(src != PAD_ID) == algorithmic.source_length(problem, n)
    assert np.sum(target != PAD_ID) == algorithmic.target_length(problem, n)
    assert src[np.sum(src != PAD_ID) - 1] == EOS_ID
    source, answer = algorithmic.to_text(src), _numbers(algorithmic.to_text(target))
    if problem == "addition":
      first, second = (int("".join(side.split()[::-1])) for side in source.split(" + "))
      assert int("".join(map(str, answer[::-1]))) == first + second
      assert len(answer) == n + 1  # The carry digit always, 0 or 1.
    else:
      digits = _numbers(source)
      expected = {"copy": digits, "reverse": digits[::-1], "sort": sorted(digits),
                  "duplicate": digits + digits}[problem]
      assert answer == expected


def test_addition_carries_through_every_digit():
  source, target = algorithmic.solve("addition", np.array([[9, 9, 9], [1, 0, 0]]))
  assert algorithmic.to_text(algorithmic.token_ids(source)) == "9 9 9 + 1 0 0"
  assert target.tolist() == [0, 0, 0, 1]  # 999 + 1 = 1000, least significant first.


def test_the_train_stream_is_reproducible_and_resumes_where_it_stopped():
  def stream():
    return algorithmic.TrainStream("reverse", 8, rows=16, src_len=10, target_len=10, seed=3)

  first = stream()
  batches = [next(first) for _ in range(3)]
  resumed = stream()
  resumed.set_state(dict(index=2))
  np.testing.assert_array_equal(next(resumed)["src_tokens"], batches[2]["src_tokens"])
  other_host = algorithmic.TrainStream("reverse", 8, 16, 10, 10, seed=3, process_index=1)
  assert not np.array_equal(next(other_host)["src_tokens"], batches[0]["src_tokens"])
  lengths = np.sum(np.concatenate([b["src_tokens"] for b in batches]) != PAD_ID, axis=1) - 1
  assert lengths.min() >= 1 and lengths.max() <= 8


def test_exact_match_counts_a_row_only_when_every_target_token_is_the_argmax():
  targets = jnp.array([[5, 6, EOS_ID], [5, 6, EOS_ID], [5, EOS_ID, PAD_ID], [PAD_ID] * 3])
  predicted = jnp.array([[5, 6, EOS_ID], [5, 7, EOS_ID], [5, EOS_ID, 9], [1, 1, 1]])
  exact, real = exact_matches(jax.nn.one_hot(predicted, 16), targets)
  assert exact.tolist() == [True, False, True, False]
  assert real.tolist() == [True, True, True, False]


def test_buckets_average_the_lengths_of_each_multiple_of_the_training_length():
  by_items = {n: float(n <= 2) for n in range(1, 9)}
  assert length_buckets(by_items, 2) == {"1-2": 1.0, "3-4": 0.0, "5-6": 0.0, "7-8": 0.0}


def _greedy(task, model, params, batch):
  """Greedy decoding by full recompute: the target grows one argmax at a time. Slots not yet
  decoded hold a digit, not PAD (shift_right drops the input where the target is PAD); the
  causal mask keeps them from the slots before."""
  targets = np.full_like(batch["target_tokens"], algorithmic.DIGIT_IDS[0])
  for t in range(targets.shape[1]):
    logits = task.logits(model, params, dict(batch, target_tokens=jnp.asarray(targets)), False,
                         None)
    targets[:, t] = np.asarray(jnp.argmax(logits[:, t], axis=-1))
  done = np.cumsum(targets == EOS_ID, axis=1) - (targets == EOS_ID) > 0  # After the first EOS.
  return np.where(done, PAD_ID, targets)


@pytest.mark.parametrize("architecture", ["decoder_only", "encoder_decoder"])
def test_teacher_forced_exact_match_equals_greedy_decoding(architecture):
  config = study_config(architecture=architecture, **{
      "algorithmic.problem": "copy", "algorithmic.train_max_items": 3, "model.d_model": 32,
      "model.d_ff": 64, "model.num_layers": 1, "model.positions": "sinusoidal"})
  task = AlgorithmicTask(config)
  model = task.build_model()
  params = task.init_params(model, jax.random.key(0))
  optimizer = optax.adam(3e-3)
  opt_state = optimizer.init(params)

  @jax.jit
  def update(params, opt_state, batch):
    grads = jax.grad(lambda p: task.loss_sums(model, p, batch, False, None)[0])(params)
    updates, opt_state = optimizer.update(grads, opt_state)
    return optax.apply_updates(params, updates), opt_state

  stream = algorithmic.TrainStream("copy", 3, 32, 6, 6, seed=0)
  for _ in range(150):
    params, opt_state = update(params, opt_state, next(stream))
  lengths = range(1, 7)  # Some inside the training lengths, some beyond.
  batch = algorithmic.eval_set("copy", lengths, 16, 1, algorithmic.source_length("copy", 6),
                               algorithmic.target_length("copy", 6))
  inputs = {k: jnp.asarray(v) for k, v in batch.items() if k != "items"}
  logits = task.logits(model, params, inputs, False, None)
  teacher_forced, _ = exact_matches(logits, inputs["target_tokens"])
  greedy = _greedy(task, model, params, inputs)
  decoded = np.all(greedy == batch["target_tokens"], axis=1)
  np.testing.assert_array_equal(np.asarray(teacher_forced), decoded)
  assert 0 < decoded.sum() < len(decoded), "both outcomes occur, so the comparison can fail"


def test_a_run_trains_and_reports_exact_match_at_every_test_length(tmp_path):
  config = study_config(**{
      "algorithmic.problem": "reverse", "algorithmic.train_max_items": 2,
      "algorithmic.test_max_items": 6, "algorithmic.test_per_length": 8,
      "algorithmic.eval_per_length": 4, "model.d_model": 32, "model.d_ff": 64,
      "model.num_layers": 1, "model.max_len": 16, "data.max_len": 6,
      "data.tokens_per_batch": 96, "num_train_steps": 6, "eval_every_steps": 3,
      "checkpoint_every_steps": 3, "log_every_steps": 3})
  validate_config(config)
  task = make_task(config)
  train_and_evaluate(config, os.fspath(tmp_path), task)
  report = task.final_report(os.fspath(tmp_path))
  assert list(report["exact_match_by_bucket"]) == ["1-2", "3-4", "5-6"]
  assert set(report["exact_match_by_items"]) == {str(n) for n in range(1, 7)}
  assert all(0.0 <= v <= 1.0 for v in report["exact_match_by_items"].values())
  assert report["checkpoint_step"] == 6
  assert json.loads((tmp_path / "final_test.json").read_text()) == report
  dev = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
  assert any("exact_match" in row for row in dev if row["split"] == "eval")
  assert not (tmp_path / "tokenizer.model").exists()

  # The same run directory with another problem: refused before a step, the checkpoint kept.
  steps = lambda: sorted(int(p.name) for p in (tmp_path / "checkpoints").iterdir()
                         if p.name.isdigit())
  saved = steps()
  config.algorithmic.problem, config.num_train_steps = "sort", 9
  with pytest.raises(UserError, match=r"^the checkpoint in .* was saved with problem 'reverse' "
                     r"\(this config: 'sort'\); use the config the run was started with"):
    train_and_evaluate(config, os.fspath(tmp_path), make_task(config))
  assert steps() == saved and saved[-1] == 6, (saved, steps())


@pytest.mark.parametrize("changes, message", [
    ({"algorithmic.problem": "multiply"}, "algorithmic.problem='multiply' is not one of"),
    ({"algorithmic.architecture": "encoder"}, "algorithmic.architecture='encoder'"),
    ({"algorithmic.train_max_items": 40}, "must be in 1..algorithmic.test_max_items"),
    ({"data.max_len": 8}, "set --config.data.max_len=9"),
    ({"model.max_len": 60}, "set --config.model.max_len=66"),
    ({"final_eval_split": "validation"}, "set it to 'test' or ''"),
])
def test_a_config_that_cannot_run_is_a_one_line_error(changes, message):
  config = study_config(**changes)
  with pytest.raises(UserError, match=message) as error:
    validate_config(config)
  assert "\n" not in str(error.value)


def test_the_study_runs_every_cell_seed_major_and_tabulates_mean_and_std():
  study = load_module(os.path.join(REPO, "experiments", "length_generalisation.py"),
                      "length_generalisation_study")
  rows = study.study_rows(["copy", "sort"], ["decoder_only", "encoder_decoder"],
                          ["none", "rope"], seeds=2)
  assert len(rows) == 16 and [r.overrides["seed"] for r in rows] == [0] * 8 + [1] * 8
  assert rows[0].name == "copy_dec_none_seed0"
  assert {r.overrides["model.num_layers"] for r in rows
          if r.overrides["algorithmic.architecture"] == "encoder_decoder"} == {2}
  for row in rows:  # Every row is a config the trainer accepts.
    config = study_config()
    for key, value in row.overrides.items():
      section, _, name = key.rpartition(".")
      (config[section] if section else config)[name] = value
    validate_config(config)
  results = {r.name: {"final": {"exact_match_by_bucket": {"1-8": 1.0, "9-16": seed / 2},
                                "exact_match_by_items": {}}}
             for r, seed in zip(rows, [0] * 8 + [1] * 8)}
  table = study.format_tables(rows, results)
  assert "| decoder_only | none | 2 | 100 ± 0 | 25 ± 35 |" in table
  assert table.index("### copy") < table.index("### sort")
