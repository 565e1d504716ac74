"""PyTorch references for the benchmarks' --compare: same shapes, same recipe.

Used by `benchmarks/train_step.py --compare=torch` and `benchmarks/decoding.py --compare=marian`;
also runs alone:

  python benchmarks/torch_reference.py train --vocab_size=32000 --batch_size=64 \
      --src_len=32 --tgt_len=32 --steps=5 --json
  python benchmarks/torch_reference.py decode --vocab_size=32000 --batch_size=64 \
      --src_len=32 --decode_steps=40 --beam_size=4 --json

train: `torch.nn.TransformerEncoderLayer` / `TransformerDecoderLayer` stacks (the
layers of `torch.nn.Transformer`: post-LN, ReLU, dropout 0.1, but without its
extra final LayerNorms, which the paper's post-LN model does not have), one
embedding shared by source, target and the pre-softmax projection, scaled by
√d_model (§3.4), sinusoidal positions (§3.5), label-smoothed cross-entropy
that ignores PAD (§5.4), Adam(0.9, 0.98, 1e-9) on the §5.3 schedule.

decode: `transformers.MarianMTModel` (a post-LN Transformer with sinusoidal
positions and shared, scaled embeddings) with random weights of the given
size; `generate(num_beams=..., max_new_tokens=N, min_new_tokens=N)` so every
sentence decodes exactly N tokens. Greedy is timed too.

The last line printed with --json is one JSON object (`target_tokens_per_s`
or `sentences_per_s`). Needs the `[bench]` extra: torch and transformers.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import statistics
import time
from typing import Any, Callable

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from timing import median_time  # benchmarks/timing.py (this folder is on sys.path)

PAD_ID, BOS_ID, EOS_ID = 0, 2, 3  # As transformer_jax.special_tokens.


def sinusoids(length: int, d_model: int) -> torch.Tensor:
  """float32[length, d_model]: sines in even channels, cosines in odd (§3.5)."""
  position = torch.arange(length, dtype=torch.float32)[:, None]
  inverse_frequency = 1.0 / (10000.0 ** (torch.arange(0, d_model, 2, dtype=torch.float32) / d_model))
  angles = position * inverse_frequency
  return torch.stack([torch.sin(angles), torch.cos(angles)], dim=-1).reshape(length, d_model)


class TorchTransformer(nn.Module):
  """The paper's encoder-decoder from torch.nn's Transformer layers."""

  def __init__(self, vocab_size: int, d_model: int, num_heads: int, d_ff: int,
               encoder_layers: int, decoder_layers: int, dropout: float, max_len: int = 1024):
    super().__init__()
    self.d_model = d_model
    self.embedding = nn.Embedding(vocab_size, d_model)
    nn.init.normal_(self.embedding.weight, std=d_model**-0.5)
    layer = lambda cls: cls(d_model, num_heads, d_ff, dropout, activation="relu",
                            batch_first=True, norm_first=False)
    self.encoder = nn.TransformerEncoder(layer(nn.TransformerEncoderLayer), encoder_layers,
                                         norm=None, enable_nested_tensor=False)
    self.decoder = nn.TransformerDecoder(layer(nn.TransformerDecoderLayer), decoder_layers,
                                         norm=None)
    self.dropout = nn.Dropout(dropout)
    self.register_buffer("positions", sinusoids(max_len, d_model), persistent=False)

  def embed(self, tokens: torch.Tensor) -> torch.Tensor:
    scaled = self.embedding(tokens) * math.sqrt(self.d_model)
    return self.dropout(scaled + self.positions[: tokens.shape[1]])

  def forward(self, src_tokens: torch.Tensor, target_input_tokens: torch.Tensor) -> torch.Tensor:
    """int64[batch, src_len], int64[batch, tgt_len] -> logits [batch, tgt_len, vocab]."""
    src_padding = src_tokens == PAD_ID
    tgt_len = target_input_tokens.shape[1]
    causal = torch.triu(torch.ones(tgt_len, tgt_len, dtype=torch.bool), diagonal=1)
    memory = self.encoder(self.embed(src_tokens), src_key_padding_mask=src_padding)
    decoded = self.decoder(self.embed(target_input_tokens), memory, tgt_mask=causal,
                           tgt_is_causal=True, tgt_key_padding_mask=target_input_tokens == PAD_ID,
                           memory_key_padding_mask=src_padding)
    return decoded @ self.embedding.weight.T  # §3.4: tied pre-softmax weights.


def synthetic_tokens(rows: int, length: int, vocab_size: int, seed: int) -> torch.Tensor:
  """int64[rows, length]: random non-special tokens ending in EOS (as benchmarks/common.py)."""
  tokens = np.random.default_rng(seed).integers(4, vocab_size, size=(rows, length))
  tokens[:, -1] = EOS_ID
  return torch.from_numpy(tokens.astype(np.int64))


def autocast(dtype: str):
  """bf16 autocast on the CPU for --dtype=bfloat16, else a no-op."""
  return torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == "bfloat16")


def make_train_step(args: argparse.Namespace) -> tuple[Callable[[], float], dict[str, Any]]:
  """(step() -> loss, facts) for the reference model; `train_step.py` alternates it with JAX's."""
  torch.manual_seed(0)
  model = TorchTransformer(args.vocab_size, args.d_model, args.num_heads, args.d_ff,
                           args.encoder_layers, args.decoder_layers, args.dropout,
                           max_len=max(args.src_len, args.tgt_len))
  model.train()
  optimizer = torch.optim.Adam(model.parameters(), lr=1.0, betas=(0.9, 0.98), eps=1e-9)
  forward = torch.compile(model) if args.compile else model  # Inductor; compiles at the first call.
  warmup = 4000
  schedule = torch.optim.lr_scheduler.LambdaLR(  # §5.3.
      optimizer, lambda n: args.d_model**-0.5 * min((n + 1) ** -0.5, (n + 1) * warmup**-1.5))
  src = synthetic_tokens(args.batch_size, args.src_len, args.vocab_size, 1)
  targets = synthetic_tokens(args.batch_size, args.tgt_len, args.vocab_size, 2)
  target_inputs = F.pad(targets[:, :-1], (1, 0), value=BOS_ID)

  def step():
    optimizer.zero_grad(set_to_none=True)
    with autocast(args.dtype):
      logits = forward(src, target_inputs)
    tokens = (targets != PAD_ID).sum()
    loss = F.cross_entropy(logits.float().reshape(-1, args.vocab_size), targets.reshape(-1),
                           ignore_index=PAD_ID, label_smoothing=0.1, reduction="sum") / tokens
    loss.backward()
    optimizer.step()
    schedule.step()
    return float(loss.detach())

  info = dict(reference="torch.nn.Transformer layers" + (" under torch.compile (inductor)"
                                                        if args.compile else ""),
              torch_compile=bool(args.compile), torch=torch.__version__,
              threads=torch.get_num_threads(), dtype=args.dtype,
              params=sum(p.numel() for p in model.parameters()))
  return step, info


def train_result(args: argparse.Namespace, info: dict[str, Any], times: list[float],
                 **extra: Any) -> dict[str, Any]:
  """The reference's numbers from its timed steps."""
  seconds = statistics.median(times)
  return dict(info, step_time_s=seconds, step_times_s=times, step_time_best_s=min(times),
              target_tokens_per_s=args.batch_size * args.tgt_len / seconds,
              tokens_per_s=args.batch_size * (args.src_len + args.tgt_len) / seconds, **extra)


def benchmark_train(args: argparse.Namespace) -> dict[str, Any]:
  step, info = make_train_step(args)
  losses = []
  start = time.perf_counter()
  losses.append(step())
  first_s = time.perf_counter() - start
  for _ in range(args.warmup - 1):
    step()
  _, times = median_time(lambda: losses.append(step()), args.steps)
  return train_result(args, info, times, first_step_s=first_s, final_loss=losses[-1],
                      peak_memory_bytes=peak_rss())


def make_generators(args: argparse.Namespace) -> tuple[dict[str, tuple[int, Callable]], dict]:
  """({method: (beams, generate() -> tokens)}, facts) for a random-weight MarianMTModel."""
  from transformers import MarianConfig, MarianMTModel
  from transformers.utils import logging as hf_logging

  hf_logging.set_verbosity_error()
  config = MarianConfig(
      vocab_size=args.vocab_size, decoder_vocab_size=args.vocab_size, d_model=args.d_model,
      encoder_layers=args.encoder_layers, decoder_layers=args.decoder_layers,
      encoder_attention_heads=args.num_heads, decoder_attention_heads=args.num_heads,
      encoder_ffn_dim=args.d_ff, decoder_ffn_dim=args.d_ff, activation_function="relu",
      dropout=args.dropout, scale_embedding=True, share_encoder_decoder_embeddings=True,
      tie_word_embeddings=True, max_position_embeddings=max(512, args.src_len + args.decode_steps + 2),
      pad_token_id=PAD_ID, eos_token_id=EOS_ID, bos_token_id=BOS_ID,
      decoder_start_token_id=BOS_ID, forced_eos_token_id=None,
  )
  torch.manual_seed(0)
  model = MarianMTModel(config).eval()
  src = synthetic_tokens(args.batch_size, args.src_len, args.vocab_size, 3)
  attention_mask = torch.ones_like(src)
  methods = {"greedy": 1}
  if args.beam_size > 1:
    methods["beam"] = args.beam_size

  def generator(beams: int) -> Callable:
    def generate():
      with torch.inference_mode(), autocast(args.dtype):
        out = model.generate(input_ids=src, attention_mask=attention_mask, num_beams=beams,
                             do_sample=False, max_new_tokens=args.decode_steps,
                             min_new_tokens=args.decode_steps, early_stopping=False)
      if out.shape != (args.batch_size, args.decode_steps + 1):  # + the start token.
        raise RuntimeError(f"Marian generated {tuple(out.shape)}, expected "
                           f"{(args.batch_size, args.decode_steps + 1)}")
      return out
    return generate

  import transformers

  info = dict(reference="transformers.MarianMTModel (random weights)",
              transformers=transformers.__version__, torch=torch.__version__,
              threads=torch.get_num_threads(), dtype=args.dtype,
              params=sum(p.numel() for p in model.parameters()))
  return {method: (beams, generator(beams)) for method, beams in methods.items()}, info


def decode_result(args: argparse.Namespace, info: dict[str, Any],
                  runs: dict[str, dict[str, Any]], **extra: Any) -> dict[str, Any]:
  """The reference's numbers from {method: dict(beam_size, times_s, first_call_s)}."""
  for run in runs.values():
    run["seconds"] = statistics.median(run["times_s"])
    run["best_s"] = min(run["times_s"])
    run["sentences_per_s"] = args.batch_size / run["seconds"]
    run["tokens_per_s"] = args.batch_size * args.decode_steps / run["seconds"]
  main = runs["beam" if args.beam_size > 1 else "greedy"]
  return dict(info, sentences_per_s=main["sentences_per_s"], tokens_per_s=main["tokens_per_s"],
              methods=runs, **extra)


def benchmark_decode(args: argparse.Namespace) -> dict[str, Any]:
  generators, info = make_generators(args)
  runs = {}
  for method, (beams, generate) in generators.items():
    start = time.perf_counter()
    generate()
    first_s = time.perf_counter() - start
    _, times = median_time(generate, args.repeats)
    runs[method] = dict(beam_size=beams, times_s=times, first_call_s=first_s)
  return decode_result(args, info, runs, peak_memory_bytes=peak_rss())


def peak_rss() -> int:
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("mode", choices=("train", "decode"))
  for name, default in (("vocab_size", 32000), ("d_model", 512), ("d_ff", 2048), ("num_heads", 8),
                        ("encoder_layers", 6), ("decoder_layers", 6), ("batch_size", 64),
                        ("src_len", 32), ("tgt_len", 32), ("steps", 10), ("warmup", 2),
                        ("decode_steps", 40), ("beam_size", 4), ("repeats", 3), ("threads", 2)):
    parser.add_argument(f"--{name}", type=int, default=default)
  parser.add_argument("--dropout", type=float, default=0.1)
  parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
  parser.add_argument("--compile", action="store_true",
                      help="train: the model under torch.compile (inductor); the first step, "
                      "which compiles, is reported apart (first_step_s).")
  parser.add_argument("--json", action="store_true", help="Print one JSON object last.")
  return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
  args = parse_args(argv)
  torch.set_num_threads(args.threads)
  load = [round(x, 2) for x in os.getloadavg()]
  result = benchmark_train(args) if args.mode == "train" else benchmark_decode(args)
  result.update(load_average=load, load_average_end=[round(x, 2) for x in os.getloadavg()])
  for key in ("target_tokens_per_s", "sentences_per_s", "tokens_per_s", "params"):
    if key in result:
      print(f"  {key:<20} {result[key]:,.2f}", flush=True)
  if args.json:
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
  main()
