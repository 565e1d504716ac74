"""Incremental decoding with the KV cache, and the Translator on any batch size."""

import functools

import flax
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from transformer_jax.decode import cache as kv_cache
from transformer_jax.decode import translator
from transformer_jax import sharding
from transformer_jax.model.transformer import Transformer, shift_right
from transformer_jax.special_tokens import EOS_ID

SRC = jnp.array([[5, 6, 7, 8, 9, EOS_ID], [10, 11, 12, EOS_ID, 0, 0]])


@pytest.fixture(scope="module")
def model_and_params():
  from transformer_jax.model.config import default_model_config

  config = default_model_config()
  config.update(dict(vocab_size=64, num_layers=2, d_model=32, d_ff=64, num_heads=4, max_len=64))
  model = Transformer(config)
  params = jax.jit(model.init)(jax.random.key(0), SRC, SRC)["params"]
  return model, params


def test_cached_decoding_equals_full_recomputation(model_and_params, step_by_step_logits):
  model, params = model_and_params
  targets = jnp.array([[20, 21, 22, 23, EOS_ID], [24, 25, 26, EOS_ID, 0]])
  inputs = shift_right(targets)
  full = jax.jit(model.apply)({"params": params}, SRC, inputs)
  incremental = jax.jit(lambda params: step_by_step_logits(model, params, SRC, inputs))

  valid = np.asarray(targets != 0)  # PAD positions have no defined next token.
  np.testing.assert_allclose(
      np.asarray(incremental(params))[valid], np.asarray(full)[valid], atol=1e-5, rtol=1e-5
  )


@pytest.mark.parametrize("matmul_dtype", ["float32", "bfloat16"])
def test_beams_sharing_one_cross_attention_cache_equal_beams_with_their_own_copy(
    model_and_params, matmul_dtype, monkeypatch):
  """decode_batch keeps one cross-attention K/V row per sentence for all its beams, and
  its self-attention cache in the matmul operand dtype (cache.stored_as): the same beams
  as a cache kept the way greedy search keeps it."""
  import dataclasses

  from transformer_jax.decode import search

  model, params = model_and_params
  model = model.clone(config=dataclasses.replace(model.config, matmul_dtype=matmul_dtype))
  options = translator.DecodeOptions(beam_size=3, alpha=0.6)
  max_len = 12
  searched_caches = []
  beam_search = search.beam_search

  def recording_beam_search(step_model, *args, **kwargs):
    searched_caches.append(step_model.cache)
    return beam_search(step_model, *args, **kwargs)

  monkeypatch.setattr(search, "beam_search", recording_beam_search)
  shared = jax.jit(lambda p: translator.decode_batch(model, p, SRC, options, max_len))(params)
  monkeypatch.setattr(search, "beam_search", beam_search)
  stored = {leaf.dtype for path, leaf in flax.traverse_util.flatten_dict(searched_caches[0]).items()
            if path[-1] in ("cached_key", "cached_value")}
  assert stored == {jnp.dtype(matmul_dtype)}, stored

  @jax.jit
  def own_copies(params):
    encoded = model.apply({"params": params}, SRC, method=Transformer.encode)
    cache = kv_cache.init_cache(model, params, encoded, SRC, max_len)  # Repeated per beam below.
    step = kv_cache.step_logits(model, params, search.expand_to_beams(SRC, options.beam_size))
    max_lengths = jnp.minimum(jnp.sum(SRC != 0, -1) + options.max_extra_len, max_len)
    sequences, _ = search.beam_search(search.StepModel(step, cache), options.spec(), max_lengths,
                                      max_len)
    return sequences[:, 0]

  np.testing.assert_array_equal(np.asarray(shared), np.asarray(own_copies(params)))


def test_stored_as_changes_only_the_self_attention_entries():
  cache = {"decoder_0": {
      "self": {"cached_key": jnp.ones((2, 1, 4, 3)), "cache_index": jnp.int32(1)},
      "cross": {"cross_key": jnp.ones((2, 1, 5, 3))}}}
  stored = kv_cache.stored_as(cache, jnp.bfloat16)
  assert stored["decoder_0"]["self"]["cached_key"].dtype == jnp.bfloat16
  assert stored["decoder_0"]["self"]["cache_index"].dtype == jnp.int32
  assert stored["decoder_0"]["cross"]["cross_key"].dtype == jnp.float32


@pytest.mark.parametrize("method", ["beam", "greedy", "sample"])
@pytest.mark.parametrize("ignore_eos", [False, True])
def test_growing_cache_decodes_what_the_full_length_cache_decodes(model_and_params, method,
                                                                  ignore_eos):
  """50 steps run as loops over caches of 16, 32 and 50 positions: the same tokens."""
  model, params = model_and_params
  outputs = {}
  for growing in (False, True):
    options = translator.DecodeOptions(method=method, beam_size=3, alpha=0.6, max_extra_len=44,
                                   ignore_eos=ignore_eos, growing_cache=growing)
    outputs[growing] = np.asarray(jax.jit(
        lambda p: translator.decode_batch(model, p, SRC, options, 50, jax.random.key(3)))(params))
  np.testing.assert_array_equal(outputs[True], outputs[False])
  # Last non-PAD position + 1 (sampling may also draw PAD before it).
  lengths = 50 - np.argmax(outputs[True][:, ::-1] != 0, axis=-1)
  if ignore_eos:  # Every row ran past the first two cache lengths.
    assert (lengths == (SRC != 0).sum(-1) + 44).all() and lengths.min() > 32


@pytest.mark.parametrize("family", ["encoder_decoder", "prefix_lm"])
@pytest.mark.parametrize("method", ["beam", "greedy"])
def test_a_shrinking_batch_decodes_what_the_full_batch_decodes(tiny_model_config, family, method):
  """Nine sentences of 2 to 10 tokens stop at different steps, past the growing cache's
  first lengths (16, 32); decoded on in batches of 5, 3 and 2, they come out as in one
  batch of 9."""
  from transformer_jax.model.decoder_only import DecoderOnly

  rng = np.random.default_rng(0)
  src = np.zeros((9, 10), np.int32)
  for row, length in enumerate(rng.permutation(np.arange(2, 11))):
    src[row, :length - 1] = rng.integers(4, 64, size=length - 1)
    src[row, length - 1] = EOS_ID
  model = (Transformer if family == "encoder_decoder" else DecoderOnly)(tiny_model_config)
  params = jax.jit(model.init)(jax.random.key(1), *(
      (src, src) if family == "encoder_decoder" else (src,)))["params"]
  outputs = {}
  for shrink in (False, True):
    options = translator.DecodeOptions(method=method, beam_size=3, alpha=0.6, max_extra_len=40,
                                       min_length=0, shrink_batch=shrink, growing_cache=True)
    outputs[shrink] = np.asarray(jax.jit(
        lambda p: translator.decode_batch(model, p, jnp.asarray(src), options, 50))(params))
  np.testing.assert_array_equal(outputs[True], outputs[False])
  lengths = (outputs[False] != 0).sum(-1)
  assert len(set(lengths.tolist())) >= 4, lengths  # The sentences did stop at different steps,
  assert lengths.max() > 32, lengths  # some in the cache's third length.


def test_growing_cache_is_on_by_default_for_beam_search_only():
  assert translator.DecodeOptions().grows_cache
  assert not translator.DecodeOptions(method="greedy").grows_cache
  assert not translator.DecodeOptions(method="sample").grows_cache
  assert not translator.DecodeOptions(growing_cache=False).grows_cache
  assert translator.DecodeOptions(method="greedy", growing_cache=True).grows_cache


def test_sampling_refuses_a_shrinking_batch():
  from transformer_jax.errors import UserError

  with pytest.raises(UserError, match="sampling keeps its batch"):
    translator.DecodeOptions(method="sample", shrink_batch=True)


def _nine_sentences() -> np.ndarray:
  """Nine sources of 2 to 10 tokens (EOS-terminated), so their searches stop at different steps."""
  rng = np.random.default_rng(0)
  src = np.zeros((9, 10), np.int32)
  for row, length in enumerate(rng.permutation(np.arange(2, 11))):
    src[row, :length - 1] = rng.integers(4, 64, size=length - 1)
    src[row, length - 1] = EOS_ID
  return src


@pytest.mark.parametrize("matmul_dtype,attention_impl,growing,shrink", [
    ("float32", "plain", False, False), ("float32", "plain", True, True),
    ("bfloat16", "plain", True, False), ("float32", "chunked", True, False)])
def test_beams_sharing_one_self_attention_cache_find_the_beams_of_reordered_caches(
    tiny_model_config, matmul_dtype, attention_impl, growing, shrink):
  """A shared beam cache (one row a sentence, a slot a beam, masks that follow each beam's
  parents) decodes the tokens of caches reordered every step: over one cache or a growing
  one, a shrinking batch, bf16 operands, chunked attention over several blocks of slots."""
  import dataclasses

  src = jnp.asarray(_nine_sentences())
  model = Transformer(tiny_model_config)
  model = model.clone(config=dataclasses.replace(
      model.config, matmul_dtype=matmul_dtype, attention_impl=attention_impl,
      attention_block_size=16))
  # Doubled weights: peaked distributions, so beams diverge and cross over.
  params = jax.tree.map(lambda w: 2 * w, jax.jit(model.init)(jax.random.key(1), src, src)["params"])
  outputs = {}
  for shared in (False, True):
    options = translator.DecodeOptions(beam_size=4, alpha=0.6, max_extra_len=40, min_length=0,
                                       growing_cache=growing, shrink_batch=shrink,
                                       shared_beam_cache=shared)
    outputs[shared] = np.asarray(jax.jit(
        lambda p: translator.decode_batch(model, p, src, options, 50))(params))
  np.testing.assert_array_equal(outputs[True], outputs[False])
  lengths = (outputs[False] != 0).sum(-1)
  assert len(set(lengths.tolist())) >= 4 and lengths.max() > 32, lengths


def test_a_shared_beam_cache_keeps_every_beam_and_its_score(model_and_params):
  """All beams and their scores, 40 steps over caches of 16, 32 and 40 positions: equal to
  the reordering search's (scores to float rounding: the attention sums in another order).
  The best beams' histories came from other beams' slots, so a mask that ignored the
  parents would differ."""
  from transformer_jax.decode import search

  model, params = model_and_params

  @functools.partial(jax.jit, static_argnums=1)
  def beams(params, shared):
    encoded = model.apply({"params": params}, SRC, method=Transformer.encode)
    cache, sentence_cache = kv_cache.split_cache(
        kv_cache.init_cache(model, params, encoded, SRC, 16))
    step = kv_cache.sentence_step_logits(model, params)
    return search.beam_search(
        search.StepModel(step, cache, (SRC, sentence_cache), kv_cache.grow_cache),
        search.SearchSpec(beam_size=4, alpha=0.6, eos_id=search.NO_EOS),
        search.full_lengths(SRC.shape[0], 40), 40,
        search.SearchPlan(cache_lengths=(16, 32, 40), shared_cache=shared))

  shared, reordered = beams(params, True), beams(params, False)
  np.testing.assert_array_equal(np.asarray(shared[0]), np.asarray(reordered[0]))
  np.testing.assert_allclose(np.asarray(shared[1]), np.asarray(reordered[1]), rtol=1e-5)
  # Different beams at the end share early tokens and part later: parents were changed.
  sequences = np.asarray(shared[0])
  assert ((sequences[:, 0, :5] == sequences[:, 1, :5]).all(-1)
          & (sequences[:, 0] != sequences[:, 1]).any(-1)).any()


def test_shared_beam_mask_follows_each_beams_slots():
  """Position p of beam q is read from slot beam_slots[q, p], up to the step's position."""
  beam_slots = jnp.array([[[0, 1, 1, 0], [0, 0, 1, 1]]])  # [batch 1, beam 2, 4 positions]
  mask = np.asarray(kv_cache.shared_beam_mask(beam_slots, jnp.int32(2), 8).explicit)
  assert mask.shape == (1, 1, 2, 8)
  # Slot p·2 + s: beam 0 reads (p0 s0), (p1 s1), (p2 s1); beam 1 (p0 s0), (p1 s0), (p2 s1).
  np.testing.assert_array_equal(mask[0, 0, 0], [1, 0, 0, 1, 0, 1, 0, 0])
  np.testing.assert_array_equal(mask[0, 0, 1], [1, 0, 1, 0, 0, 1, 0, 0])


def test_a_prefix_lm_refuses_a_shared_beam_cache(tiny_model_config):
  from transformer_jax.decode.ensemble import Ensemble
  from transformer_jax.errors import UserError
  from transformer_jax.model.decoder_only import DecoderOnly

  options = translator.DecodeOptions(shared_beam_cache=True)
  assert translator.shares_beam_cache(Transformer(tiny_model_config), options)
  with pytest.raises(UserError, match="encoder-decoder"):
    translator.shares_beam_cache(
        Ensemble((Transformer(tiny_model_config), DecoderOnly(tiny_model_config))), options)
  default = translator.DecodeOptions()
  assert translator.shares_beam_cache(Transformer(tiny_model_config), default)
  assert not translator.shares_beam_cache(DecoderOnly(tiny_model_config), default)
  assert not translator.shares_beam_cache(Transformer(tiny_model_config),
                                          translator.DecodeOptions(method="greedy"))


def test_a_decoding_mask_without_decoding_is_an_error(model_and_params):
  from transformer_jax.model.masking import AttentionMask

  model, params = model_and_params
  with pytest.raises(ValueError, match="decode=True"):
    model.apply({"params": params}, None, SRC, SRC, method=Transformer.decode,
                decode_self_mask=AttentionMask.from_dense(jnp.ones((2, 1, 6, 6), bool)))


def test_growing_cache_keeps_beam_scores(model_and_params):
  """Beam scores (log P / lp) of every beam, not only the best tokens, are the same."""
  from transformer_jax.decode import search

  model, params = model_and_params

  @functools.partial(jax.jit, static_argnums=1)
  def beams(params, grow):
    encoded = model.apply({"params": params}, SRC, method=Transformer.encode)
    lengths = (16, 32, 40) if grow else ()
    cache = kv_cache.init_cache(model, params, encoded, SRC, lengths[0] if grow else 40)
    per_row, per_sentence = kv_cache.split_cache(cache)
    step = kv_cache.step_logits(model, params, SRC, per_sentence)
    return search.beam_search(
        search.StepModel(step, per_row, grow_cache=kv_cache.grow_cache if grow else None),
        search.SearchSpec(beam_size=3, alpha=0.6, eos_id=search.NO_EOS),
        search.full_lengths(SRC.shape[0], 40), 40, search.SearchPlan(cache_lengths=lengths))

  grown, full = beams(params, True), beams(params, False)
  np.testing.assert_array_equal(np.asarray(grown[0]), np.asarray(full[0]))
  np.testing.assert_allclose(np.asarray(grown[1]), np.asarray(full[1]), rtol=1e-6)


def test_growing_cache_lengths_double_up_to_the_maximum():
  from transformer_jax.decode import search

  assert search.doubling_lengths(40) == (16, 40)  # 32 is within 1.5x of 40: one loop less.
  assert search.doubling_lengths(66) == (16, 32, 66)
  assert search.doubling_lengths(100) == (16, 32, 64, 100)
  assert search.doubling_lengths(24) == (16, 24)  # The first length always stays.
  assert search.doubling_lengths(16) == (16,)
  assert search.doubling_lengths(10) == (10,)
  assert search.doubling_lengths(100, first=8) == (8, 16, 32, 64, 100)
  step = lambda tokens, cache, t: (jnp.zeros((tokens.shape[0], 5)), cache)
  with pytest.raises(ValueError, match="must increase from >= 1 to max_decode_len=8"):
    search.greedy_search(search.StepModel(step, {}, grow_cache=lambda c, n: c),
                         search.SearchSpec(method="greedy"), search.full_lengths(2, 8), 8,
                         search.SearchPlan(cache_lengths=(4, 6)))


@pytest.mark.parametrize("method", ["beam", "greedy"])
def test_translator_handles_batches_the_device_count_does_not_divide(model_and_params, method):
  model, params = model_and_params
  mesh = sharding.make_mesh(dict(data=-1, fsdp=1, tensor=1))
  decoder = translator.Translator(model, params, mesh, translator.DecodeOptions(method=method))
  src = np.asarray(jnp.concatenate([SRC, SRC[:1]], axis=0))  # 3 rows on 8 devices.
  out = decoder(src)
  assert out.shape == (3, src.shape[1] + 50)
  np.testing.assert_array_equal(out[0], out[2])  # Same sentence, same translation.
  lengths = (out != 0).sum(-1)
  assert (lengths <= (src != 0).sum(-1) + 50).all()


def test_a_new_translator_of_the_same_model_compiles_nothing(model_and_params):
  """Reloaded or averaged checkpoints (new params, same architecture) reuse the compiled
  search: only a new architecture, option or mesh traces again."""
  model, params = model_and_params
  mesh = sharding.make_mesh(dict(data=-1, fsdp=1, tensor=1))
  options = translator.DecodeOptions(method="greedy")
  first = translator.Translator(model, params, mesh, options)
  src = np.asarray(SRC)
  out = first(src)
  compiled = translator._jitted_decode.cache_info().currsize
  executables = first._function(src.shape[1])._cache_size()  # Compiled shapes so far.
  shifted = jax.tree.map(lambda p: p * 0.5, params)
  again = translator.Translator(Transformer(model.config), shifted, mesh, options)
  assert again._function(src.shape[1]) is first._function(src.shape[1])
  again(src)
  assert translator._jitted_decode.cache_info().currsize == compiled
  assert again._function(src.shape[1])._cache_size() == executables  # Nothing compiled.
  want = translator.decode_batch(model, shifted, SRC, options, src.shape[1] + 50)
  np.testing.assert_array_equal(again(src), np.asarray(want))  # Its own params, not first's.
  np.testing.assert_array_equal(first(src), out)
  beam = translator.Translator(model, params, mesh, translator.DecodeOptions(method="beam"))
  assert beam._function(src.shape[1]) is not first._function(src.shape[1])


def test_beam_search_at_another_alpha_compiles_nothing(model_and_params):
  """α is an argument of the compiled search (report_run's grid compiles each beam size
  once), and each α still decodes as its own search does."""
  model, params = model_and_params
  mesh = sharding.make_mesh(dict(data=-1, fsdp=1, tensor=1))
  src = np.asarray(SRC)
  at_06 = translator.Translator(model, params, mesh, translator.DecodeOptions(alpha=0.6))
  at_06(src)
  function = at_06._function(src.shape[1])
  executables = function._cache_size()
  for alpha in (0.0, 1.5):  # That α changes the search: test_search's length-penalty test.
    options = translator.DecodeOptions(alpha=alpha)
    other = translator.Translator(model, params, mesh, options)
    assert other._function(src.shape[1]) is function
    want = translator.decode_batch(model, params, SRC, options, src.shape[1] + 50)
    np.testing.assert_array_equal(other(src), np.asarray(want))
  assert function._cache_size() == executables  # Nothing compiled.


def test_bad_decode_options_are_one_line_errors():
  from transformer_jax.errors import UserError

  with pytest.raises(UserError, match="beam_size=0"):
    translator.DecodeOptions(beam_size=0)
  with pytest.raises(UserError, match="alpha=-1"):
    translator.DecodeOptions(alpha=-1)
  with pytest.raises(UserError, match="--quantize='int4' is not a quantization"):
    translator.DecodeOptions(quantize="int4")
  with pytest.raises(UserError, match="stop_rule='never' is not one of exact, best_finished"):
    translator.DecodeOptions(stop_rule="never")
  with pytest.raises(UserError, match="--matmul_dtype='float16' is not one of auto, float32"):
    translator.DecodeOptions(matmul_dtype="float16")


@pytest.mark.parametrize("method", ["beam", "greedy"])
def test_int8_translator_decodes_the_int8_model(model_and_params, method):
  """--quantize=int8: the Translator runs the model with int8 weight matmuls, and its
  cached search decodes what the int8 model's own full recomputation prefers."""
  model, params = model_and_params
  mesh = sharding.make_mesh(dict(data=-1, fsdp=1, tensor=1))
  options = translator.DecodeOptions(method=method, quantize="int8")
  decoder = translator.Translator(model, params, mesh, options)
  assert decoder.model.config.quantize == "int8" and model.config.quantize == ""
  out = decoder(np.asarray(SRC))
  assert "xi8>" in decoder.lower(np.asarray(SRC)).as_text()  # int8 operands in the search.
  want = translator.decode_batch(model, params, SRC, options, SRC.shape[1] + 50)  # Float model in.
  np.testing.assert_array_equal(out, np.asarray(want))
  if method == "greedy":  # Each greedy token is the int8 model's argmax given the prefix.
    inputs = shift_right(jnp.asarray(out[:, :8]))
    logits = decoder.model.apply({"params": params}, SRC, inputs)
    np.testing.assert_array_equal(np.asarray(jnp.argmax(logits, -1))[out[:, :8] != 0],
                                  out[:, :8][out[:, :8] != 0])


def test_matmul_dtype_decodes_with_the_operands_asked_for(model_and_params):
  """--matmul_dtype: a model trained with bfloat16 operands decodes in float32 (and back),
  the same tokens as a model configured that way from the start; the params are untouched."""
  import dataclasses

  model, params = model_and_params
  mesh = sharding.make_mesh(dict(data=-1, fsdp=1, tensor=1))
  bf16 = model.clone(config=dataclasses.replace(model.config, matmul_dtype="bfloat16"))
  for trained, asked, want_model in ((bf16, "float32", model), (model, "bfloat16", bf16)):
    options = translator.DecodeOptions(method="greedy", matmul_dtype=asked)
    decoder = translator.Translator(trained, params, mesh, options)
    assert decoder.model.config.matmul_dtype == asked, decoder.model.config
    assert ("bf16>" in decoder.lower(np.asarray(SRC)).as_text()) == (asked == "bfloat16")
    plain = translator.DecodeOptions(method="greedy")
    np.testing.assert_array_equal(
        decoder(np.asarray(SRC)),
        np.asarray(translator.Translator(want_model, params, mesh, plain)(np.asarray(SRC))))
  assert translator.for_decoding(bf16, translator.DecodeOptions()) is bf16  # "": as trained.
  from transformer_jax.errors import UserError

  cudnn = model.clone(config=dataclasses.replace(model.config, matmul_dtype="bfloat16",
                                                 attention_impl="cudnn", dropout_rate=0.0,
                                                 attention_dropout_rate=0.0))
  with pytest.raises(UserError, match="^--matmul_dtype=float32: not for this run, as "
                                      "config.model.attention_impl='cudnn' takes bfloat16"):
    translator.for_decoding(cudnn, translator.DecodeOptions(matmul_dtype="float32"))


def test_attention_weights_cover_every_module(model_and_params):
  model, params = model_and_params
  weights = translator.attention_weights(model, params, SRC, shift_right(SRC))
  names = sorted(weights)
  assert any("encoder_0" in n and "self_attention" in n for n in names), names
  assert any("decoder_1" in n and "cross_attention" in n for n in names), names
  cross = next(v for n, v in weights.items() if "decoder_0" in n and "cross" in n)
  assert cross.shape == (2, 4, 6, 6)
  np.testing.assert_allclose(cross.sum(-1), 1.0, atol=1e-5)


def test_translate_texts_batches_1024_source_tokens_on_a_cpu_by_default():
  """Unset, the token budget of a decoding batch is the CPU's (default_tokens_per_batch)."""
  batch_shapes = []

  def record(src_tokens):  # Stands in for a Translator.
    batch_shapes.append(src_tokens.shape)
    return np.full((src_tokens.shape[0], 1), EOS_ID, np.int32)

  class WordTokenizer:
    def encode(self, text):
      return [5] * len(text.split()) + [EOS_ID]

    def decode(self, ids):
      return ""

  if jax.default_backend() != "cpu":
    pytest.skip("the CPU default; this backend is not a CPU")
  assert translator.default_tokens_per_batch() == translator.CPU_TOKENS_PER_BATCH == 1024
  sentences = ["word " * 15] * 200  # 16 tokens each, EOS included.
  translator.translate_texts(record, WordTokenizer(), sentences, max_source_len=64)
  assert batch_shapes == [(50, 16)] * 4  # 200 in 4 batches of at most 64: one shape.
  batch_shapes.clear()
  translator.translate_texts(record, WordTokenizer(), sentences, max_source_len=64,
                             tokens_per_batch=4096)
  assert batch_shapes == [(200, 16)]
