"""Is a change free? One benchmark at two git revisions, alternating, as a ratio.

  python benchmarks/revisions.py --before=<rev> [--after=HEAD] [--rounds=3] \
      -- train_step.py --batch_size=32 --steps=5
  python benchmarks/revisions.py --before=<rev> -- decoding.py --decode_repeats=3

Each revision is checked out once into a worktree under --worktrees, and the script
(one of benchmarks/, with its flags) runs there with that revision's package first on
PYTHONPATH: before, after, after, before, ... (an ABBA order, so drift in the host's
speed falls on both). Every run prints its JSON row; the throughputs it holds
(`tokens_per_s`, and each decoding method's) are compared round by round as after /
before, and the median ratio with its range is printed and appended to
benchmarks/results/revisions.jsonl with the host's CPU and the date.
"""

from __future__ import annotations

import datetime
import json
import os
import pathlib
import statistics
import subprocess
import sys

from absl import app, flags

from common import cpu_model  # benchmarks/common.py (on sys.path)

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]
FLAGS = flags.FLAGS
flags.DEFINE_string("before", None, "The baseline revision (a commit, tag or branch).",
                    required=True)
flags.DEFINE_string("after", "HEAD", "The revision measured against it.")
flags.DEFINE_integer("rounds", 3, "Runs of each revision; the order alternates ABBA.")
flags.DEFINE_string("worktrees", "/tmp/transformer_jax_revisions",
                    "Where the revisions are checked out (kept for the next call).")
flags.DEFINE_string("out", "benchmarks/results/revisions.jsonl",
                    "Appended with one row a call (relative to the repo root); '' saves nothing.")


def commit_of(revision: str) -> str:
  return subprocess.run(["git", "rev-parse", "--verify", f"{revision}^{{commit}}"],
                        cwd=REPO_ROOT, check=True, capture_output=True, text=True).stdout.strip()


def worktree(commit: str) -> pathlib.Path:
  """A checkout of `commit` under --worktrees (made once)."""
  path = pathlib.Path(FLAGS.worktrees) / commit[:12]
  if not (path / "transformer_jax").is_dir():
    subprocess.run(["git", "worktree", "add", "--force", "--detach", str(path), commit],
                   cwd=REPO_ROOT, check=True, capture_output=True)
  return path


def throughputs(row: dict) -> dict[str, float]:
  """{name: per-second figure} of a benchmark's JSON row: the run's, and each method's."""
  found = {name: float(row[name]) for name in ("tokens_per_s", "sentences_per_s") if name in row}
  for method, values in (row.get("methods") or {}).items():
    for name in ("tokens_per_s", "sentences_per_s"):
      if name in values:
        found[f"{method}.{name}"] = float(values[name])
  return found


def run_once(checkout: pathlib.Path, script_args: list[str]) -> dict[str, float]:
  script, *args = script_args
  env = dict(os.environ, PYTHONPATH=str(checkout))
  command = [sys.executable, str(checkout / "benchmarks" / script), *args, "--json",
             "--results_dir=", "--summary="]
  done = subprocess.run(command, cwd=checkout, env=env, capture_output=True, text=True)
  if done.returncode != 0:
    raise SystemExit(f"{' '.join(command)} failed in {checkout}:\n{done.stderr[-3000:]}")
  row = json.loads(done.stdout.strip().splitlines()[-1])
  return throughputs(row)


def main(argv: list[str]) -> None:
  script_args = argv[1:]
  if not script_args or not (REPO_ROOT / "benchmarks" / script_args[0]).is_file():
    raise SystemExit("name a benchmark script after --: revisions.py --before=REV -- "
                     "train_step.py --steps=5")
  commits = {"before": commit_of(FLAGS.before), "after": commit_of(FLAGS.after)}
  checkouts = {side: worktree(commit) for side, commit in commits.items()}
  figures: dict[str, list[dict[str, float]]] = {"before": [], "after": []}
  for round_index in range(FLAGS.rounds):
    order = ("before", "after") if round_index % 2 == 0 else ("after", "before")
    for side in order:
      figures[side].append(run_once(checkouts[side], script_args))
      print(f"round {round_index + 1} {side}: " + ", ".join(
          f"{k} {v:,.1f}" for k, v in figures[side][-1].items()), flush=True)
  ratios = {}
  for name in figures["after"][0]:
    per_round = [a[name] / b[name] for a, b in zip(figures["after"], figures["before"])
                 if name in b]
    if per_round:
      ratios[name] = dict(median=statistics.median(per_round), min=min(per_round),
                          max=max(per_round),
                          before=statistics.median(b[name] for b in figures["before"]),
                          after=statistics.median(a[name] for a in figures["after"]))
  for name, r in ratios.items():
    print(f"{name}: after/before {r['median']:.3f} (range {r['min']:.3f}-{r['max']:.3f}); "
          f"median {r['before']:,.1f} -> {r['after']:,.1f}")
  row = dict(date=datetime.date.today().isoformat(), host_cpu=cpu_model(),
             host_cpus=os.cpu_count(), benchmark=" ".join(script_args), rounds=FLAGS.rounds,
             before=commits["before"][:12], after=commits["after"][:12], ratios=ratios)
  if FLAGS.out:
    with open(REPO_ROOT / FLAGS.out, "a") as out:
      out.write(json.dumps(row) + "\n")
  print(json.dumps(row))


if __name__ == "__main__":
  app.run(main)
