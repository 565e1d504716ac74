"""Bad configs, flags, files and inputs: one `error: ` line, exit 2, no traceback,
and no file of an existing run changed.

Every case runs the real command's `main` with its flags, in this process;
the cases marked `subprocess` run it as `python -m transformer_jax.<module>`
(absl's own flag errors, a config file that raises on load, a translation
that succeeds), started together in a module fixture.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import pathlib
import shutil
from typing import Callable

import pytest

from fault_tolerance import runner

WORKERS = 2  # The machine's cores.


@dataclasses.dataclass(frozen=True)
class Case:
  name: str
  module: str  # train, translate, evaluate, average_checkpoints.
  flags: tuple[str, ...]  # {tmp}, {workdir}, {prepared} are filled in.
  expect: tuple[str, ...]  # Fragments of the one error line.
  workdir: str = "trained"  # trained: a copy of the finished run; fresh: a new folder.
  prepare: Callable[[pathlib.Path, pathlib.Path], None] | None = None  # (tmp, workdir).
  stdin: bytes = b""
  base_flags: bool = True  # train: the tiny config and data flags, and --workdir.
  exit_code: int = 2
  subprocess: bool = False  # Run as a real process (8 simulated devices) instead of in-process.


def _write(path: pathlib.Path, data: bytes) -> None:
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_bytes(data)


def _plain_text(source: bytes, target: bytes):
  def prepare(tmp: pathlib.Path, workdir: pathlib.Path) -> None:
    del workdir
    _write(tmp / "train.src", source)
    _write(tmp / "train.tgt", target)
  return prepare


def _another_tokenizer(tmp: pathlib.Path, workdir: pathlib.Path) -> None:
  from transformer_jax.data.tokenizer import train_tokenizer

  words = "the a cat dog sees walks house small old man runs big red".split()
  texts = [" ".join(words[i:] + words[:i]) for i in range(len(words))] * 5
  train_tokenizer(texts, 40, "bpe", workdir / "tokenizer.model")


def _without_checkpoints(tmp: pathlib.Path, workdir: pathlib.Path) -> None:
  shutil.rmtree(workdir / "checkpoints")


def _config_that_raises(tmp: pathlib.Path, workdir: pathlib.Path) -> None:
  _write(tmp / "broken.py", b"def get_config():\n  return 1 / 0\n")


def _source_and_reference(tmp: pathlib.Path, workdir: pathlib.Path) -> None:
  _write(tmp / "source.txt", b"the cat .\nthe dog .\n")
  _write(tmp / "reference.txt", b"die katze .\nder hund .\ndas haus .\n")


PLAIN_TEXT = ("--config.data.dataset=plain_text",
              "--config.data.plain_text.train_source={tmp}/train.src",
              "--config.data.plain_text.train_target={tmp}/train.tgt")

CASES = [
    # --- train: flags and config values.
    Case("unknown_model_key", "train", ("--config.model.dropout_rte=0.1",),
         ("unknown config key --config.model.dropout_rte",
          "did you mean --config.model.dropout_rate"), workdir="fresh"),
    Case("learned_positions_shorter_than_the_rows", "train",
         ("--config.model.positions=learned", "--config.model.max_len=8"),
         ("config.model.max_len=8 learned positions cannot cover rows of 48 tokens",
          "raise config.model.max_len to 48"), workdir="fresh"),
    Case("value_of_the_wrong_type", "train", ("--config.model.d_model=abc",),
         ("--config.model.d_model=abc",), workdir="fresh"),
    Case("heads_do_not_divide_d_model", "train", ("--config.model.num_heads=5",),
         ("num_heads=5 does not divide d_model=32",), workdir="fresh"),
    Case("dropout_above_one", "train", ("--config.model.dropout_rate=1.5",),
         ("config.model.dropout_rate=1.5 must be in [0, 1)",), workdir="fresh"),
    Case("zero_train_steps", "train", ("--config.num_train_steps=0",),
         ("config.num_train_steps=0 must be a positive integer",), workdir="fresh"),
    Case("learning_rate_the_schedule_ignores", "train", ("--config.learning_rate=1e-3",),
         ("--config.learning_rate is not used by config.schedule='paper'",
          "--config.learning_rate_scale"), workdir="fresh"),
    Case("model_vocab_size_the_tokenizer_sets", "train", ("--config.model.vocab_size=100",),
         ("--config.model.vocab_size is set from the run's tokenizer",
          "--config.data.vocab_size"), workdir="fresh"),
    Case("unknown_schedule", "train", ("--config.schedule=cosine",),
         ("config.schedule='cosine' is not one of",), workdir="fresh"),
    Case("unknown_flag", "train", ("--bogus=1",), ("Unknown command line flag 'bogus'",),
         workdir="fresh", subprocess=True),
    Case("missing_workdir", "train", ("--config=experiments/configs/tiny.py",),
         ("--workdir is required",), base_flags=False),
    Case("missing_config", "train", ("--workdir={tmp}/run",), ("--config is required",),
         base_flags=False),
    Case("config_file_does_not_exist", "train",
         ("--config=experiments/configs/no_such.py", "--workdir={tmp}/run"),
         ("cannot load the --config file", "no_such.py"), base_flags=False),
    Case("config_file_raises", "train", ("--config={tmp}/broken.py", "--workdir={tmp}/run"),
         ("ZeroDivisionError in --config",), prepare=_config_that_raises, base_flags=False,
         subprocess=True),
    Case("mesh_needs_other_device_count", "train", ("--config.mesh.data=3",),
         ("needs 3 devices but 8 are available",), workdir="fresh"),
    Case("batch_smaller_than_device_count", "train", ("--config.data.tokens_per_batch=8",),
         ("tokens_per_batch=8 holds fewer than batch_multiple=",), workdir="fresh"),
    # --- train: data.
    Case("unknown_dataset", "train", ("--config.data.dataset=multi31k",),
         ("unknown dataset 'multi31k'",), workdir="fresh"),
    Case("multi30k_data_dir_missing", "train",
         ("--config.data.dataset=multi30k", "--config.data.data_dir={tmp}/no_such_dir"),
         ("{tmp}/no_such_dir does not exist",), workdir="fresh"),
    Case("plain_text_without_files", "train", ("--config.data.dataset=plain_text",),
         ("needs --config.data.plain_text.train_target",), workdir="fresh"),
    Case("plain_text_line_counts_differ", "train", PLAIN_TEXT,
         ("train.src has 3 lines but", "train.tgt has 2"),
         prepare=_plain_text(b"a b\nc d\ne f\n", b"x y\nz w\n"), workdir="fresh"),
    Case("plain_text_not_utf8", "train", PLAIN_TEXT,
         ("train.src line 2 is not valid UTF-8", "replace_invalid_utf8"),
         prepare=_plain_text(b"a b\n\xff\xfe c\n", b"x y\nz w\n"), workdir="fresh"),
    # --- train: a workdir holding another run.
    Case("checkpoint_of_another_model", "train", ("--config.model.d_model=64",),
         ("holds a checkpoint of a different model",
          "config.model.d_model: checkpoint 32, config 64", "use a new --workdir",
          "to start fresh")),
    Case("resume_with_clipping_turned_on", "train", ("--config.grad_clip_norm=1.0",),
         ("was trained with config.grad_clip_norm=0", "turning clipping on changes the optimizer "
          "state", "resume with --config.grad_clip_norm=0")),
    Case("resume_as_another_task", "train", ("--config.task=causal_lm",),
         ("holds a checkpoint of task 'translation', not 'causal_lm'",
          "--config.task=translation")),
    # --- translate.
    Case("beam_size_zero", "translate", ("--workdir={workdir}", "--beam_size=0"),
         ("beam_size=0 must be at least 1",)),
    Case("negative_alpha", "translate", ("--workdir={workdir}", "--alpha=-0.5"),
         ("alpha=-0.5 must be >= 0",)),
    Case("translate_not_a_run", "translate", ("--workdir={tmp}",), ("is not a training run",),
         workdir="none"),
    Case("translate_without_checkpoints", "translate", ("--workdir={workdir}",),
         ("no checkpoint in", "train first"), prepare=_without_checkpoints),
    Case("translate_with_another_tokenizer", "translate", ("--workdir={workdir}",),
         ("tokenizer.model does not match the checkpoint",), prepare=_another_tokenizer,
         stdin=b"the cat .\n"),
    Case("translate_stdin_not_utf8", "translate", ("--workdir={workdir}",),
         ("stdin line 2 is not valid UTF-8", "--replace_invalid_utf8"),
         stdin=b"the cat .\n\xff\xfe dog\n"),
    Case("translate_stdin_not_utf8_replaced", "translate",
         ("--workdir={workdir}", "--replace_invalid_utf8", "--beam_size=1"), (),
         stdin=b"the cat .\n\xff\xfe dog\n", exit_code=0, subprocess=True),
    Case("checkpoint_nonsense", "translate", ("--workdir={workdir}", "--checkpoint=nonsense"),
         ("--checkpoint='nonsense' is not latest, averaged or a step number",)),
    # --- evaluate and average_checkpoints.
    Case("evaluate_line_counts_differ", "evaluate",
         ("--workdir={workdir}", "--source={tmp}/source.txt", "--reference={tmp}/reference.txt"),
         ("--source has 2 lines but --reference has 3",), prepare=_source_and_reference),
    Case("average_last_zero", "average_checkpoints", ("--workdir={workdir}", "--last=0"),
         ("--last=0 must be at least 1",)),
    *(Case(f"unknown_flag_{module}", module, ("--workdir={workdir}", "--bogus=1"),
           ("Unknown command line flag 'bogus'",))
      for module in ("translate", "evaluate", "average_checkpoints")),
]


def _flags(case: Case, tmp: pathlib.Path, workdir: pathlib.Path, prepared: pathlib.Path):
  fill = lambda s: s.format(tmp=tmp, workdir=workdir, prepared=prepared)
  flags = [fill(f) for f in case.flags]
  if case.module == "train" and case.base_flags:
    base = runner.base_flags(prepared)
    if not any(f.startswith("--workdir=") for f in flags):
      base.append(f"--workdir={workdir}")
    flags = base + flags
  return flags


def _run_files(workdir: pathlib.Path) -> dict[str, str]:
  """Hashes of the checkpoints, config, tokenizer and metrics (TensorBoard may add files)."""
  if not workdir.exists():
    return {}
  return {k: v for k, v in runner.file_hashes(workdir).items() if not k.startswith("tensorboard")}


def _set_up(case: Case, root: pathlib.Path, uninterrupted: pathlib.Path):
  tmp = root / case.name
  tmp.mkdir()
  workdir = tmp / "run"
  if case.workdir == "trained":
    runner.copy_run(uninterrupted, workdir)
  if case.prepare:
    case.prepare(tmp, workdir)
  return tmp, workdir, _run_files(workdir)


def _run_subprocess(case: Case, root: pathlib.Path, uninterrupted: pathlib.Path,
                    prepared: pathlib.Path):
  tmp, workdir, before = _set_up(case, root, uninterrupted)
  command = runner.module_command(case.module, *_flags(case, tmp, workdir, prepared))
  result = runner.run(command, timeout=runner.QUICK_TIMEOUT_S, stdin=case.stdin,
                      environment=runner.env(8))
  return result, before, _run_files(workdir), tmp


SUBPROCESS_CASES = [c for c in CASES if c.subprocess]


@pytest.fixture(scope="module")
def subprocess_results(shared_run, tmp_path_factory):
  prepared, uninterrupted = shared_run
  root = tmp_path_factory.mktemp("bad_inputs")
  with concurrent.futures.ThreadPoolExecutor(WORKERS) as pool:
    futures = {c.name: pool.submit(_run_subprocess, c, root, uninterrupted, prepared)
               for c in SUBPROCESS_CASES}
    return {name: future.result() for name, future in futures.items()}


def test_there_are_at_least_25_cases():
  assert len({c.name for c in CASES}) == len(CASES) >= 25
  assert 1 <= len(SUBPROCESS_CASES) <= 4


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_bad_input_is_one_error_line(case: Case, request, shared_run, tmp_path):
  if case.subprocess:
    result, before, after, tmp = request.getfixturevalue("subprocess_results")[case.name]
  else:
    prepared, uninterrupted = shared_run
    tmp, workdir, before = _set_up(case, tmp_path, uninterrupted)
    run_in_process = request.getfixturevalue("run_in_process")
    result = run_in_process(case.module, *_flags(case, tmp, workdir, prepared), stdin=case.stdin)
    after = _run_files(workdir)
  assert result.returncode == case.exit_code, result.describe()
  assert "Traceback" not in result.stderr, result.describe()
  errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
  if case.exit_code == 0:
    assert not errors, result.describe()
    assert len(result.stdout.splitlines()) == len(case.stdin.splitlines())
  else:
    assert len(errors) == 1, result.describe()
    for fragment in case.expect:
      fragment = fragment.format(tmp=tmp)
      assert fragment in errors[0], f"{fragment!r} is not in {errors[0]!r}"
  if case.workdir == "trained":
    assert after == before, "a file of the existing run changed"
  if case.workdir == "fresh":
    assert not runner.checkpoint_steps(tmp / "run"), "a bad config left checkpoints behind"
