"""Runs Table 3's rows (or any named overrides) as one resumable sweep.

  python experiments/ablations.py --config=experiments/configs/table3.py:base,cpu \
      --rows=base,A1,B16,C_N2,D_ls0 --sweep=table3_cpu [--launcher=local]
  python experiments/ablations.py --config=experiments/configs/tiny.py \
      --rows=base,D_ls0 --row=narrow:model.d_ff=32 --sweep=smoke --config.num_train_steps=10

Each row trains in `<runs_dir>/<row>` (default runs/<sweep>/<row>) from the
base `--config` (and its `--config.*` overrides) plus the row's overrides:
`--rows` names rows of experiments/configs/table3.py's `ROWS` (scaled to
`--scale`, by default the config's `,cpu` suffix or else the paper's), and
each `--row=NAME:key=value,...` adds one ad-hoc row. After training, the row's
dev split (its first `--bleu_sentences`) is decoded with the config's beam
search and scored; the result goes to `<runs_dir>/<row>/ablation_row.json`.

Rerunning the same command resumes: finished rows are skipped, a half-trained
row resumes from its last checkpoint. Several copies of one command (one per
core, e.g. under `taskset -c 0` and `taskset -c 1`; or one per host where the
shared filesystem's locks span hosts, as NFSv4's do) split the rows between
them: a worker claims a row with a lock on <runs_dir>/.claims/<row>.lock while
it trains and scores it, and the others go on to the next row; the lock lasts
while the worker or its trainer (the subprocess launcher's child holds it too)
lives, so a worker that dies with its trainer leaves nothing claimed. Each scored row
is also kept in results/<sweep>/rows/<row>.json (its result and training
curve), so a sweep committed with its results resumes on another machine
without the run folders: rows kept there are not trained again. Launchers:
- local: rows train in this process, one after another;
- subprocess: each row is a `python -m transformer_jax.train` child;
  with either, a SIGTERM saves the row in training and ends the sweep, after
  the row being scored if one is; rerunning the command resumes it;
- print: writes one train command per row to results/<sweep>/commands.sh for a
  cluster; afterwards `--launcher=report` scores the finished rows;
- slurm: writes results/<sweep>/slurm.sh, an sbatch job array with one task per
  row (`sbatch results/<sweep>/slurm.sh`); each task reruns this command, which
  under SLURM_ARRAY_TASK_ID=i trains and scores row i only. SLURM's SIGTERM
  before a time limit or preemption saves a checkpoint; the array requeues
  and the rerun resumes. `--launcher=report` then tabulates every row.
Every launcher rewrites results/<sweep>/table.md (Table 3's columns) and
results/<sweep>/curves.png (train and dev NLL against step, one line per row).
"""

from __future__ import annotations

import ast
import contextlib
import copy
import dataclasses
import errno
import fcntl
import functools
import json
import math
import os
import shlex
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

import ml_collections
from tqdm import tqdm

from transformer_jax.errors import UserError
from transformer_jax.model.precision import cpu_model
from transformer_jax.training.preemption import PreemptionWatcher

REPO_ROOT = Path(__file__).resolve().parents[1]
RESULT_FILE = "ablation_row.json"
LAUNCHERS = ("local", "subprocess", "print", "report", "slurm")
SLURM_TASK_ENV = "SLURM_ARRAY_TASK_ID"


def load_table3():
  """experiments/configs/table3.py as a module (configs are not a package)."""
  from transformer_jax.configs import load_module

  return load_module(REPO_ROOT / "experiments" / "configs" / "table3.py", "config_table3")


@dataclasses.dataclass
class Row:
  """One variant of the sweep: a name and dotted-key overrides of the base config."""

  name: str
  overrides: dict[str, Any]


def parse_value(text: str) -> Any:
  """'512' -> 512, '0.1' -> 0.1, 'True' -> True, '(8, 16)' -> (8, 16), else the string."""
  try:
    return ast.literal_eval(text)
  except (ValueError, SyntaxError):
    return text


def parse_row(spec: str) -> Row:
  """'NAME:key=value,key=value' -> Row (values as Python literals or strings)."""
  name, sep, body = spec.partition(":")
  if not name or not sep:
    raise ValueError(f"--row={spec!r} must look like NAME:model.d_ff=1024,label_smoothing=0.0")
  overrides = {}
  for item in filter(None, body.split(",")):
    key, eq, value = item.partition("=")
    if not eq:
      raise ValueError(f"--row={spec!r}: {item!r} is not key=value")
    overrides[key.strip()] = parse_value(value.strip())
  return Row(name, overrides)


def table3_rows(names: list[str], scale: str, base_steps: int) -> list[Row]:
  """Table 3's rows by name, scaled to `scale` with steps relative to `base_steps`."""
  table3 = load_table3()
  return [Row(name, table3.row_overrides(name, scale, base_steps)) for name in names]


SEED_SUFFIX = "_seed"


def with_seeds(rows: list[Row], seeds: int) -> list[Row]:
  """Each row once per seed 0..seeds-1 (`NAME_seedS`: parameter init, dropout and data
  order all follow S; on the generated corpus `data.seed` also draws the corpus itself);
  `seeds` 1 keeps the rows as they are."""
  if seeds < 1:
    raise ValueError(f"--seeds={seeds} must be at least 1")
  if seeds == 1:
    return rows
  return [Row(f"{row.name}{SEED_SUFFIX}{seed}", {**row.overrides, "seed": seed, "data.seed": seed})
          for row in rows for seed in range(seeds)]


def seed_groups(rows: list[Row]) -> dict[str, list[str]]:
  """{row name: [its seeded row names]}, in the rows' order."""
  groups: dict[str, list[str]] = {}
  for row in rows:
    name, sep, seed = row.name.rpartition(SEED_SUFFIX)
    groups.setdefault(name if sep and seed.isdigit() else row.name, []).append(row.name)
  return groups


def direction(ours: tuple[float, float, int], base: tuple[float, float, int],
              paper_difference: float | None) -> str:
  """Whether a row's mean moved from the base row's the way the paper's did.

  `ours` and `base` are (mean, standard deviation, number of seeds). The difference of
  the means is compared with two standard errors of that difference: beyond them it
  "agrees" or "disagrees" with the sign of the paper's difference; inside, "within noise".
  Where the paper's rows are level, inside agrees and beyond disagrees.
  """
  if paper_difference is None:
    return "no paper figure"
  (mean, std, n), (base_mean, base_std, base_n) = ours, base
  difference = mean - base_mean
  noise = 2 * math.sqrt(std**2 / n + base_std**2 / base_n)
  if paper_difference == 0:
    verdict = "agrees" if abs(difference) <= noise else "disagrees"
    return f"{verdict}, the paper's level ({difference:+.2f}, 2σ {noise:.2f})"
  if abs(difference) <= noise:
    return f"within noise ({difference:+.2f}, 2σ {noise:.2f})"
  agrees = (difference > 0) == (paper_difference > 0)
  return f"{'agrees' if agrees else 'disagrees'} ({difference:+.2f}, 2σ {noise:.2f})"


def format_seed_table(rows: list[Row], results: dict, base_name: str = "base") -> str:
  """Per row, dev PPL and BLEU as mean ± std over its seeds, the paper's direction from the
  base row, and whether ours agrees beyond two standard errors; "" without seeded rows."""
  groups = seed_groups(rows)
  if all(len(names) == 1 for names in groups.values()):
    return ""
  paper = load_table3().PAPER

  def stats(name: str, key: str) -> tuple[float, float, int] | None:
    values = [results[n][key] for n in groups[name] if n in results and results[n][key] is not None]
    if len(values) < 2:
      return None
    return statistics.mean(values), statistics.stdev(values), len(values)

  lines = ["| row | seeds done | dev PPL | dev BLEU | paper PPL, BLEU | PPL against base | "
           "BLEU against base |", "|" + " --- |" * 7]
  for name, names in groups.items():
    done = sum(n in results for n in names)
    cells = [name, f"{done} of {len(names)}"]
    for key in ("dev_perplexity", "dev_bleu"):
      mine = stats(name, key)
      cells.append(f"{mine[0]:.2f} ± {mine[1]:.2f}" if mine else "")
    cells.append(", ".join(f"{v:g}" for v in paper[name][:2]) if name in paper else "")
    for key, column in (("dev_perplexity", 0), ("dev_bleu", 1)):
      mine = stats(name, key)
      base = stats(base_name, key) if base_name in groups else None
      if name == base_name or mine is None or base is None:
        cells.append("")
        continue
      paper_difference = (paper[name][column] - paper[base_name][column]
                          if name in paper and base_name in paper else None)
      cells.append(direction(mine, base, paper_difference))
    lines.append("| " + " | ".join(cells) + " |")
  return "\n".join(lines) + "\n"


def row_config(base: ml_collections.ConfigDict, row: Row) -> ml_collections.ConfigDict:
  """A validated copy of `base` with the row's overrides (and no test-split decode)."""
  from transformer_jax.configs import validate_config

  config = copy.deepcopy(base)
  with config.unlocked():
    load_table3().apply_overrides(config, row.overrides)
    config.final_eval_split = ""  # Table 3 is scored on the dev split.
  validate_config(config)
  return config


# --- Reading a row's state --------------------------------------------------------


def read_metrics(workdir: Path) -> list[dict]:
  path = workdir / "metrics.jsonl"
  if not path.exists():
    return []
  return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def training_finished(workdir: Path, steps: int) -> bool:
  """Whether train logged its final dev evaluation (it checkpoints that step first)."""
  return any(r["split"] == "eval" and r["step"] == steps for r in read_metrics(workdir))


def kept_row_path(sweep_dir: Path, name: str) -> Path:
  """results/<sweep>/rows/<row>.json: a scored row's result and its metrics, kept with the table."""
  return sweep_dir / "rows" / f"{name}.json"


# Where this machine keeps its data: not part of what a row is, so not compared.
MACHINE_KEYS = ("data.data_dir", "data.prepared_dir")


def _flat(tree: dict, prefix: str = "") -> dict[str, Any]:
  flat = {}
  for key, value in tree.items():
    if isinstance(value, dict):
      flat.update(_flat(value, f"{prefix}{key}."))
    else:
      flat[prefix + key] = value
  return flat


def same_row_config(stored: dict, wanted: dict) -> bool:
  """Whether a saved result's config is this row's: equal on every key, except this
  machine's data paths and keys added since it was saved that still hold their default."""
  from transformer_jax.configs import default_config

  stored, wanted = _flat(stored), _flat(wanted)
  defaults = _flat(json.loads(default_config().to_json_best_effort()))
  for key in set(stored) | set(wanted):
    if key in MACHINE_KEYS:
      continue
    if key not in stored:
      if key not in defaults or wanted[key] != defaults[key]:
        return False
    elif key not in wanted or stored[key] != wanted[key]:
      return False
  return True


def finished_result(workdir: Path, config: ml_collections.ConfigDict,
                    kept: Path | None = None) -> dict | None:
  """The row's result if it was scored for this config (in its run folder, else kept), or None."""
  wanted = json.loads(config.to_json_best_effort())
  for path in (workdir / RESULT_FILE, kept):
    if path is not None and path.exists():
      result = json.loads(path.read_text())
      if same_row_config(result.get("config", {}), wanted):
        return result
  return None


def scored_as(result: dict, bleu_metric: str, bleu_sentences: int) -> bool:
  """Whether a result's dev BLEU is `bleu_metric` over the first `bleu_sentences` sentences."""
  return result.get("bleu_metric") == bleu_metric and result.get("bleu_sentences") == bleu_sentences


@dataclasses.dataclass(frozen=True)
class RowClaim:
  """Whether this worker holds a row, and the descriptor of the lock it holds it by
  (None where the filesystem has no flock); the descriptor is open inside row_claim only."""
  held: bool  # False: another worker of the sweep has the row.
  lock_fd: int | None = None


@contextlib.contextmanager
def row_claim(runs_dir: Path, name: str) -> Iterator[RowClaim]:
  """Yields a RowClaim: a non-blocking exclusive flock on <runs_dir>/.claims/<name>.lock,
  held until the block ends and every trainer child that inherited `lock_fd` has ended
  (the lock is never released by hand, only by closing the last descriptor).
  Where the filesystem has no flock (some FUSE or cluster mounts), every row is held
  and copies of the sweep do not share its rows there (a warning says so).
  """
  path = runs_dir / ".claims" / f"{name}.lock"
  path.parent.mkdir(parents=True, exist_ok=True)
  with open(path, "a") as lock:  # Never deleted: another worker may hold it open.
    try:
      fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
      claim = RowClaim(held=True, lock_fd=lock.fileno())
    except BlockingIOError:
      claim = RowClaim(held=False)
    except OSError as e:
      if e.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS):
        raise
      print(f"warning: cannot lock {path} ({e.strerror}): copies of this sweep would train "
            "the same rows here; run one", file=sys.stderr)
      claim = RowClaim(held=True)
    yield claim


def refresh_results(rows: list[Row], configs: dict, sweep_dir: Path, runs_dir: Path,
                    results: dict) -> None:
  """Rereads every scored row into `results`: other workers of the sweep score rows too."""
  for row in rows:
    done = finished_result(runs_dir / row.name, configs[row.name],
                           kept_row_path(sweep_dir, row.name))
    if done is not None:
      results[row.name] = done


def write_whole(path: Path, text: str) -> None:
  """Written to a temporary file and renamed: other workers read and write it at any time."""
  partial = path.with_name(f"{path.name}.{os.getpid()}.tmp")
  partial.write_text(text)
  os.replace(partial, path)


def keep_row(sweep_dir: Path, name: str, result: dict, metrics: list[dict]) -> None:
  """Writes `kept_row_path`: the result with the row's metrics.jsonl records."""
  path = kept_row_path(sweep_dir, name)
  path.parent.mkdir(parents=True, exist_ok=True)
  write_whole(path, json.dumps(dict(result, metrics=metrics), indent=1, default=str))


# --- Training and scoring ---------------------------------------------------------


def train_command(config_spec: str, flag_args: list[str], row: Row, workdir: Path) -> list[str]:
  """`python -m transformer_jax.train` for one row: the base flags, then the row's."""
  row_flags = [f"--config.{k}={_flag_value(v)}" for k, v in row.overrides.items()]
  return [sys.executable, "-m", "transformer_jax.train", f"--config={config_spec}",
          *flag_args, *row_flags, "--config.final_eval_split=", f"--workdir={workdir}"]


def _flag_value(value: Any) -> str:
  return str(tuple(value)) if isinstance(value, (list, tuple)) else str(value)


def train_row(config: ml_collections.ConfigDict, workdir: Path, launcher: str,
              command: list[str], preemption: PreemptionWatcher | None = None,
              lock_fd: int | None = None) -> None:
  """Trains (or resumes) one row to config.num_train_steps, or until a SIGTERM (saved).

  A trainer child inherits `lock_fd` (the row's claim), so the row stays claimed while the
  child trains, even if this process is killed or interrupted while it does.
  """
  if launcher == "local":  # The trainer's own watcher nests in `preemption`.
    from transformer_jax.tasks.registry import make_task
    from transformer_jax.training.loop import train_and_evaluate

    config = copy.deepcopy(config)
    train_and_evaluate(config, os.fspath(workdir), make_task(config))
    return
  # The trainer starts no long-lived processes of its own that could inherit the lock.
  child = subprocess.Popen(command, cwd=REPO_ROOT,
                           pass_fds=() if lock_fd is None else (lock_fd,))
  forwarded = False
  try:
    while True:
      try:
        status = child.wait(timeout=1.0)
        break
      except subprocess.TimeoutExpired:
        if preemption is not None and preemption.requested and not forwarded:
          child.send_signal(signal.SIGTERM)  # It saves and exits 0, as under SLURM.
          forwarded = True
  except BaseException:  # Ctrl-C, or an error here: no trainer left writing the row.
    child.terminate()
    child.wait()
    raise
  # A SIGTERM that reaches the trainer before its loop listens (while it compiles or
  # restores) ends it before anything was written: a stop, as a saved one is.
  stopped_early = (status == -signal.SIGTERM and preemption is not None
                   and preemption.requested)
  if status != 0 and not stopped_early:
    raise subprocess.CalledProcessError(status, command)


def score_row(config: ml_collections.ConfigDict, workdir: Path, bleu_sentences: int,
              bleu_metric: str) -> dict:
  """Dev PPL (from train's last evaluation), dev BLEU, the parameter count, and the task's
  final report on its `sweep_split` where it has one."""
  from transformer_jax.data.pipeline import load_dataset
  from transformer_jax.decode.translator import DecodeOptions
  from transformer_jax.model.info import parameter_counts
  from transformer_jax.tasks.registry import load_run, make_task
  from transformer_jax.tasks.translation import evaluate_texts, reference_sets

  metrics = read_metrics(workdir)
  dev = [r for r in metrics if r["split"] == "eval" and r["step"] == config.num_train_steps][-1]
  run = load_run(os.fspath(workdir), "latest")
  result = dict(step=run.step, dev_perplexity=dev["perplexity"], dev_nll=dev["nll"],
                params=parameter_counts(run.params)["total"], bleu_metric=bleu_metric,
                dev_bleu=None, scores=None)
  task = make_task(config)
  if task.sweep_split:
    result["final"] = task.final_report(os.fspath(workdir), task.sweep_split)
  if bleu_sentences != 0:
    data = load_dataset(config.data)
    sources, references = data.texts(data.eval_split)
    if bleu_sentences > 0:
      sources, references = sources[:bleu_sentences], references[:bleu_sentences]
    options = DecodeOptions.from_config(config)
    sets = reference_sets(data, data.eval_split)
    if bleu_sentences > 0 and sets["tok_references"] is not None:
      sets["tok_references"] = sets["tok_references"][:bleu_sentences]
    scores, _ = evaluate_texts(run, sources, references, options, **sets)
    result.update(dev_bleu=scores[bleu_metric], scores=scores, bleu_split=data.eval_split)
  return result


def run_sweep(base: ml_collections.ConfigDict, rows: list[Row], sweep_dir: Path, runs_dir: Path,
              launcher: str = "local", bleu_sentences: int = 256, bleu_metric: str = "auto",
              config_spec: str = "", flag_args: list[str] | None = None,
              log: Callable[[str], Any] = print, slurm_task: int | None = None,
              rerun_command: list[str] | None = None) -> dict[str, dict]:
  """Trains, scores and tabulates every row not already done; returns {row: result}.

  With launcher "slurm": `slurm_task` None writes the job array that reruns
  `rerun_command`; an index trains only that row (as "local" would).
  """
  if launcher not in LAUNCHERS:
    raise ValueError(f"--launcher={launcher!r} is not one of {', '.join(LAUNCHERS)}")
  if len({r.name for r in rows}) != len(rows):
    raise ValueError(f"row names repeat: {[r.name for r in rows]}")
  if bleu_metric == "auto":
    bleu_metric = "tok_bleu" if base.data.dataset == "multi30k" else "paper_bleu"
  from transformer_jax.data.pipeline import references_kind
  from transformer_jax.metrics.bleu import REFERENCES_TOKENIZED

  if references_kind(base.data) == REFERENCES_TOKENIZED and bleu_metric in ("sacrebleu", "paper_bleu"):
    raise UserError(f"--bleu={bleu_metric}: Multi30k tok/ is tokenized and lowercased, so "
                    "cased detokenized BLEU does not apply; use --bleu=tok_bleu or chrf")
  sweep_dir.mkdir(parents=True, exist_ok=True)
  configs = {row.name: row_config(base, row) for row in rows}
  if launcher == "slurm" and slurm_task is None:
    path = write_slurm_array(sweep_dir, rows, rerun_command or [])
    log(f"{len(rows)} rows: sbatch {path} trains them as a job array; then rerun with "
        "--launcher=report")
    return {}
  if launcher == "slurm":
    if not 0 <= slurm_task < len(rows):
      raise ValueError(f"{SLURM_TASK_ENV}={slurm_task} names no row (there are {len(rows)})")
    mine = rows[slurm_task]
    launcher = "local"
  else:
    mine = None
  results, commands = {}, []
  # A SIGTERM (SLURM's, or a user's kill) lets the row in training save and stop, a row
  # being scored finish, then ends the sweep.
  preemption = PreemptionWatcher() if launcher in ("local", "subprocess") else None
  try:
    _sweep_rows(rows, configs, sweep_dir, runs_dir, launcher, bleu_sentences, bleu_metric,
                config_spec, flag_args or [], log, mine, preemption, results, commands)
  finally:
    if preemption is not None:
      preemption.close()
  if launcher == "print":
    path = sweep_dir / "commands.sh"
    path.write_text("".join(c + "\n" for c in commands))
    log(f"{len(commands)} rows to train: one command a line in {path}; then rerun "
        "with --launcher=report")
  refresh_results(rows, configs, sweep_dir, runs_dir, results)
  write_report(sweep_dir, rows, configs, results, runs_dir, bleu_metric)
  return results


def _sweep_rows(rows: list[Row], configs: dict, sweep_dir: Path, runs_dir: Path, launcher: str,
                bleu_sentences: int, bleu_metric: str, config_spec: str, flag_args: list[str],
                log: Callable[[str], Any], mine: Row | None,
                preemption: PreemptionWatcher | None, results: dict, commands: list) -> None:
  """run_sweep's loop over rows: fills `results` (and `commands` for launcher "print")."""
  stopped = False  # By a SIGTERM: later rows are reported if done, not trained or scored.
  # One bar for the sweep on a terminal (rate, ETA), nothing in a log file.
  for row in tqdm(rows, desc=f"sweep {sweep_dir.name}", unit=" rows", disable=None,
                  file=sys.stderr):
    if stopped or (mine is not None and row is not mine):  # Not this run's: run_sweep
      continue  # reports it if done.
    sweep_row = functools.partial(_sweep_row, row, rows, configs, sweep_dir, runs_dir, launcher,
                                  bleu_sentences, bleu_metric, config_spec, flag_args, log,
                                  preemption, results, commands)
    if mine is not None:  # A SLURM array task: the array gives each row to one task.
      stopped = sweep_row()
      continue
    with row_claim(runs_dir, row.name) as claim:
      if claim.held:
        stopped = sweep_row(claim.lock_fd)
      else:
        log(f"[{row.name}] another worker of this sweep has it: skipped")


def _sweep_row(row: Row, rows: list[Row], configs: dict, sweep_dir: Path, runs_dir: Path,
               launcher: str, bleu_sentences: int, bleu_metric: str, config_spec: str,
               flag_args: list[str], log: Callable[[str], Any],
               preemption: PreemptionWatcher | None, results: dict, commands: list,
               lock_fd: int | None = None) -> bool:
  """Skips, trains or scores one row of the sweep; returns whether the sweep stops."""
  config, workdir = configs[row.name], runs_dir / row.name
  kept = kept_row_path(sweep_dir, row.name)
  done = finished_result(workdir, config, kept)
  trained = training_finished(workdir, config.num_train_steps)
  if done is not None and (scored_as(done, bleu_metric, bleu_sentences) or not trained):
    if scored_as(done, bleu_metric, bleu_sentences):
      log(f"[{row.name}] finished earlier: skipped")
    else:  # Scored otherwise, and no trained run here to score again.
      log(f"[{row.name}] kept as scored: {done.get('bleu_metric')} over "
          f"{done.get('bleu_sentences', 'unrecorded')} dev sentences (its run folder is "
          "not here to score again)")
    if not kept.exists():  # Scored before rows were kept: keep it now.
      keep_row(sweep_dir, row.name, done, read_metrics(workdir))
    results[row.name] = done
    return False
  if preemption is not None and preemption.requested:
    log(f"SIGTERM: the sweep stops before [{row.name}]; rerun to resume")
    if done is not None:  # Scored otherwise earlier: still a row of the table.
      results[row.name] = done
    return True
  command = train_command(config_spec, flag_args, row, workdir)
  if launcher == "print":
    if not trained:
      commands.append(shlex.join(command))
    return False
  if not trained:
    if launcher == "report":
      log(f"[{row.name}] not trained yet: left out")
      return False
    log(f"[{row.name}] training {row.overrides or '(base)'} in {workdir}")
    train_row(config, workdir, launcher, command, preemption, lock_fd)
    if not training_finished(workdir, config.num_train_steps):  # Preempted: saved, stopped.
      log(f"[{row.name}] stopped before step {config.num_train_steps}; the sweep stops; "
          "rerun to resume")
      return True
  log(f"[{row.name}] scoring the dev split")
  result = score_row(config, workdir, bleu_sentences, bleu_metric)
  result.update(row=row.name, overrides=row.overrides, bleu_sentences=bleu_sentences,
                config=json.loads(config.to_json_best_effort()), host=cpu_model(),
                date=time.strftime("%Y-%m-%d", time.gmtime()))
  write_whole(workdir / RESULT_FILE, json.dumps(result, indent=2, default=str))
  keep_row(sweep_dir, row.name, result, read_metrics(workdir))
  results[row.name] = result
  refresh_results(rows, configs, sweep_dir, runs_dir, results)  # Other workers' too.
  write_report(sweep_dir, rows, configs, results, runs_dir, bleu_metric)  # After every row.
  return False


def write_slurm_array(sweep_dir: Path, rows: list[Row], command: list[str]) -> Path:
  """results/<sweep>/slurm.sh: one array task per row, each rerunning `command`.

  Resources are left to sbatch's command line or the cluster's defaults
  (`sbatch --gres=gpu:1 --time=4:00:00 slurm.sh`). A task SLURM stops early
  gets SIGTERM 120 s before (the trainer saves) and is requeued to resume.
  """
  path = sweep_dir / "slurm.sh"
  lines = ["#!/bin/bash",
           f"#SBATCH --job-name={sweep_dir.name}",
           f"#SBATCH --array=0-{len(rows) - 1}",
           f"#SBATCH --output={sweep_dir}/slurm-%A_%a.log",
           "#SBATCH --signal=B:TERM@120",
           "#SBATCH --requeue",
           "# Rows, by array index: " + ", ".join(f"{i}={r.name}" for i, r in enumerate(rows)),
           "set -euo pipefail",
           f"cd {shlex.quote(os.getcwd())}",  # Where the command's relative paths start.
           # exec: the trainer itself receives SLURM's SIGTERM.
           "exec " + shlex.join(command)]
  path.write_text("\n".join(lines) + "\n")
  path.chmod(0o755)
  return path


# --- The table and the curves -----------------------------------------------------

COLUMNS = ("N", "d_model", "d_ff", "h", "d_k", "d_v", "P_drop", "ε_ls", "train steps")


def _row_values(config) -> list[str]:
  from transformer_jax.model.config import ModelConfig

  m = ModelConfig.from_config(config.model)
  layers = (str(m.num_encoder_layers) if m.num_encoder_layers == m.num_decoder_layers
            else f"{m.num_encoder_layers}+{m.num_decoder_layers}")
  positions = "" if m.positions == "sinusoidal" else f"{m.positions} positions"
  return [layers, str(m.d_model), str(m.d_ff), str(m.num_heads), str(m.d_k), str(m.d_v),
          f"{m.dropout_rate:g}", f"{config.label_smoothing:g}", _steps(config.num_train_steps),
          positions]


def _steps(steps: int) -> str:
  return f"{steps // 1000}K" if steps >= 1000 and steps % 1000 == 0 else str(steps)


def format_table(rows: list[Row], configs: dict, results: dict, bleu_metric: str) -> str:
  """Markdown in Table 3's layout: the first row in full, the others only where they differ."""
  paper = load_table3().PAPER
  header = ["row", *COLUMNS, "dev PPL", f"dev BLEU ({bleu_metric})", "params ×10⁶",
            "paper PPL", "paper BLEU", "notes"]
  lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
  first = _row_values(configs[rows[0].name]) if rows else []
  for index, row in enumerate(rows):
    values = _row_values(configs[row.name])
    shown = values if index == 0 else [v if v != f else "" for v, f in zip(values, first)]
    result = results.get(row.name)
    ppl = f"{result['dev_perplexity']:.2f}" if result else "not run"
    bleu = (f"{result['dev_bleu']:.1f}" if result and result["dev_bleu"] is not None
            else ("—" if result else ""))
    params = f"{result['params'] / 1e6:.3g}" if result else ""
    paper_name = next(iter(seed_groups([row])))  # NAME_seedS has NAME's paper figures.
    p_ppl, p_bleu = (f"{paper[paper_name][0]:.2f}", f"{paper[paper_name][1]:.1f}") \
        if paper_name in paper else ("", "")
    lines.append("| " + " | ".join([row.name, *shown[:-1], ppl, bleu, params, p_ppl, p_bleu,
                                      shown[-1]]) + " |")
  return "\n".join(lines) + "\n"


def write_report(sweep_dir: Path, rows: list[Row], configs: dict, results: dict,
                 runs_dir: Path, bleu_metric: str) -> None:
  """results/<sweep>/table.md and curves.png."""
  done = [r for r in rows if r.name in results]
  sentences = {r.get("scores", {}).get("sentences") for r in results.values() if r.get("scores")}
  note = (f"Dev BLEU over the first {', '.join(str(s) for s in sorted(sentences))} dev "
          "sentences; " if sentences else "")
  text = (f"# {sweep_dir.name}\n\n{format_table(rows, configs, results, bleu_metric)}\n"
          f"{note}dev PPL is per token of the model's vocabulary, from training's last "
          f"evaluation; {len(done)} of {len(rows)} rows finished. Paper columns: Table 3 "
          "(WMT14 newstest2013, 100K steps).\n")
  seeded = format_seed_table(rows, results)
  if seeded:
    text += ("\n## Over seeds\n\nMean ± sample standard deviation over each row's seeds "
             f"(dev BLEU: {bleu_metric}). Against base: our mean minus base's, against two "
             "standard errors of that difference (2σ); beyond them the sign agrees or disagrees "
             "with the paper's (its row minus its base); inside, within noise. Where the "
             "paper's row equals its base, inside agrees and beyond disagrees.\n\n" + seeded)
  write_whole(sweep_dir / "table.md", text)  # Workers and SLURM tasks write it at once.
  plot_curves(sweep_dir / "curves.png",
              {r.name: read_metrics(runs_dir / r.name) or results.get(r.name, {}).get("metrics", [])
               for r in rows},
              "trained on " + trained_on(results.get(r.name, {}) for r in rows))


def trained_on(results: Iterable[dict]) -> str:
  """Where and when scored rows ran: "Intel(R) Xeon(R) ..., 2026-12-07" (a row scored before
  rows recorded their host says so)."""
  places = sorted({f"{r.get('host', 'host not recorded')}, {r.get('date', 'date not recorded')}"
                   for r in results if r})
  return "; ".join(places) or "no row scored yet"


def plot_curves(path: Path, metrics: dict[str, list[dict]], provenance: str) -> None:
  """Train (left) and dev (right) NLL = log PPL against step, one line per row; under the
  plot, `provenance` (where and when the rows ran) and the day it was drawn.

  NLL, not the label-smoothed loss, so rows with different ε_ls compare.
  """
  import matplotlib

  matplotlib.use("Agg")
  from matplotlib import pyplot as plt

  fig, (train_ax, dev_ax) = plt.subplots(1, 2, figsize=(11, 4))
  for name, rows in metrics.items():
    for ax, split in ((train_ax, "train"), (dev_ax, "eval")):
      points = sorted((r["step"], math.log(r["perplexity"])) for r in rows if r["split"] == split)
      if points:
        ax.plot(*zip(*points), marker="o" if len(points) < 20 else None, label=name)
  for ax, title in ((train_ax, "train NLL (log PPL)"), (dev_ax, "dev NLL (log PPL)")):
    ax.set_xlabel("step")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
      ax.legend(fontsize="small")
  fig.text(0.01, 0.01, f"{provenance}; drawn {time.strftime('%Y-%m-%d', time.gmtime())}",
           fontsize=7, color="grey")
  fig.tight_layout(rect=(0, 0.04, 1, 1))
  partial = path.with_name(f"{path.stem}.{os.getpid()}.tmp{path.suffix}")
  fig.savefig(partial, dpi=100)
  plt.close(fig)
  os.replace(partial, path)


# --- Command line -----------------------------------------------------------------


def define_flags() -> None:
  from absl import flags

  from transformer_jax.cli import common

  common.define_run_flags()

  flags.DEFINE_string("sweep", None, "Sweep name: results/<sweep>/ and runs/<sweep>/.")
  flags.DEFINE_list("rows", [], "Table 3 rows (experiments/configs/table3.py ROWS), e.g. base,A1.")
  flags.DEFINE_integer("seeds", 1, "Train each row with seeds 0..N-1 (rows NAME_seedS); the "
                       "table adds mean ± std and the paper's direction per row.")
  flags.DEFINE_multi_string("row", [], "An ad-hoc row: NAME:key=value,key=value.")
  flags.DEFINE_enum("scale", None, ["paper", "cpu"],
                    "Scale of Table 3 rows; default: the config's ',cpu' suffix, else paper.")
  flags.DEFINE_enum("launcher", "local", list(LAUNCHERS), "Where rows train.")
  flags.DEFINE_integer("bleu_sentences", 256, "Dev sentences decoded per row; -1: all; 0: none.")
  flags.DEFINE_string("bleu", "auto", "Score in the table: paper_bleu, tok_bleu, sacrebleu, "
                      "chrf; auto: tok_bleu on multi30k, else paper_bleu.")
  flags.DEFINE_string("results_dir", "results", "Folder of results/<sweep>/.")
  flags.DEFINE_string("runs_dir", None, "Row workdirs; default runs/<sweep>.")


def main(argv: list[str]) -> None:
  from absl import flags
  from ml_collections import config_flags

  from transformer_jax import sharding
  from transformer_jax.cli import common

  if len(argv) > 1:
    raise UserError(f"unexpected arguments {argv[1:]}; use --rows=A1,B16 or --row=NAME:key=value")
  FLAGS = flags.FLAGS
  if FLAGS.config is None or not FLAGS.sweep:
    raise UserError("--config and --sweep are required, e.g. --config="
                    "experiments/configs/table3.py:base,cpu --sweep=table3_cpu --rows=base,A1")
  common.quiet_libraries()
  common.enable_compilation_cache()
  spec = config_flags.get_config_filename(FLAGS["config"])
  scale = FLAGS.scale or ("cpu" if spec.endswith(",cpu") else "paper")
  base = FLAGS.config
  sharding.use_cpu_devices(base.cpu_devices)  # Before JAX starts: the local launcher's rows.
  try:
    rows = with_seeds(table3_rows(FLAGS.rows, scale, base.num_train_steps)
                      + [parse_row(r) for r in FLAGS.row], FLAGS.seeds)
  except (ValueError, KeyError, TypeError) as e:
    raise UserError(str(e).strip("'\"")) from None
  if not rows:
    raise UserError("no rows: pass --rows=base,A1,... and/or --row=NAME:key=value")
  flag_args = [a for a in sys.argv[1:] if a.startswith("--config.")]
  runs_dir = Path(FLAGS.runs_dir or Path("runs") / FLAGS.sweep).resolve()
  sweep_dir = Path(FLAGS.results_dir).resolve() / FLAGS.sweep
  try:
    slurm_task = os.environ.get(SLURM_TASK_ENV)
    run_sweep(base, rows, sweep_dir, runs_dir, FLAGS.launcher, FLAGS.bleu_sentences,
              FLAGS.bleu, spec, flag_args,
              slurm_task=int(slurm_task) if slurm_task is not None else None,
              rerun_command=[sys.executable, os.path.abspath(__file__), *sys.argv[1:]])
  except (ValueError, KeyError, TypeError) as e:
    raise UserError(str(e).strip("'\"")) from None
  print(f"table: {sweep_dir / 'table.md'}\ncurves: {sweep_dir / 'curves.png'}")


if __name__ == "__main__":
  from absl import app

  from transformer_jax.cli import common
  from transformer_jax.errors import exit_on_user_error

  common.keep_freed_host_memory()
  define_flags()
  app.run(exit_on_user_error(main), flags_parser=common.parse_flags)
