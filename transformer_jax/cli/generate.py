"""Samples continuations from a causal_lm run, one output line for each prompt.

  python -m transformer_jax.generate --workdir=DIR [--prompt=TEXT | < prompts.txt] \
      [--max_new_tokens=50] [--temperature=1.0] [--top_k=0] [--top_p=1.0] [--seed=0]

Each line printed is the prompt and its continuation. --temperature=0 is greedy;
the same --seed gives the same text.
"""

from __future__ import annotations

import functools
import sys

import jax
import numpy as np
from absl import app, flags

from transformer_jax.cli import common
from transformer_jax.decode.generate import generate
from transformer_jax.errors import UserError, exit_on_user_error
from transformer_jax.special_tokens import PAD_ID
from transformer_jax.tasks.causal_lm import CausalLMTask
from transformer_jax.tasks.registry import load_run

FLAGS = common.FLAGS


def define_flags() -> None:
  flags.DEFINE_string("workdir", None, "Run directory of a causal_lm training run.")
  flags.DEFINE_string("checkpoint", "latest", "latest, averaged, or a step number.")
  flags.DEFINE_string("prompt", None, "One prompt; without it, one prompt per line of stdin.")
  flags.DEFINE_integer("max_new_tokens", 50, "Tokens sampled after each prompt (fewer at EOS).")
  flags.DEFINE_float("temperature", 1.0, "Sampling temperature; 0 is greedy.")
  flags.DEFINE_integer("top_k", 0, "Sample from the k most likely tokens (0: all).")
  flags.DEFINE_float("top_p", 1.0, "Sample from the smallest set holding this probability.")
  flags.DEFINE_integer("seed", 0, "Random seed: the same seed gives the same text.")
  flags.DEFINE_bool("replace_invalid_utf8", False, "Replace invalid UTF-8 bytes instead of failing.")


@exit_on_user_error
def main(argv: list[str]) -> None:
  if len(argv) > 1:
    raise UserError(f"unexpected arguments {argv[1:]}; flags look like --max_new_tokens=20")
  workdir = common.require_workdir()
  if FLAGS.max_new_tokens < 1 or FLAGS.temperature < 0 or not 0 < FLAGS.top_p <= 1 or FLAGS.top_k < 0:
    raise UserError("need --max_new_tokens >= 1, --temperature >= 0, 0 < --top_p <= 1 and "
                    "--top_k >= 0")
  prompts = ([FLAGS.prompt] if FLAGS.prompt is not None
             else common.read_lines(sys.stdin.buffer, FLAGS.replace_invalid_utf8))
  run = load_run(workdir, FLAGS.checkpoint, expected_task=CausalLMTask.name)
  encoded = [run.tokenizer.encode(prompt)[:-1] for prompt in prompts]  # No EOS after a prompt.
  longest = max([len(ids) for ids in encoded] + [1])
  if run.model.config.positions == "learned" and 1 + longest + FLAGS.max_new_tokens > run.model.config.max_len:
    raise UserError(f"a prompt of {longest} tokens plus --max_new_tokens={FLAGS.max_new_tokens} "
                    f"exceeds the model's {run.model.config.max_len} learned positions; "
                    "shorten the prompt or lower --max_new_tokens")
  width = -(-longest // 8) * 8  # A few shapes, a few compiles.
  prompt_tokens = np.full((len(prompts), width), PAD_ID, np.int32)
  for row, ids in enumerate(encoded):
    prompt_tokens[row, :len(ids)] = ids
  sample = jax.jit(functools.partial(
      generate, run.model, max_new_tokens=FLAGS.max_new_tokens, temperature=FLAGS.temperature,
      top_k=FLAGS.top_k, top_p=FLAGS.top_p))
  out = np.asarray(sample(run.params, prompt_tokens, np.array([len(ids) for ids in encoded]),
                          key=jax.random.key(FLAGS.seed)))
  for row, ids in enumerate(encoded):
    continuation = out[row, 1 + len(ids):].tolist()
    sys.stdout.write(run.tokenizer.decode(ids + continuation).replace("\n", " ") + "\n")
  sys.stdout.flush()


def run() -> None:
  common.keep_freed_host_memory()
  common.enable_compilation_cache()
  define_flags()
  app.run(main, flags_parser=common.parse_flags)


if __name__ == "__main__":
  run()
