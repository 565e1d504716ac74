"""The colabs run top to bottom on the CPU with tiny settings (TRANSFORMER_JAX_NOTEBOOK_TINY=1)."""

from __future__ import annotations

import ast
import os
import re
import pathlib

import pytest

nbclient = pytest.importorskip("nbclient", reason="pip install -e '.[test]' (nbclient)")
nbformat = pytest.importorskip("nbformat", reason="pip install -e '.[test]' (nbformat)")

COLABS = pathlib.Path(__file__).resolve().parents[1] / "colabs"


def execute(name: str, workdir: pathlib.Path, cwd: pathlib.Path, timeout: int = 240):
  """Runs colabs/<name> in a fresh kernel; returns the executed notebook."""
  notebook = nbformat.read(COLABS / name, as_version=4)
  saved = {k: os.environ.get(k) for k in ("TRANSFORMER_JAX_NOTEBOOK_TINY",
                                          "TRANSFORMER_JAX_NOTEBOOK_WORKDIR", "MPLBACKEND")}
  # The kernel inherits this environment (and conftest's XLA flags and compile cache).
  os.environ.update(TRANSFORMER_JAX_NOTEBOOK_TINY="1",
                    TRANSFORMER_JAX_NOTEBOOK_WORKDIR=str(workdir))
  os.environ.pop("MPLBACKEND", None)  # The kernel's inline backend draws the figures.
  try:
    client = nbclient.NotebookClient(notebook, timeout=timeout, kernel_name="python3",
                                     resources={"metadata": {"path": str(cwd)}})
    client.execute()
  except nbclient.exceptions.CellExecutionError as e:
    pytest.fail(f"colabs/{name} failed in a cell:\n{str(e)[-3000:]}")
  finally:
    for key, value in saved.items():
      if value is None:
        os.environ.pop(key, None)
      else:
        os.environ[key] = value
  return notebook


def outputs(notebook, kind: str) -> list[str]:
  """Every stream text (kind='text') or every image (kind='image/png') the notebook showed."""
  found = []
  for cell in notebook.cells:
    for output in cell.get("outputs", []):
      if kind == "text" and output.get("output_type") == "stream":
        found.append(output["text"])
      elif kind in output.get("data", {}):
        found.append(output["data"][kind])
  return found


def test_quickstart_then_attention_maps_run_with_tiny_settings(tmp_path):
  # One test, so attention_maps reads the run quickstart trained (no second training).
  workdir = tmp_path / "run"
  quickstart = execute("quickstart.ipynb", workdir, tmp_path)
  text = "".join(outputs(quickstart, "text"))
  assert "trained to step 10" in text and "BLEU on 8 test sentences" in text, text[-2000:]
  assert "opus-mt-en-de not downloaded" in text, "the published-model cell did not run"
  assert outputs(quickstart, "image/png"), "quickstart drew no loss curve"

  attention = execute("attention_maps.ipynb", workdir, tmp_path)
  text = "".join(outputs(attention, "text"))
  assert "step 10" in text and "translated:" in text, text[-2000:]
  assert len(outputs(attention, "image/png")) == 3, (
      "attention_maps should draw encoder, decoder and cross-attention heat-maps")


def test_decoder_only_trains_samples_and_draws_causal_attention(tmp_path):
  notebook = execute("decoder_only.ipynb", tmp_path / "run", tmp_path)
  text = "".join(outputs(notebook, "text"))
  assert "trained to step 10" in text and "dev perplexity" in text, text[-2000:]
  assert "greedy:" in text and "sampled (temperature 1.0, top-k 20):" in text, text[-2000:]
  assert "largest weight above the diagonal (a future token): 0.0" in text, text[-2000:]
  assert len(outputs(notebook, "image/png")) == 1


def test_tpu_training_cells_parse():
  notebook = nbformat.read(COLABS / "tpu_training.ipynb", as_version=4)
  for index, cell in enumerate(notebook.cells):
    if cell.cell_type == "code":
      try:
        ast.parse(cell.source)
      except SyntaxError as e:
        pytest.fail(f"tpu_training.ipynb code cell {index} does not parse: {e}")


def test_tpu_training_cpu_fallback_runs(tmp_path):
  notebook = execute("tpu_training.ipynb", tmp_path / "run", tmp_path)
  text = "".join(outputs(notebook, "text"))
  assert "CPU fallback: tiny model" in text and "trained to step 10" in text, text[-2000:]
  assert "GiB a device of" in text, text[-2000:]  # The fit check compiled the step.
  assert "dev perplexity" in text, text[-2000:]


def test_positions_draws_every_scheme_and_the_committed_length_curves(tmp_path):
  notebook = execute("positions.ipynb", tmp_path / "run", tmp_path)
  text = "".join(outputs(notebook, "text"))
  assert "RoPE scores depend only on the offset: True" in text, text[-2000:]
  assert "ALiBi slopes of 8 heads: 0.5, 0.25" in text, text[-2000:]
  finished = int(re.search(r"(\d+) of \d+ rows finished", text).group(1))
  images = outputs(notebook, "image/png")
  assert len(images) == 1 + (finished > 0), "the patterns, then the curves of finished rows"
