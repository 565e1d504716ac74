"""benchmarks/*.py: each question's script runs, ends in one JSON line and rebuilds the summary."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]

TINY = ["--config=experiments/configs/tiny.py", "--vocab_size=600", "--batch_size=4",
        "--src_len=8", "--json"]


def run_benchmark(tmp_path, script: str, *args: str) -> dict:
  """Runs benchmarks/<script> on one CPU device; returns its last line, parsed as JSON."""
  env = dict(os.environ)
  # One device (not the suite's 8 simulated ones): a benchmark of the plain step.
  env["XLA_FLAGS"] = " ".join(flag for flag in env.get("XLA_FLAGS", "").split()
                              if "device_count" not in flag)
  completed = subprocess.run(
      [sys.executable, f"benchmarks/{script}", *args,
       f"--results_dir={tmp_path / 'results'}", f"--summary={tmp_path / 'README.md'}"],
      cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=300,
  )
  assert completed.returncode == 0, f"{script} failed:\n{completed.stderr[-3000:]}"
  last = completed.stdout.strip().splitlines()[-1]
  try:
    return json.loads(last)
  except json.JSONDecodeError:
    pytest.fail(f"the last line printed is not JSON: {last[:300]!r}")


def test_train_step_benchmark_ends_in_json(tmp_path):
  result = run_benchmark(tmp_path, "train_step.py", *TINY, "--tgt_len=8", "--steps=2",
                         "--warmup=1", "--peak_matmul_size=128")
  for key in ("target_tokens_per_s", "step_time_s", "mfu", "compile_s", "peak_memory_bytes",
              "flops_per_step", "flops_source", "load_average", "device"):
    assert key in result, f"training result lacks {key!r}: {sorted(result)}"
  assert result["target_tokens_per_s"] > 0
  assert result["device"]["host_cpu"], "the CPU's model name is recorded with every row"
  saved = list((tmp_path / "results").glob("*.json"))
  assert len(saved) == 1, f"expected one results file, found {saved}"
  assert "### Training step" in (tmp_path / "README.md").read_text()


def test_decoding_benchmark_ends_in_json_and_profiles_each_method(tmp_path):
  result = run_benchmark(tmp_path, "decoding.py", *TINY, "--beam_size=2", "--decode_steps=10",
                         "--decode_repeats=1", f"--profile_dir={tmp_path / 'profile'}")
  for key in ("sentences_per_s", "tokens_per_s", "methods"):
    assert key in result, f"decoding result lacks {key!r}: {sorted(result)}"
  assert set(result["methods"]) == {"greedy", "beam"}, result["methods"].keys()
  assert result["sentences_per_s"] > 0
  assert set(result["profiles"]) == {"greedy", "beam"}, result.get("profiles")
  for method, profile in result["profiles"].items():
    assert "error" not in profile, profile
    assert abs(sum(profile["by_category"].values()) - 1) < 0.01, profile["by_category"]
    assert profile["top_ops"] and (tmp_path / "profile" / method / f"decode_{method}.hlo.txt").exists()


def test_decoding_benchmark_pairs_ctranslate2_on_the_same_weights(tmp_path):
  pytest.importorskip("ctranslate2", reason="pip install -e '.[test]' (ctranslate2)")
  result = run_benchmark(tmp_path, "decoding.py", *TINY, "--beam_size=2", "--decode_steps=10",
                         "--decode_repeats=1", "--compare=ctranslate2")
  engines = result["ctranslate2"]["compute_types"]
  assert set(engines) == {"float32", "int8"}, engines.keys()
  for compute_type, runs in engines.items():
    assert set(runs) == {"greedy", "beam"} and runs["beam"]["sentences_per_s"] > 0, runs
    assert result["methods"]["beam"][f"jax_over_ct2_{compute_type}"] > 0


def test_attention_and_input_pipeline_benchmarks_end_in_json(tmp_path):
  attention = run_benchmark(tmp_path, "attention.py", "--attention_lengths=16,32",
                            "--attention_tokens=64", "--json")
  assert [row["length"] for row in attention["rows"] if row["impl"] == "plain"] == [16, 32]
  assert all(row["forward_s"] > 0 for row in attention["rows"]), attention["rows"]
  pipeline = run_benchmark(tmp_path, "input_pipeline.py", "--config=experiments/configs/tiny.py",
                           f"--config.data.prepared_dir={tmp_path / 'prepared'}",
                           "--seconds=0.3", "--json")
  assert pipeline["batches_per_s"] > 0 and pipeline["tokens_per_s"] > 0, pipeline
  summary = (tmp_path / "README.md").read_text()
  assert "### Attention against sequence length" in summary
  assert "### Input pipeline" in summary


def test_data_scale_benchmark_times_every_stage(tmp_path, data_dir):
  """Two sizes, each stage in its own process, and a linear extrapolation."""
  row = run_benchmark(tmp_path, "data_scale.py", "--pairs=3000", "--data_vocab_size=300",
                      "--data_tokens_per_batch=2048", f"--work_dir={tmp_path / 'work'}",
                      f"--data_dir={data_dir}",
                      "--extrapolate_to=30000", "--json")
  assert list(row["stages"]) == ["prepare", "tokenizer", "tokenize", "plan", "load"]
  assert row["small"]["pairs"] == 300 and row["full"]["pairs"] == 3000
  for stage in row["stages"].values():
    assert stage["seconds"] >= 0 and stage["peak_rss_bytes"] > 2**20
  assert row["tokens"] > 2 * 3000 and row["batches_per_epoch"] > 1
  small, full = row["small"]["tokenize"], row["full"]["tokenize"]  # The line through both.
  want = full["seconds"] + (full["seconds"] - small["seconds"]) / 2700 * 27000
  assert row["stages"]["tokenize"]["extrapolated_seconds"] == pytest.approx(want)
  assert not (tmp_path / "work").exists(), "the scratch corpus is deleted"
  assert "### Data path at scale" in (tmp_path / "README.md").read_text()


def test_saved_commands_name_no_path_of_this_machine(tmp_path, monkeypatch):
  """Paths under the data folder, under the repository (even when the data folder holds
  the repository) and elsewhere are each written so another machine can read them."""
  import importlib.util

  spec = importlib.util.spec_from_file_location(
      "portable_paths", REPO_ROOT / "benchmarks" / "portable_paths.py")
  paths = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(paths)
  data = tmp_path / "data"
  monkeypatch.setenv("TRANSFORMER_JAX_DATA_DIR", str(data))
  command = paths.portable_command([
      f"--source={data}/multi30k/test2016.en", f"--config={REPO_ROOT}/experiments/configs/tiny.py",
      f"--workdir={tmp_path}/runs/v1", "--note=/ idle host", "--config.data.variant=tok",
      "--label=a=/b", str(data / "x.txt"), "relative/path"])
  assert command.split(" ") == [
      "--source=$TRANSFORMER_JAX_DATA_DIR/multi30k/test2016.en",
      "--config=experiments/configs/tiny.py", "--workdir=.../v1", "--note=/", "idle", "host",
      "--config.data.variant=tok", "--label=a=/b", "$TRANSFORMER_JAX_DATA_DIR/x.txt",
      "relative/path"]
  monkeypatch.setenv("TRANSFORMER_JAX_DATA_DIR", str(REPO_ROOT.parent))  # Holds the repository.
  assert paths.portable_path(str(REPO_ROOT / "benchmarks")) == "benchmarks"
  assert paths.portable_path(str(REPO_ROOT.parent / "data")) == "$TRANSFORMER_JAX_DATA_DIR/data"


def test_translate_real_compares_a_trained_run_with_its_ctranslate2_export(tmp_path,
                                                                          tmp_path_factory):
  """A trained run's own sentences through both engines, with our int8 weight matmuls and
  the best_finished stop rule; each engine's BLEU beside its speed."""
  pytest.importorskip("ctranslate2", reason="pip install -e '.[test]' (ctranslate2)")
  import random

  from fault_tolerance import runner
  from transformer_jax.data.generated import sample_pair

  _, workdir = runner.shared_run(tmp_path_factory)
  pairs = [sample_pair(random.Random(20_000 + i)) for i in range(6)]
  source, reference = tmp_path / "source.txt", tmp_path / "reference.txt"
  source.write_text("".join(s + "\n" for s, _ in pairs))
  reference.write_text("".join(t + "\n" for _, t in pairs))
  result = run_benchmark(tmp_path, "translate_real.py", f"--workdir={workdir}",
                         "--checkpoint=latest", f"--source={source}",
                         f"--reference={reference}", "--beam_size=2", "--repeats=1",
                         "--beam_stop=best_finished", "--quantize=int8",
                         "--ct2_compute_types=float32", "--pair_shrink",
                         "--pair_shared_cache", "--json")
  assert result["beam_stop"] == "best_finished" and result["quantize"] == "int8"
  assert set(result["engines"]) == {"jax", "jax_shrinking", "jax_reordered_cache",
                                    "ct2_float32"}, result["engines"]
  assert result["shrink_batch"] is False  # Unset: the whole batch to the end.
  engines = result["engines"]
  assert engines["jax"]["tok_bleu"] == engines["jax_shrinking"]["tok_bleu"]  # Same outputs.
  assert engines["jax"]["tok_bleu"] == engines["jax_reordered_cache"]["tok_bleu"]
  for engine in result["engines"].values():
    assert engine["sentences_per_s"] > 0 and engine["sacrebleu"] is not None  # Raw text.
  assert result["engines"]["jax"]["jax_over_ct2_float32"] > 0
  # The saved command names no path of this machine, only what another one can read.
  assert "/" + tmp_path.parts[1] not in result["command"], result["command"]
  assert "--source=.../source.txt" in result["command"], result["command"]
  assert result["tokens_per_batch"] == 1024  # Unset: the CPU's decoding batch.
  assert result["matmul_dtype"] == "float32"  # Unset: as the run was trained (float32).
  summary = (tmp_path / "README.md").read_text()
  assert result["shared_beam_cache"] is True  # Unset: on for an encoder-decoder on a CPU.
  for batch in ("shrinking batch", "whole batch"):
    assert (f"| jax (1,024 tokens a batch, float32 operands, int8 weight matmuls, {batch}, "
            "shared beam cache) |") in summary
  assert ("| jax (1,024 tokens a batch, float32 operands, int8 weight matmuls, whole batch, "
          "reordered beam cache) |") in summary


def test_revisions_times_a_benchmark_at_two_revisions_as_a_ratio(tmp_path):
  """One round at HEAD against HEAD: each side runs in its own checkout, and the ratio of
  their throughputs is printed and saved with the host."""
  env = dict(os.environ)
  env["XLA_FLAGS"] = " ".join(flag for flag in env.get("XLA_FLAGS", "").split()
                              if "device_count" not in flag)
  out = tmp_path / "revisions.jsonl"
  completed = subprocess.run(
      [sys.executable, "benchmarks/revisions.py", "--before=HEAD", "--rounds=1",
       f"--worktrees={tmp_path / 'checkouts'}", f"--out={out}", "--", "train_step.py",
       *TINY[:-1], "--tgt_len=8", "--steps=2", "--warmup=1", "--peak_matmul_size=128"],
      cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=300)
  assert completed.returncode == 0, completed.stderr[-3000:]
  row = json.loads(out.read_text())
  assert row["before"] == row["after"] and row["rounds"] == 1 and row["host_cpu"]
  ratio = row["ratios"]["tokens_per_s"]
  assert ratio["min"] <= ratio["median"] <= ratio["max"] and 0.2 < ratio["median"] < 5
  (checkout,) = (tmp_path / "checkouts").iterdir()  # HEAD's, checked out once.
  assert (checkout / "transformer_jax").is_dir()
  subprocess.run(["git", "worktree", "remove", "--force", str(checkout)], cwd=REPO_ROOT,
                 check=False, capture_output=True)
