"""experiments/ablations.py: a two-row sweep writes its table and curves, and resumes."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import threading
import time

import pytest

from transformer_jax.model.precision import cpu_model
from transformer_jax.training.preemption import PreemptionWatcher

REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def ablations(experiment_module):
  return experiment_module("experiments/ablations.py")


def test_parse_row_reads_literals_and_strings(ablations):
  row = ablations.parse_row("wide:model.d_ff=4096,label_smoothing=0.0,model.positions=learned")
  assert row.name == "wide"
  assert row.overrides == {"model.d_ff": 4096, "label_smoothing": 0.0,
                           "model.positions": "learned"}
  with pytest.raises(ValueError, match="NAME:"):
    ablations.parse_row("no_colon")


def test_table3_rows_scale_to_the_cpu_base(ablations):
  a1, big = ablations.table3_rows(["A1", "big"], "cpu", base_steps=2000)
  assert a1.overrides == {"model.num_heads": 1, "model.d_k": 128, "model.d_v": 128}
  assert big.overrides["model.d_model"] == 256 and big.overrides["num_train_steps"] == 6000
  (n2,) = ablations.table3_rows(["C_N2"], "cpu", base_steps=2000)
  assert n2.overrides == {"model.num_layers": 1}
  (paper_big,) = ablations.table3_rows(["big"], "paper", base_steps=100_000)
  assert paper_big.overrides["num_train_steps"] == 300_000


def test_seeds_expand_rows_and_the_table_says_where_ours_agrees_with_the_paper(ablations):
  rows = ablations.with_seeds(ablations.table3_rows(["base", "A1", "C_N2"], "cpu", 300), 3)
  assert [r.name for r in rows[:4]] == ["base_seed0", "base_seed1", "base_seed2", "A1_seed0"]
  assert rows[4].overrides["seed"] == rows[4].overrides["data.seed"] == 1
  assert rows[4].overrides["model.num_heads"] == 1
  assert ablations.seed_groups(rows)["C_N2"] == ["C_N2_seed0", "C_N2_seed1", "C_N2_seed2"]
  assert ablations.with_seeds(rows[:2], 1) == rows[:2]
  with pytest.raises(ValueError, match="at least 1"):
    ablations.with_seeds(rows, 0)

  def result(ppl, bleu):
    return dict(dev_perplexity=ppl, dev_bleu=bleu)

  # Paper: A1 (h=1) has higher PPL and lower BLEU than base; C_N2 too.
  results = {"base_seed0": result(10.0, 20.0), "base_seed1": result(10.2, 20.4),
             "base_seed2": result(9.8, 19.6),
             "A1_seed0": result(12.0, 19.9), "A1_seed1": result(12.2, 20.3),
             "A1_seed2": result(11.8, 19.8),
             "C_N2_seed0": result(9.0, 21.0), "C_N2_seed1": result(9.1, 21.2)}
  table = ablations.format_seed_table(rows, results)
  a1 = next(line for line in table.splitlines() if line.startswith("| A1 |"))
  assert "12.00 ± 0.20" in a1 and "| agrees (+2.00, 2σ 0.33)" in a1  # PPL up, as the paper's.
  assert "within noise (+0.00" in a1  # BLEU: 20.00 against 20.00.
  n2 = next(line for line in table.splitlines() if line.startswith("| C_N2 |"))
  assert "2 of 3" in n2 and "disagrees (-0.95" in n2  # PPL down, the paper's went up.
  assert ablations.direction((5.0, 1.0, 3), (4.0, 1.0, 3), 0.5).startswith("within noise")
  assert ablations.format_seed_table(rows[:1], results) == ""
  no_base = ablations.format_seed_table(rows[3:], results)  # A1 and C_N2 alone: no comparison.
  assert "12.00 ± 0.20" in no_base and "agrees" not in no_base
  # The paper's rows level: ours agrees inside the noise and disagrees beyond it.
  assert ablations.direction((5.0, 0.1, 3), (4.0, 0.1, 3), 0.0).startswith(
      "disagrees, the paper's level (+1.00")
  assert ablations.direction((4.1, 0.1, 3), (4.0, 0.1, 3), 0.0).startswith(
      "agrees, the paper's level (+0.10")


def test_two_row_sweep_writes_table_and_curves_and_resumes(ablations, tmp_path, monkeypatch, tiny_base):
  base = tiny_base()
  rows = ablations.table3_rows(["base", "D_ls0"], "paper", base.num_train_steps)
  sweep_dir, runs_dir = tmp_path / "results" / "smoke", tmp_path / "runs"
  messages = []
  started = time.time()
  results = ablations.run_sweep(base, rows, sweep_dir, runs_dir, bleu_sentences=4,
                                log=messages.append)
  first_seconds = time.time() - started

  table = (sweep_dir / "table.md").read_text()
  for name in ("base", "D_ls0"):
    assert results[name]["step"] == 6, results[name]
    assert results[name]["dev_perplexity"] > 1 and results[name]["dev_bleu"] is not None
    assert f"| {name} |" in table, table
  assert "| ε_ls |" in table and "dev PPL" in table and "2 of 2 rows finished" in table, table
  png = (sweep_dir / "curves.png").read_bytes()
  assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 5000, "curves.png is not a plot"

  # A second invocation finds both rows done and trains nothing.
  result_files = {n: runs_dir / n / ablations.RESULT_FILE for n in ("base", "D_ls0")}
  stamps = {n: p.stat().st_mtime_ns for n, p in result_files.items()}
  messages.clear()
  again = ablations.run_sweep(base, rows, sweep_dir, runs_dir, bleu_sentences=4,
                              log=messages.append)
  assert messages == ["[base] finished earlier: skipped", "[D_ls0] finished earlier: skipped"]
  assert {n: p.stat().st_mtime_ns for n, p in result_files.items()} == stamps
  assert again["base"]["dev_perplexity"] == results["base"]["dev_perplexity"]

  # Committed results alone (a fresh machine: no run folders) resume the sweep too, and
  # its curves are drawn from the kept metrics.
  kept = json.loads(ablations.kept_row_path(sweep_dir, "D_ls0").read_text())
  assert {r["split"] for r in kept["metrics"]} >= {"train", "eval"}, kept["metrics"]
  shutil.rmtree(runs_dir)
  plotted, provenances = {}, []
  monkeypatch.setattr(ablations, "plot_curves", lambda path, metrics, provenance: (
      plotted.update(metrics), provenances.append(provenance)))
  messages.clear()
  fresh = ablations.run_sweep(base, rows, sweep_dir, runs_dir, bleu_sentences=4,
                              log=messages.append)
  assert messages == ["[base] finished earlier: skipped", "[D_ls0] finished earlier: skipped"]
  assert fresh["D_ls0"]["dev_perplexity"] == results["D_ls0"]["dev_perplexity"]
  assert plotted["D_ls0"] == kept["metrics"] and plotted["base"], plotted.keys()
  # The curves say where and when their rows ran.
  assert provenances[-1] == f"trained on {cpu_model()}, {kept['date']}", provenances
  # Asked for other dev sentences without the trained run to score again: kept as scored.
  messages.clear()
  ablations.run_sweep(base, rows[:1], sweep_dir, runs_dir, bleu_sentences=8, log=messages.append)
  metric = results["base"]["bleu_metric"]
  assert messages == [f"[base] kept as scored: {metric} over 4 dev sentences (its run folder "
                      "is not here to score again)"], messages
  assert ablations.same_row_config({"model": {"d_ff": 64}}, {"model": {"d_ff": 64}})
  assert not ablations.same_row_config({"model": {"d_ff": 64}}, {"model": {"d_ff": 32}})
  assert ablations.same_row_config({"data": {"data_dir": "/a"}}, {"data": {"data_dir": "/b"}})
  # A key added since (at its default) still matches; set to something else, it does not.
  assert ablations.same_row_config({}, {"model": {"quantize": ""}})
  assert not ablations.same_row_config({}, {"model": {"quantize": "int8"}})

  # A cluster launcher lists only the rows still to train, one command each.
  extra = ablations.parse_row("narrow:model.d_ff=32")
  ablations.run_sweep(base, rows + [extra], sweep_dir, runs_dir, launcher="print",
                      config_spec="experiments/configs/tiny.py", log=messages.append)
  commands = (sweep_dir / "commands.sh").read_text().splitlines()
  assert len(commands) == 1 and "--config.model.d_ff=32" in commands[0], commands
  assert f"--workdir={runs_dir / 'narrow'}" in commands[0]
  assert "| narrow |" in (sweep_dir / "table.md").read_text()
  print(f"two-row sweep: {first_seconds:.0f} s")


def test_workers_of_one_sweep_split_its_rows(ablations, tmp_path, monkeypatch, tiny_base):
  """A row another worker holds is skipped, not trained twice, and the table written after
  this worker's row lists the row the other one finished meanwhile."""
  base = tiny_base()
  base.num_train_steps = 3
  rows = ablations.table3_rows(["base", "D_ls0"], "paper", base.num_train_steps)
  sweep_dir, runs_dir = tmp_path / "results" / "split", tmp_path / "runs"
  # What the other worker will have scored: base, trained in folders of its own.
  other_sweep = tmp_path / "other" / "split"
  other = ablations.run_sweep(base, rows[:1], other_sweep, tmp_path / "other_runs",
                              bleu_sentences=0, log=lambda _: None)["base"]

  def log(message):
    messages.append(message)
    if message.startswith("[D_ls0] training"):  # Meanwhile the other worker scores base.
      kept = ablations.kept_row_path(sweep_dir, "base")
      kept.parent.mkdir(parents=True, exist_ok=True)
      shutil.copy(ablations.kept_row_path(other_sweep, "base"), kept)

  tables = []  # The rows of each table written.
  write_report = ablations.write_report
  monkeypatch.setattr(ablations, "write_report",
                      lambda *args: (tables.append(sorted(args[3])), write_report(*args)))
  messages = []
  with ablations.row_claim(runs_dir, "base") as claim:  # The other worker, training base.
    assert claim.held
    results = ablations.run_sweep(base, rows, sweep_dir, runs_dir, bleu_sentences=0, log=log)
  assert messages[0] == "[base] another worker of this sweep has it: skipped", messages
  assert not (runs_dir / "base").exists(), "base was trained by both workers"
  assert results["D_ls0"]["step"] == 3
  assert results["base"]["dev_perplexity"] == other["dev_perplexity"]
  table = (sweep_dir / "table.md").read_text()
  assert "| base |" in table and "| D_ls0 |" in table and "2 of 2 rows finished" in table, table
  assert tables[0] == ["D_ls0", "base"], tables  # Already the table written after D_ls0.

  messages.clear()  # Released: both rows are done, nothing is trained again.
  ablations.run_sweep(base, rows, sweep_dir, runs_dir, bleu_sentences=0, log=log)
  assert messages == ["[base] finished earlier: skipped", "[D_ls0] finished earlier: skipped"]


def test_a_row_claim_ends_with_the_worker_that_held_it(ablations, tmp_path):
  path = tmp_path / "runs" / ".claims" / "base.lock"
  path.parent.mkdir(parents=True)
  holder = subprocess.Popen(
      [sys.executable, "-c", "import fcntl, sys, time; f = open(sys.argv[1], 'a'); "
       "fcntl.flock(f, fcntl.LOCK_EX); print('held', flush=True); time.sleep(120)", str(path)],
      stdout=subprocess.PIPE, text=True)
  try:
    assert holder.stdout.readline().strip() == "held"
    with ablations.row_claim(tmp_path / "runs", "base") as claim:
      assert not claim.held
  finally:
    holder.kill()
    holder.wait()
  with ablations.row_claim(tmp_path / "runs", "base") as claim:
    assert claim.held


def wait_for_pid(path: pathlib.Path, process: subprocess.Popen) -> int:
  """The pid a fake trainer wrote to `path`, once it has (while `process` lives)."""
  deadline = time.time() + 120
  while not path.exists() or not path.read_text():
    assert process.poll() is None and time.time() < deadline, "the trainer never started"
    time.sleep(0.1)
  return int(path.read_text())


def claimed(ablations, runs_dir: pathlib.Path, name: str) -> bool:
  with ablations.row_claim(runs_dir, name) as claim:
    return not claim.held


def test_a_trainer_child_keeps_its_row_claimed_when_its_sweep_is_killed(ablations, tmp_path):
  """SIGKILL of a subprocess-launcher sweep leaves its trainer running: the row stays its."""
  runs_dir, trainer_pid = tmp_path / "runs", tmp_path / "trainer.pid"
  trainer = (f"import os, pathlib, time\n"
             f"pathlib.Path({str(trainer_pid)!r}).write_text(str(os.getpid()))\n"
             f"time.sleep(120)\n")
  sweep = (f"import sys\nfrom pathlib import Path\nfrom transformer_jax import configs\n"
           f"ablations = configs.load_module({str(REPO_ROOT / 'experiments/ablations.py')!r}, "
           f"'ablations')\n"
           f"base = configs.load_module({str(REPO_ROOT / 'experiments/configs/tiny.py')!r}, "
           f"'tiny').get_config()\n"
           f"ablations.train_command = lambda *args: [sys.executable, '-c', {trainer!r}]\n"
           f"rows = ablations.table3_rows(['base'], 'paper', base.num_train_steps)\n"
           f"ablations.run_sweep(base, rows, Path({str(tmp_path / 'sweep')!r}), "
           f"Path({str(runs_dir)!r}), launcher='subprocess', bleu_sentences=0)\n")
  sweep_process = subprocess.Popen([sys.executable, "-c", sweep], cwd=REPO_ROOT)
  pid = None
  try:
    pid = wait_for_pid(trainer_pid, sweep_process)
    sweep_process.kill()
    sweep_process.wait()
    assert claimed(ablations, runs_dir, "base"), "the row was free while its trainer trained it"
  finally:
    sweep_process.kill()
    sweep_process.wait()
    if pid is not None:
      with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
  deadline = time.time() + 30  # The trainer, reparented, ends: the row is free again.
  while claimed(ablations, runs_dir, "base"):
    assert time.time() < deadline, "the row stayed claimed after its trainer died"
    time.sleep(0.1)


def test_a_row_stays_claimed_until_both_worker_and_trainer_let_go(ablations, tmp_path):
  """An interrupt that ends the worker's claim while its trainer still saves (a second
  Ctrl-C) leaves the row claimed until the trainer ends."""
  runs_dir = tmp_path / "runs"
  trainer = None
  try:
    with pytest.raises(KeyboardInterrupt):
      with ablations.row_claim(runs_dir, "base") as claim:
        trainer = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"],
                                   pass_fds=(claim.lock_fd,))
        raise KeyboardInterrupt
    assert claimed(ablations, runs_dir, "base"), "the row was free while its trainer lived"
  finally:
    if trainer is not None:
      trainer.kill()
      trainer.wait()
  assert not claimed(ablations, runs_dir, "base")


def test_without_file_locks_a_sweep_runs_alone(ablations, tmp_path, monkeypatch, capsys):
  def no_locks(fd, operation):
    raise OSError(errno.ENOLCK, "No locks available")

  monkeypatch.setattr(ablations.fcntl, "flock", no_locks)
  with ablations.row_claim(tmp_path / "runs", "base") as claim:
    assert claim.held
  assert "would train the same rows" in capsys.readouterr().err


def test_a_longer_sweep_resumes_a_row_from_its_checkpoint(ablations, tmp_path, tiny_base):
  base = tiny_base()
  base.num_train_steps = 3
  rows = [ablations.Row("base", {})]
  sweep_dir, runs_dir = tmp_path / "results" / "grow", tmp_path / "runs"
  ablations.run_sweep(base, rows, sweep_dir, runs_dir, bleu_sentences=0, log=lambda _: None)
  base.num_train_steps = 4  # Same row, more steps: train resumes at step 3.
  result = ablations.run_sweep(base, rows, sweep_dir, runs_dir, bleu_sentences=0,
                               log=lambda _: None)["base"]
  steps = [r["step"] for r in ablations.read_metrics(runs_dir / "base") if r["split"] == "train"]
  assert result["step"] == 4 and steps == sorted(set(steps)), steps


def test_sigterm_saves_the_row_in_training_and_ends_the_sweep(ablations, tmp_path, monkeypatch, tiny_base):
  """A SIGTERM while a row starts (before its loop runs) stops that row at its first step,
  saved; no later row starts, finished ones stay in the table; the same command then
  finishes the rest."""
  base = tiny_base()
  # Rows that differ by seed share one compiled step (the persistent compilation cache).
  seed1 = ablations.parse_row("seed1:seed=1,data.seed=1")
  seed2 = ablations.parse_row("seed2:seed=2,data.seed=2")
  rows = [ablations.Row("base", {}), seed1, seed2]
  sweep_dir, runs_dir = tmp_path / "results" / "stop", tmp_path / "runs"
  ablations.run_sweep(base, [seed1], sweep_dir, runs_dir, bleu_sentences=0, log=lambda _: None)
  train_row = ablations.train_row

  def sigterm_then_train(*args, **kwargs):
    os.kill(os.getpid(), signal.SIGTERM)
    train_row(*args, **kwargs)

  received = []  # Were the sweep's watcher missing, the SIGTERM would land here.
  previous = signal.signal(signal.SIGTERM, lambda *_: received.append("unhandled"))
  try:
    monkeypatch.setattr(ablations, "train_row", sigterm_then_train)
    messages = []
    results = ablations.run_sweep(base, rows, sweep_dir, runs_dir, bleu_sentences=0,
                                  log=messages.append)
    assert received == [] and list(results) == ["seed1"], (received, list(results))
    assert "[base] stopped before step 6; the sweep stops; rerun to resume" in messages, messages
    checkpoints = sorted(int(p.name) for p in (runs_dir / "base" / "checkpoints").iterdir()
                         if p.name.isdigit())
    assert checkpoints == [1], checkpoints
    assert not (runs_dir / "seed2").exists(), "a row started after the SIGTERM"
    assert "| seed1 |" in (sweep_dir / "table.md").read_text(), "a finished row left the table"

    monkeypatch.setattr(ablations, "train_row", train_row)
    results = ablations.run_sweep(base, rows, sweep_dir, runs_dir, bleu_sentences=0,
                                  log=lambda _: None)
    assert [results[r.name]["step"] for r in rows] == [6, 6, 6], results
    os.kill(os.getpid(), signal.SIGTERM)
    assert received == ["unhandled"], "the sweep must restore the SIGTERM handler it replaced"
  finally:
    signal.signal(signal.SIGTERM, previous)


def test_the_subprocess_launcher_passes_a_sigterm_to_its_trainer(ablations, tmp_path, tiny_base):
  """A SIGTERM the sweep got (not its child) reaches the training child, which saves and exits 0."""
  ready, saved = tmp_path / "child_ready", tmp_path / "child_saved"
  child = (f"import pathlib, signal, time\n"
           f"def save(*_):\n  pathlib.Path({str(saved)!r}).touch()\n  raise SystemExit(0)\n"
           f"signal.signal(signal.SIGTERM, save)\n"
           f"pathlib.Path({str(ready)!r}).touch()\n"
           f"time.sleep(120)\n")
  watcher = PreemptionWatcher()

  def sigterm_once_the_child_listens():
    while not ready.exists():
      time.sleep(0.05)
    os.kill(os.getpid(), signal.SIGTERM)  # To the sweep's process only.

  thread = threading.Thread(target=sigterm_once_the_child_listens, daemon=True)
  started = time.time()
  try:
    thread.start()
    ablations.train_row(tiny_base(), tmp_path, "subprocess", [sys.executable, "-c", child], watcher)
  finally:
    watcher.close()
  assert watcher.requested and saved.exists() and time.time() - started < 60
  # A SIGTERM before the trainer listens (still importing, compiling) ends it unsaved: a
  # stop all the same, not a failed row.
  watcher = PreemptionWatcher()
  try:
    watcher.requested = True
    ablations.train_row(tiny_base(), tmp_path, "subprocess",
                        [sys.executable, "-c", "import time; time.sleep(120)"], watcher)
  finally:
    watcher.close()
  with pytest.raises(subprocess.CalledProcessError):
    ablations.train_row(tiny_base(), tmp_path, "subprocess", [sys.executable, "-c", "exit(3)"])


def test_slurm_launcher_writes_a_job_array_whose_task_trains_its_own_row(tmp_path):
  """--launcher=slurm: one array task per row; SLURM_ARRAY_TASK_ID=i trains row i only."""
  results, runs = tmp_path / "results", tmp_path / "runs"
  command = [sys.executable, str(REPO_ROOT / "experiments" / "ablations.py"),
             "--config=experiments/configs/tiny.py", "--rows=base", "--row=narrow:model.d_ff=32",
             "--sweep=slurm_smoke", "--launcher=slurm", f"--results_dir={results}",
             f"--runs_dir={runs}", "--bleu_sentences=2", "--config.num_train_steps=4",
             "--config.eval_every_steps=4", "--config.log_every_steps=2", "--config.beam_size=2",
             "--config.data.bucket_boundaries=(48,)"]
  written = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=REPO_ROOT)
  assert written.returncode == 0, written.stderr[-2000:]
  script = results / "slurm_smoke" / "slurm.sh"
  text = script.read_text()
  assert "#SBATCH --array=0-1" in text and "#SBATCH --requeue" in text, text
  assert "# Rows, by array index: 0=base, 1=narrow" in text, text
  assert not runs.exists(), "writing the array must train nothing"

  environment = {**os.environ, "SLURM_ARRAY_TASK_ID": "1"}
  task = subprocess.run(["bash", str(script)], capture_output=True, text=True, timeout=600,
                        env=environment)
  assert task.returncode == 0, task.stderr[-3000:]
  assert (runs / "narrow" / "ablation_row.json").exists(), task.stderr[-2000:]
  assert not (runs / "base").exists(), "array task 1 must train row 1 (narrow) only"
  table = (results / "slurm_smoke" / "table.md").read_text()
  assert "| narrow |" in table and "1 of 2 rows finished" in table, table
