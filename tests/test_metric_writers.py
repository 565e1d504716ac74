"""metrics.jsonl on resume: rows after the restored step go, a torn last line too."""

import json

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
