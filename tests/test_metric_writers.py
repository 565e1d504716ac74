"""Metrics on resume: rows after the restored step go (metrics.jsonl and TensorBoard), a torn line too."""

import json
import struct
import subprocess
import sys

from tensorboardX.crc32c import crc32c as reference_crc32c
from tensorboardX.proto import event_pb2
from tensorboardX.record_writer import masked_crc32c as reference_masked_crc32c

from transformer_jax.training import tensorboard
from transformer_jax.training.metric_writers import MetricsWriter


def test_truncate_after_drops_later_rows_and_a_half_written_last_line(tmp_path):
  writer = MetricsWriter(str(tmp_path), total_steps=30, enabled=True)
  for step in (10, 20, 30):
    writer.write({"step": step, "loss": 1.0 / step})
  with open(writer.path, "a") as f:
    f.write('{"split": "train", "step": 4')  # Killed in the middle of a write.

  writer.truncate_after(20)
  rows = [json.loads(line) for line in open(writer.path)]
  assert [r["step"] for r in rows] == [10, 20]

  writer.write({"step": 30, "loss": 0.5})  # The resumed run logs step 30 again, once.
  assert [json.loads(line)["step"] for line in open(writer.path)] == [10, 20, 30]


def test_the_progress_line_names_what_the_task_counts(tmp_path, capsys):
  """A classifier's throughput is pairs, a masked LM's masked tokens: never plain 'tok/s'."""
  writer = MetricsWriter(str(tmp_path), total_steps=30, enabled=True, unit="pairs")
  writer.console(dict(step=10, loss=0.5, accuracy=0.75, learning_rate=1e-3, tokens_per_s=120.0,
                      elapsed_s=10.0))
  line = capsys.readouterr().err
  assert "| acc 0.750 |" in line and "120 pairs/s" in line and "tok/s" not in line, line
  assert "ppl" not in line  # No perplexity without an NLL.
  writer.close()


def _read_events(path) -> list:
  """The events of one file, each record's two CRCs checked by tensorboardX's masked CRC-32C
  (not the one under test), parsed by tensorboardX's protos."""
  data = path.read_bytes()
  events, offset = [], 0
  while offset < len(data):
    header = data[offset:offset + 8]
    (length,) = struct.unpack("<Q", header)
    (header_crc,) = struct.unpack("<I", data[offset + 8:offset + 12])
    record = data[offset + 12:offset + 12 + length]
    (record_crc,) = struct.unpack("<I", data[offset + 12 + length:offset + 16 + length])
    assert (header_crc == reference_masked_crc32c(header)
            and record_crc == reference_masked_crc32c(record)), f"bad CRC in {path}"
    events.append(event_pb2.Event.FromString(record))
    offset += 16 + length
  return events


def _tensorboard_scalars(logdir) -> list[tuple[int, float]]:
  """(step, train/loss) as TensorBoard shows them: event files in order, with its purge rule.

  TensorBoard's Python loader keeps every event it reads, repeated steps included; it
  takes a run's first SessionLog START for the run's beginning, and any later START at
  step s as "the run restarted here": it drops the events already read at steps >= s
  (its purge of orphaned data).
  """
  shown: list[tuple[int, float]] = []
  started = False
  for path in sorted(logdir.glob("events.out.tfevents.*")):
    events = _read_events(path)
    assert events[0].file_version == "brain.Event:2"
    for event in events:
      if event.HasField("session_log") and event.session_log.status == event.session_log.START:
        if started:
          shown = [(step, value) for step, value in shown if step < event.step]
        started = True
      for value in event.summary.value:
        if value.tag == "train/loss":
          shown.append((event.step, value.simple_value))
  return shown


def test_tensorboard_hides_the_steps_a_resumed_run_logs_again(tmp_path):
  writer = MetricsWriter(str(tmp_path), total_steps=30, enabled=True)
  for step in (10, 20, 30):
    writer.write({"step": step, "loss": 1.0})
  writer.close()  # Killed after step 30; its last checkpoint is step 10.

  resumed = MetricsWriter(str(tmp_path), total_steps=30, enabled=True)
  resumed.truncate_after(10)
  for step in (20, 30):
    resumed.write({"step": step, "loss": 2.0})
  resumed.close()
  assert _tensorboard_scalars(tmp_path / "tensorboard") == [(10, 1.0), (20, 2.0), (30, 2.0)]


def test_tensorboard_hides_a_run_resumed_from_its_start(tmp_path):
  """Killed before its first checkpoint: the rerun logs every step again."""
  writer = MetricsWriter(str(tmp_path), total_steps=20, enabled=True)
  for step in (10, 20):
    writer.write({"step": step, "loss": 1.0})
  writer.close()
  rerun = MetricsWriter(str(tmp_path), total_steps=20, enabled=True)
  rerun.truncate_after(0)
  rerun.write({"step": 10, "loss": 2.0})
  rerun.close()
  assert _tensorboard_scalars(tmp_path / "tensorboard") == [(10, 2.0)]


def test_a_value_beyond_float32_is_written_as_infinity(tmp_path):
  """A diverged run's dev perplexity (exp of a float64 NLL over ~88.7) must not stop training."""
  writer = MetricsWriter(str(tmp_path), total_steps=10, enabled=True)
  writer.write({"step": 10, "perplexity": 1e39, "loss": -1e39}, prefix="eval")
  writer.close()
  (path,) = (tmp_path / "tensorboard").glob("events.out.tfevents.*")
  *_, last = _read_events(path)
  assert {v.tag: v.simple_value for v in last.summary.value} == {
      "eval/perplexity": float("inf"), "eval/loss": float("-inf")}


def test_event_files_hold_every_scalar_of_a_row_at_its_step(tmp_path):
  writer = MetricsWriter(str(tmp_path), total_steps=300, enabled=True)
  writer.write({"step": 300, "loss": 2.5, "learning_rate": 1e-3}, prefix="eval")
  writer.close()
  (path,) = (tmp_path / "tensorboard").glob("events.out.tfevents.*")
  *_, last = _read_events(path)
  assert last.step == 300 and last.wall_time > 1.7e9
  assert {v.tag: v.simple_value for v in last.summary.value} == {
      "eval/loss": 2.5, "eval/learning_rate": struct.unpack("<f", struct.pack("<f", 1e-3))[0]}


def test_crc32c_matches_the_reference_on_the_standard_check_value():
  assert tensorboard.crc32c(b"123456789") == 0xE3069283 == reference_crc32c(b"123456789")
  data = bytes(range(256)) * 3
  assert tensorboard.crc32c(data) == reference_crc32c(data)


def test_starting_training_imports_neither_torch_nor_tensorflow():
  """A run's start-up pays for JAX, not for PyTorch (which tensorboardX imports where
  installed) or TensorFlow."""
  heavy = ("torch", "tensorflow", "tensorboardX", "transformers", "ctranslate2")
  code = ("import sys, transformer_jax.cli.train, transformer_jax.cli.translate; "
          f"print([m for m in {heavy!r} if m in sys.modules])")
  result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
  assert result.stdout.strip() == "[]", result.stdout
