"""Length generalisation of every position scheme: one resumable sweep and its report.

  python experiments/length_generalisation.py [--problems=copy,reverse] [--seeds=3] \
      [--launcher=local|subprocess|print|slurm|report]

Trains experiments/configs/length_generalisation.py (lengths 1..8) for every
problem × architecture × position scheme × seed through experiments/ablations.py's
sweep runner (rows `<problem>_<arch>_<positions>_seed<S>`, seed-major, so the
first seed of every cell finishes first), scores each row's exact match at every
length 1..32 on its test set, and writes
  results/<sweep>/lengths.md   mean ± std over seeds by length bucket;
  results/<sweep>/lengths.png  exact match against length, one panel a problem and
                               architecture, one line a scheme.
Rerunning resumes; `--launcher=report` redraws from the rows kept in results/<sweep>/rows.
Overrides of the base config pass through: `--config.num_train_steps=500`.
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from pathlib import Path

from absl import app, flags
from ml_collections import config_flags

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ablations  # noqa: E402  (experiments/ is not a package)
from transformer_jax.cli import common
from transformer_jax.data.algorithmic import PROBLEMS
from transformer_jax.errors import UserError, exit_on_user_error
from transformer_jax.model.positions import POSITION_KINDS
from transformer_jax.tasks.algorithmic import ARCHITECTURES

REPO_ROOT = Path(__file__).resolve().parents[1]
CONFIG = REPO_ROOT / "experiments" / "configs" / "length_generalisation.py"
SCHEMES = ("none", "sinusoidal", "learned", "rope", "alibi", "t5_bias")
ARCH_NAMES = {"decoder_only": "dec", "encoder_decoder": "encdec"}
LAYERS = {"decoder_only": 4, "encoder_decoder": 2}  # Each stack's; the config's defaults.


def study_rows(problems: list[str], architectures: list[str], schemes: list[str],
               seeds: int) -> list[ablations.Row]:
  """Every cell once per seed, seed-major: seed 0 of every cell comes first."""
  return [ablations.Row(f"{problem}_{ARCH_NAMES[arch]}_{scheme}_seed{seed}", {
      "algorithmic.problem": problem, "algorithmic.architecture": arch,
      "model.num_layers": LAYERS[arch], "model.positions": scheme, "seed": seed,
      "data.seed": seed}) for seed in range(seeds) for problem in problems
      for arch in architectures for scheme in schemes]


def cell_of(row: ablations.Row) -> tuple[str, str, str]:
  o = row.overrides
  return o["algorithmic.problem"], o["algorithmic.architecture"], o["model.positions"]


def by_cell(rows: list[ablations.Row], results: dict) -> dict[tuple, list[dict]]:
  """{(problem, architecture, scheme): [each finished seed's final report]}."""
  cells: dict[tuple, list[dict]] = {}
  for row in rows:
    final = results.get(row.name, {}).get("final")
    if final:
      cells.setdefault(cell_of(row), []).append(final)
  return cells


def _mean_std(values: list[float]) -> str:
  if len(values) == 1:
    return f"{100 * values[0]:.0f}"
  return f"{100 * statistics.mean(values):.0f} ± {100 * statistics.stdev(values):.0f}"


def format_tables(rows: list[ablations.Row], results: dict) -> str:
  """Markdown: one table a problem; a row per architecture and scheme, a column per bucket."""
  cells = by_cell(rows, results)
  if not cells:
    return "No row finished yet.\n"
  buckets = list(next(iter(cells.values()))[0]["exact_match_by_bucket"])
  seen = list(dict.fromkeys(cell_of(r) for r in rows))
  lines = []
  for problem in dict.fromkeys(p for p, _, _ in seen):
    lines += [f"### {problem}", "", "| architecture | positions | seeds | "
              + " | ".join(f"{b} items" for b in buckets) + " |",
              "|" + " --- |" * (3 + len(buckets))]
    for arch in dict.fromkeys(a for p, a, _ in seen if p == problem):
      for scheme in dict.fromkeys(s for p, a, s in seen if (p, a) == (problem, arch)):
        reports = cells.get((problem, arch, scheme), [])
        values = [_mean_std([r["exact_match_by_bucket"][b] for r in reports]) if reports else ""
                  for b in buckets]
        lines.append(f"| {arch} | {scheme} | {len(reports)} | " + " | ".join(values) + " |")
    lines.append("")
  return "\n".join(lines)


def plot_lengths(path: Path, rows: list[ablations.Row], results: dict, provenance: str) -> None:
  """Exact match against length: a panel a (problem, architecture), a line a scheme (the
  mean over seeds, the band their min..max); the training lengths shaded."""
  import matplotlib

  matplotlib.use("Agg")
  from matplotlib import pyplot as plt

  cells = by_cell(rows, results)
  problems = list(dict.fromkeys(cell_of(r)[0] for r in rows))
  archs = list(dict.fromkeys(cell_of(r)[1] for r in rows))
  schemes = list(dict.fromkeys(cell_of(r)[2] for r in rows))
  fig, axes = plt.subplots(len(problems), len(archs), figsize=(5 * len(archs),
                           2.6 * len(problems)), squeeze=False, sharex=True, sharey=True)
  for i, problem in enumerate(problems):
    for j, arch in enumerate(archs):
      ax = axes[i][j]
      for k, scheme in enumerate(schemes):
        reports = cells.get((problem, arch, scheme))
        if not reports:
          continue
        lengths = sorted(int(n) for n in reports[0]["exact_match_by_items"])
        curves = [[r["exact_match_by_items"][str(n)] for n in lengths] for r in reports]
        mean = [statistics.mean(v) for v in zip(*curves)]
        line, = ax.plot(lengths, mean, label=f"{scheme} ({len(reports)})", color=f"C{k}")
        if len(reports) > 1:
          ax.fill_between(lengths, [min(v) for v in zip(*curves)], [max(v) for v in zip(*curves)],
                          color=line.get_color(), alpha=0.15)
        ax.axvspan(0.5, reports[0]["train_max_items"] + 0.5, color="grey", alpha=0.08)
      ax.set_title(f"{problem}, {arch}", fontsize=9)
      ax.set_ylim(-0.03, 1.03)
      ax.grid(alpha=0.3)
      if i == len(problems) - 1:
        ax.set_xlabel("items (training: shaded)")
      if j == 0:
        ax.set_ylabel("exact match")
  axes[0][0].legend(fontsize=7, title="positions (seeds)", title_fontsize=7)
  fig.text(0.01, 0.005, f"test sets, teacher-forced exact match; {provenance}; drawn "
           f"{time.strftime('%Y-%m-%d', time.gmtime())}", fontsize=7, color="grey")
  fig.tight_layout(rect=(0, 0.015, 1, 1))
  partial = path.with_name(f"{path.stem}.{os.getpid()}.tmp{path.suffix}")
  fig.savefig(partial, dpi=90)
  plt.close(fig)
  os.replace(partial, path)


def write_study(sweep_dir: Path, rows: list[ablations.Row], results: dict) -> None:
  provenance = "trained on " + ablations.trained_on(results.get(r.name, {}) for r in rows)
  done = sum(1 for r in rows if results.get(r.name, {}).get("final"))
  text = (f"# Exact match by length: {done} of {len(rows)} rows\n\n"
          "Teacher-forced exact match (= greedy decoding's) on each row's test set, in % "
          "(mean ± sample std over seeds), averaged over the lengths of each bucket; "
          f"training saw 1..8 items. {provenance}.\n\n" + format_tables(rows, results))
  ablations.write_whole(sweep_dir / "lengths.md", text)
  plot_lengths(sweep_dir / "lengths.png", rows, results, provenance)


def define_flags() -> None:
  config_flags.DEFINE_config_file("config", os.fspath(CONFIG), "The base config.")
  flags.DEFINE_list("problems", list(PROBLEMS), "Problems (data/algorithmic.py).")
  flags.DEFINE_list("architectures", list(ARCHITECTURES), "decoder_only, encoder_decoder.")
  flags.DEFINE_list("positions", list(SCHEMES), "Position schemes (config.model.positions).")
  flags.DEFINE_integer("seeds", 3, "Seeds 0..N-1 of every cell.")
  flags.DEFINE_string("sweep", "length_generalisation", "results/<sweep>/ and runs/<sweep>/.")
  flags.DEFINE_enum("launcher", "local", list(ablations.LAUNCHERS), "Where rows train.")
  flags.DEFINE_string("results_dir", "results", "Folder of results/<sweep>/.")
  flags.DEFINE_string("runs_dir", None, "Row workdirs; default runs/<sweep>.")


def main(argv: list[str]) -> None:
  if len(argv) > 1:
    raise UserError(f"unexpected arguments {argv[1:]}; use --problems=copy,reverse")
  FLAGS = flags.FLAGS
  for name, values, allowed in (("problems", FLAGS.problems, PROBLEMS),
                                ("architectures", FLAGS.architectures, ARCHITECTURES),
                                ("positions", FLAGS.positions, POSITION_KINDS)):
    unknown = [v for v in values if v not in allowed]
    if unknown:
      raise UserError(f"--{name}: {', '.join(unknown)} not in {', '.join(allowed)}")
  if FLAGS.seeds < 1:
    raise UserError(f"--seeds={FLAGS.seeds} must be at least 1")
  common.quiet_libraries()
  common.enable_compilation_cache()
  rows = study_rows(FLAGS.problems, FLAGS.architectures, FLAGS.positions, FLAGS.seeds)
  sweep_dir = Path(FLAGS.results_dir).resolve() / FLAGS.sweep
  runs_dir = Path(FLAGS.runs_dir or Path("runs") / FLAGS.sweep).resolve()
  flag_args = [a for a in sys.argv[1:] if a.startswith("--config.")]
  slurm_task = os.environ.get(ablations.SLURM_TASK_ENV)
  try:
    results = ablations.run_sweep(
        FLAGS.config, rows, sweep_dir, runs_dir, FLAGS.launcher, bleu_sentences=0,
        config_spec=os.fspath(CONFIG), flag_args=flag_args,
        slurm_task=int(slurm_task) if slurm_task is not None else None,
        rerun_command=[sys.executable, os.path.abspath(__file__), *sys.argv[1:]])
  except (ValueError, KeyError, TypeError) as e:
    raise UserError(str(e).strip("'\"")) from None
  write_study(sweep_dir, rows, results)
  print(f"table: {sweep_dir / 'lengths.md'}\nplot: {sweep_dir / 'lengths.png'}")


if __name__ == "__main__":
  common.keep_freed_host_memory()
  define_flags()
  app.run(exit_on_user_error(main), flags_parser=common.parse_flags)
