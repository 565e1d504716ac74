"""Metrics on resume: rows after the restored step go (metrics.jsonl and TensorBoard), a torn line too."""

import json
import struct

from tensorboardX.proto import event_pb2

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


def _tensorboard_scalars(logdir) -> dict[int, float]:
  """step -> train/loss as TensorBoard shows it: event files in order, with its purge rule.

  TensorBoard reads a SessionLog START at step s as "a run restarted here" and
  drops the events it already read at steps >= s (its purge of orphaned data).
  """
  shown: dict[int, float] = {}
  for path in sorted(logdir.glob("events.out.tfevents.*")):
    data = path.read_bytes()
    offset = 0
    while offset < len(data):
      (length,) = struct.unpack("<Q", data[offset:offset + 8])
      event = event_pb2.Event.FromString(data[offset + 12:offset + 12 + length])
      offset += 12 + length + 4
      if event.HasField("session_log") and event.session_log.status == event.session_log.START:
        shown = {step: value for step, value in shown.items() if step < event.step}
      for value in event.summary.value:
        if value.tag == "train/loss":
          shown[event.step] = value.simple_value
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
  assert _tensorboard_scalars(tmp_path / "tensorboard") == {10: 1.0, 20: 2.0, 30: 2.0}
