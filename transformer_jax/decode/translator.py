"""Translating with a trained model: the KV cache wired to beam / greedy search / sampling.

Serves the encoder-decoder and the decoder-only prefix LM alike, and ensembles of them
(`decode.ensemble`; `tasks.translation.combine_runs` makes one of runs).

`Translator` jits and shards `decode_batch` per output length; `translate_texts`
turns sentences into length-sorted token batches and back (§6.1 recipe by
default: beam 4, α = 0.6, at most input length + 50 tokens).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import sys
from typing import Any, Iterator, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from tqdm import tqdm

from transformer_jax import sharding
from transformer_jax.decode import prefix_lm, search
from transformer_jax.decode.ensemble import Ensemble, average_step, members_of
from transformer_jax.decode.cache import (grow_cache, init_cache, sentence_step_logits, split_cache,
                                          stored_as)
from transformer_jax.errors import UserError
from transformer_jax.model import precision
from transformer_jax.model.config import MATMUL_DTYPES
from transformer_jax.model.decoder_only import DecoderOnly
from transformer_jax.model.platform import platform_in_force
from transformer_jax.model.transformer import Transformer
from transformer_jax.special_tokens import EOS_ID, PAD_ID

Array = jax.Array

# Source tokens a decoding batch, by default. A batch decodes until its longest output
# ends; on a CPU beam search costs about the same per sentence at any batch size, so
# smaller batches waste fewer steps (recipe v14's model on test2016, Intel AMX host: 1,024
# tokens 1.17x the sentences/s of 4,096 with beam 5, 1.19x greedy; benchmarks/README.md).
# Accelerators keep their cores busy with large batches.
CPU_TOKENS_PER_BATCH = 1024
ACCELERATOR_TOKENS_PER_BATCH = 4096


def default_tokens_per_batch() -> int:
  """1,024 source tokens a decoding batch on a CPU, 4,096 on an accelerator."""
  return CPU_TOKENS_PER_BATCH if jax.default_backend() == "cpu" else ACCELERATOR_TOKENS_PER_BATCH


@dataclasses.dataclass(frozen=True)
class DecodeOptions:
  """How to search. `method` is "beam", "greedy" or "sample"."""

  method: str = "beam"
  beam_size: int = 4
  alpha: float = 0.6
  max_extra_len: int = 50  # Output may be this much longer than the input.
  temperature: float = 1.0
  top_k: int = 0
  ignore_eos: bool = False  # Benchmarks: always decode to the maximum length.
  # The self-attention cache starts at 16 positions and doubles (one compiled loop per
  # length), so early steps attend over, and beam search reorders, a short cache; False:
  # one loop over a cache of the maximum length. Same outputs either way. None: on for
  # beam search, off otherwise: beam search gains (it reorders the cache every step),
  # greedy search loses to the extra compiles (measured on Multi30k val: benchmarks/README.md).
  growing_cache: bool | None = None
  # EOS cannot end an output shorter than this (its logit is -inf before): 1 never returns an
  # empty translation, which no training target is; a weak model's beam search otherwise
  # finds one, as an EOS at step 0 pays no length penalty (fairseq's min_len does the same).
  min_length: int = 1
  finish_rule: str = "t2t"  # Beam search: which hypotheses finish (search.beam_search).
  stop_rule: str = "exact"  # Beam search: when a sentence stops (search.beam_search).
  quantize: str = ""  # "int8": the weight matmuls in int8 (ModelConfig.quantize).
  # Matmul operands while decoding: "" as the run was configured, else "float32",
  # "bfloat16" or "auto" (bfloat16 where this host runs it natively; ModelConfig.matmul_dtype).
  matmul_dtype: str = ""
  # Greedy and beam search go on in a batch of half the size (then a quarter, an eighth)
  # once the undecided sentences fit in it, as CTranslate2 drops finished sentences: same
  # outputs, fewer rows a step, three more compiled loops (search.shrinking_sizes). Beam
  # search gains 1.20-1.26x once compiled, but its first call compiles twice as long, which
  # a test set of Multi30k's size does not repay (benchmarks/README.md): off by default, for
  # large jobs and a warm compilation cache. Sampling keeps its batch (a sentence's draws
  # depend on its row).
  shrink_batch: bool = False
  # Beam search over encoder-decoders: the beams of a sentence share one self-attention cache
  # row (beam_size slots a position, each beam attending to its own history's slots), so
  # nothing is reordered when beams change parents (search.beam_search's `shared_cache`).
  # Same outputs up to float rounding; beam 4 1.19-1.35x faster on a CPU (benchmarks/README.md).
  # None: on where every model is an encoder-decoder and the backend is a CPU (on a GPU,
  # where a gather is cheap and attention reads beam-fold more slots, it is not yet measured).
  shared_beam_cache: bool | None = None

  @classmethod
  def from_config(cls, config: Any) -> "DecodeOptions":
    """The §6.1 search of an experiment config (beam_size, length_penalty, max_decode_extra_len)."""
    return cls(beam_size=config.beam_size, alpha=config.length_penalty,
               max_extra_len=config.max_decode_extra_len)

  def spec(self, alpha: float | Array | None = None) -> search.SearchSpec:
    """What to search for (`alpha`, possibly traced, in place of options.alpha)."""
    return search.SearchSpec(
        method=self.method, beam_size=self.beam_size,
        alpha=self.alpha if alpha is None else alpha, finish_rule=self.finish_rule,
        stop_rule=self.stop_rule, temperature=self.temperature, top_k=self.top_k,
        eos_id=search.NO_EOS if self.ignore_eos else EOS_ID)

  @property
  def grows_cache(self) -> bool:
    """Whether decoding runs over a growing self-attention cache (`growing_cache` resolved)."""
    return self.method == "beam" if self.growing_cache is None else self.growing_cache

  def __post_init__(self):
    self.spec()  # The search's own settings.
    if self.max_extra_len < 0:
      raise UserError(f"max_extra_len={self.max_extra_len} must be >= 0")
    if self.min_length < 0:
      raise UserError(f"--min_length={self.min_length} must be >= 0")
    if self.quantize not in precision.QUANTIZATIONS:
      raise UserError(f"--quantize={self.quantize!r} is not a quantization: use int8, or "
                      "leave it empty for the weights as trained")
    if self.matmul_dtype not in MATMUL_DTYPES:
      raise UserError(f"--matmul_dtype={self.matmul_dtype!r} is not one of "
                      f"{', '.join(MATMUL_DTYPES[1:])}; leave it empty for the run's own")
    if self.shrink_batch and self.method == "sample":
      raise UserError("--shrink_batch is for greedy and beam search: sampling keeps its batch, "
                      "as a sentence's draws depend on its row; leave it unset")


def for_decoding(model: Transformer | DecoderOnly | Ensemble, options: DecodeOptions
                 ) -> Transformer | DecoderOnly | Ensemble:
  """`model` (each member of an ensemble) with the matmuls `options` asks for (quantize,
  matmul_dtype); same params."""
  if isinstance(model, Ensemble):
    return Ensemble(tuple(for_decoding(member, options) for member in model.members))
  changes = dict(quantize=options.quantize)
  if options.matmul_dtype:
    changes.update(matmul_dtype=options.matmul_dtype)
  if all(getattr(model.config, key) == value for key, value in changes.items()):
    return model
  try:
    return model.clone(config=dataclasses.replace(model.config, **changes))
  except UserError as e:  # E.g. attention_impl="cudnn", which takes bfloat16 operands only.
    asked = " ".join(f"--{key}={value}" for key, value in changes.items() if value)
    raise UserError(f"{asked}: not for this run, as {e}") from None


def shares_beam_cache(model: Transformer | DecoderOnly | Ensemble, options: DecodeOptions) -> bool:
  """Whether beam search over `model` runs on a shared beam cache (`shared_beam_cache`)."""
  if options.method != "beam":
    return False
  members = model.members if isinstance(model, Ensemble) else (model,)
  encoder_decoders = all(isinstance(member, Transformer) for member in members)
  if options.shared_beam_cache and not encoder_decoders:
    raise UserError("--shared_beam_cache is for encoder-decoder models: a prefix LM's beams "
                    "reorder their cache; leave it unset")
  if options.shared_beam_cache is None:
    return encoder_decoders and platform_in_force() == "cpu"
  return options.shared_beam_cache


def _prepare(model: Transformer | DecoderOnly, params, src_tokens: Array, cache_len: int,
             method: str) -> search.StepModel:
  """The search over `model` for `src_tokens`, its cache `cache_len` positions long."""
  if isinstance(model, DecoderOnly):  # A prefix LM: the source is the prompt, attended both ways.
    src_len = src_tokens.shape[1]
    _, cache = prefix_lm.prefill(model, params, src_tokens, src_len + cache_len, prefix_lm=True)
    step, sentences = prefix_lm.sentence_step_logits(model, params), src_tokens
    grow = prefix_lm.growing(src_len)
  else:
    encoded = model.apply({"params": params}, src_tokens, method=Transformer.encode)
    # The beams of a sentence share its cross-attention keys/values: only
    # the self-attention caches are repeated per beam and reordered.
    cache, sentence_cache = split_cache(
        init_cache(model, params, encoded, src_tokens, cache_len))
    step, sentences = sentence_step_logits(model, params), (src_tokens, sentence_cache)
    grow = grow_cache
  if method == "beam":  # Reordered (or read by every beam): half the bytes in bfloat16.
    cache = stored_as(cache, model.config.matmul_operand_dtype)
  return search.StepModel(step, cache, sentences, grow)


def _prepare_ensemble(searches: Sequence[search.StepModel]) -> search.StepModel:
  """One search over several models' (ensemble.average_step), each with its own cache."""
  if len(searches) == 1:
    return searches[0]
  grows = tuple(member.grow_cache for member in searches)
  return search.StepModel(
      average_step([member.step for member in searches]),
      tuple(member.cache for member in searches),
      tuple(member.sentences for member in searches),
      lambda caches, length: tuple(grow(cache, length) for grow, cache in zip(grows, caches)))


def decode_batch(
    model: Transformer | DecoderOnly | Ensemble, params, src_tokens: Array,
    options: DecodeOptions, max_decode_len: int, rng: Array | None = None,
    alpha: float | Array | None = None,
) -> Array:
  """Best output tokens int32[batch, max_decode_len] (EOS, then PAD) for each source row.

  `model` is the encoder-decoder, a prefix LM (a decoder-only model whose
  prompt is the source), or an Ensemble of them (`params` a tuple).

  Args:
    src_tokens: int32[batch, src_len], EOS-terminated, PAD-padded.
    max_decode_len: static output length; each row also stops at its own
      input length + options.max_extra_len.
    alpha: beam search's length penalty, options.alpha where None; a traced float32[]
      lets one compiled search serve every α.
  """
  plan = search.SearchPlan(
      cache_lengths=search.doubling_lengths(max_decode_len) if options.grows_cache else (),
      shrink_batch=options.shrink_batch, shared_cache=shares_beam_cache(model, options))
  first_length = plan.cache_lengths[0] if plan.cache_lengths else max_decode_len
  model = for_decoding(model, options)
  members, member_params = members_of(model, params)
  step_model = _prepare_ensemble([
      _prepare(member, p, src_tokens, first_length, options.method)
      for member, p in zip(members, member_params)])
  step_model = step_model._replace(
      step=search.allowed_tokens(step_model.step, 0 if options.ignore_eos else options.min_length))
  input_lengths = jnp.sum(src_tokens != PAD_ID, axis=-1)
  max_lengths = jnp.minimum(input_lengths + options.max_extra_len, max_decode_len)
  return search.best_outputs(step_model, options.spec(alpha), max_lengths, max_decode_len, plan,
                             rng)


class Translator:
  """Jitted, sharded decoding of token batches for one model (or Ensemble) and its params."""

  def __init__(self, model: Transformer | DecoderOnly | Ensemble, params, mesh,
               options: DecodeOptions):
    model = for_decoding(model, options)
    self.model, self.params, self.mesh, self.options = model, params, mesh, options

  def max_decode_len(self, src_len: int) -> int:
    length = src_len + self.options.max_extra_len
    for model in members_of(self.model, self.params)[0]:
      if model.config.positions == "learned":  # No positions past the table.
        # A prefix LM's output positions follow its source's.
        first = src_len if isinstance(model, DecoderOnly) else 0
        length = min(length, model.config.max_len - first)
    return length

  def __call__(self, src_tokens: np.ndarray, rng: Array | None = None) -> np.ndarray:
    """int32[batch, src_len] -> int32[batch, max_decode_len]; any batch size.

    Rows are padded up to a multiple of the batch shards, so a batch the
    device count does not divide still decodes. Across hosts every process calls it with
    the same `src_tokens` and gets every row back.
    """
    padded = sharding.shard_rows_held_everywhere(self._pad_rows(src_tokens), self.mesh)
    with sharding.mesh_context(self.mesh):
      out = self._function(src_tokens.shape[1])(self.params, padded, rng, self._alpha())
    return sharding.fetch_everywhere(out)[: src_tokens.shape[0]]

  def lower(self, src_tokens: np.ndarray, rng: Array | None = None) -> jax.stages.Lowered:
    """The decoding computation `__call__` runs for this batch shape (for profiling)."""
    with sharding.mesh_context(self.mesh):
      return self._function(src_tokens.shape[1]).lower(self.params, self._pad_rows(src_tokens),
                                                       rng, self._alpha())

  def _pad_rows(self, src_tokens: np.ndarray) -> np.ndarray:
    shards = sharding.batch_shards(self.mesh)
    rows = src_tokens.shape[0]
    padded = np.full((math.ceil(rows / shards) * shards, src_tokens.shape[1]), PAD_ID, np.int32)
    padded[:rows] = src_tokens
    padded[rows:, 0] = EOS_ID  # Filler rows: an empty sentence.
    return padded

  def _alpha(self) -> np.ndarray:
    return np.float32(self.options.alpha)

  def _function(self, src_len: int):
    # α is an argument of the compiled search, not part of its key: report_run's α grid
    # compiles each beam size and shape once.
    options = dataclasses.replace(self.options, alpha=0.0)
    return _jitted_decode(self.model, options, self.mesh, self.max_decode_len(src_len))


@functools.lru_cache(maxsize=64)
def _jitted_decode(model: Transformer | DecoderOnly | Ensemble, options: DecodeOptions, mesh,
                   max_len: int):
  """One jitted search per (architecture, options but α, mesh, output length), shared by
  every Translator: params and α are arguments, so a reloaded or averaged checkpoint of the
  same model (report_run's candidates, a benchmark's rounds), decoded at any α, reuses every
  compiled shape."""
  return jax.jit(
      lambda params, src, rng, alpha: decode_batch(model, params, src, options, max_len, rng,
                                                   alpha),
      in_shardings=(None, sharding.batch_sharding(mesh), None, None),
      out_shardings=sharding.batch_sharding(mesh),
  )


def translate_texts(
    translator: Translator, tokenizer, sentences: Sequence[str], max_source_len: int,
    tokens_per_batch: int | None = None, on_truncate=None, progress=None,
) -> list[str]:
  """Translates `sentences`, one output per input, in order.

  Sentences are sorted by length and batched by a token budget for speed
  (`tokens_per_batch`; None: `default_tokens_per_batch()`), one batch shape per
  padded source length (`_length_batches`);
  empty lines give empty outputs; sources longer than `max_source_len` tokens
  are truncated (and reported through `on_truncate(index, length)`).
  """
  encoded = []
  for index, sentence in enumerate(sentences):
    if not sentence.strip():
      encoded.append(None)
      continue
    ids = tokenizer.encode(sentence)
    if len(ids) > max_source_len:
      if on_truncate is not None:
        on_truncate(index, len(ids))
      ids = ids[: max_source_len - 1] + [EOS_ID]
    encoded.append(ids)
  outputs = [""] * len(sentences)
  order = sorted((i for i, ids in enumerate(encoded) if ids), key=lambda i: len(encoded[i]))
  done = 0
  tokens_per_batch = tokens_per_batch or default_tokens_per_batch()
  for batch_indices, rows, src_len in _length_batches(order, encoded, tokens_per_batch):
    src = np.full((rows, src_len), PAD_ID, np.int32)
    src[len(batch_indices):, 0] = EOS_ID  # Filler rows: empty sentences.
    for row, i in enumerate(batch_indices):
      src[row, : len(encoded[i])] = encoded[i]
    for i, tokens in zip(batch_indices, translator(src)):
      outputs[i] = tokenizer.decode(tokens.tolist())
    done += len(batch_indices)
    if progress is not None:
      progress(done, len(order))
  return outputs


def translate_lines(run: Any, lines: list[str], options: DecodeOptions,
                    tokens_per_batch: int | None = None) -> list[str]:
  """Translations of `lines` by a loaded run (its model, params, mesh, tokenizer and
  config), one per line, with truncation warnings and progress on stderr."""
  max_source_len = run.config.model.max_len

  def on_truncate(index: int, length: int) -> None:
    print(f"warning: line {index + 1} has {length} tokens; truncated to {max_source_len}",
          file=sys.stderr, flush=True)

  translator = Translator(run.model, run.params, run.mesh, options)
  # A bar with rate and ETA on a terminal (disable=None); nothing in a log file.
  with tqdm(total=sum(1 for line in lines if line.strip()), desc="translating",
            unit=" sentences", file=sys.stderr, disable=None, leave=False) as bar:
    return translate_texts(translator, run.tokenizer, lines, max_source_len, tokens_per_batch,
                           on_truncate=on_truncate,
                           progress=lambda done, total: bar.update(done - bar.n))


def _bucket(length: int) -> int:
  """Pads source lengths to a few shapes (multiples of 8) to bound recompiles."""
  return max(8, int(math.ceil(length / 8)) * 8)


def _length_batches(order: list[int], encoded,
                    tokens_per_batch: int) -> Iterator[tuple[list[int], int, int]]:
  """(sentence indices, rows, src_len) for each batch of `order` (sorted by length).

  Batches fill up to `tokens_per_batch` source tokens, padded to `_bucket` lengths. Each
  shape is a compile, so the batches of one length are then evened out: all of the same
  rows, the last filled up to them with fewer filler rows than there are batches.
  """
  greedy: list[list[int]] = []
  for i in order:
    longest = _bucket(len(encoded[i]))
    if not greedy or (len(greedy[-1]) + 1) * longest > tokens_per_batch:
      greedy.append([])
    greedy[-1].append(i)
  by_length: dict[int, list[list[int]]] = {}  # Sorted input: one run of batches a length.
  for batch in greedy:
    by_length.setdefault(_bucket(len(encoded[batch[-1]])), []).append(batch)
  for src_len, batches in by_length.items():
    indices = [i for batch in batches for i in batch]
    rows = math.ceil(len(indices) / len(batches))
    for start in range(0, len(indices), rows):
      yield indices[start:start + rows], rows, src_len


def attention_weights(model: Transformer, params, src_tokens: Array, target_input_tokens: Array) -> dict[str, Any]:
  """Every attention module's weights for one teacher-forced pass (for heat-maps).

  Returns:
    {module path: float32[batch, heads, q_len, k_len]}, e.g.
    "encoder_0/self_attention_block/...".
  """
  _, state = model.apply(
      {"params": params}, src_tokens, target_input_tokens, mutable=["intermediates"]
  )
  flat = jax.tree_util.tree_flatten_with_path(state["intermediates"])[0]
  return {
      "/".join(str(getattr(k, "key", k)) for k in path[:-2]): value
      for path, value in flat
  }
