"""translate keeps one output line per input line: empty, ordinary and over-long lines."""

from __future__ import annotations

from fault_tolerance import runner


def test_translate_outputs_one_line_per_input_line(uninterrupted):
  max_len = 64  # experiments/configs/tiny.py: config.model.max_len.
  over_long = " ".join(["the dog sees the cat"] * 40)  # Far more than 64 tokens.
  lines = ["the dog sees the cat .", "", over_long, "   ", "my brown horse sleeps ."]
  result = runner.run(
      runner.module_command("translate", f"--workdir={uninterrupted}", "--beam_size=2"),
      timeout=runner.QUICK_TIMEOUT_S, stdin=("\n".join(lines) + "\n").encode(),
  )
  assert result.returncode == 0, result.stderr[-2000:]
  outputs = result.stdout.split("\n")[:-1]
  assert len(outputs) == len(lines), outputs
  assert outputs[1] == "" and outputs[3] == "", "blank lines must stay blank"
  assert "line 3 has" in result.stderr and f"truncated to {max_len}" in result.stderr
  assert "Traceback" not in result.stderr


def test_translate_keeps_its_compiled_decoding_under_the_package_cache_dir(uninterrupted, tmp_path):
  """A second translate job of the same shapes loads its decoding loops instead of compiling."""
  environment = runner.env(TRANSFORMER_JAX_CACHE_DIR=tmp_path, JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=0)
  environment.pop("JAX_COMPILATION_CACHE_DIR", None)  # The test session's own cache otherwise.
  command = runner.module_command("translate", f"--workdir={uninterrupted}", "--beam_size=2")
  outputs, cache_entries = [], []
  for _ in range(2):
    result = runner.run(command, timeout=runner.QUICK_TIMEOUT_S, stdin=b"the dog sees the cat .\n",
                        environment=environment)
    assert result.returncode == 0, result.stderr[-2000:]
    outputs.append(result.stdout)
    cache_entries.append(sorted(path.name for path in (tmp_path / "xla").iterdir()))
  assert cache_entries[0], "translate wrote nothing to $TRANSFORMER_JAX_CACHE_DIR/xla"
  assert cache_entries[1] == cache_entries[0], "the second job compiled programs the first one had cached"
  assert outputs[0] == outputs[1]
