"""Every experiment config loads, validates, documents its command, and sizes like the paper."""

from __future__ import annotations

import functools
import pathlib

from absl import flags
from ml_collections import config_flags
import pytest

from transformer_jax.configs import load_module, validate_config
from transformer_jax.errors import UserError
from transformer_jax.model.config import ModelConfig
from transformer_jax.model.info import abstract_params, parameter_counts
from transformer_jax.model.transformer import Transformer
from transformer_jax.tasks.translation import init_transformer

CONFIG_DIR = pathlib.Path(__file__).resolve().parents[1] / "experiments" / "configs"
CONFIG_FILES = sorted(CONFIG_DIR.glob("*.py"))


def load(path: pathlib.Path):
  return load_module(path, f"config_{path.stem}")


@pytest.fixture(scope="module")
def table3():
  return load(CONFIG_DIR / "table3.py")


@functools.cache
def _millions(model_items: tuple) -> float:
  init_params = functools.partial(init_transformer, Transformer(dict(model_items)))
  return parameter_counts(abstract_params(init_params))["total"] / 1e6


def millions(config) -> float:
  """Parameters of `config.model` at the paper's shared 37k vocabulary."""
  model = config.model.to_dict()
  model.update(vocab_size=37_000, dropout_rate=0.0)  # Dropout adds no parameters.
  return _millions(tuple(sorted(model.items())))


@pytest.mark.parametrize("path", CONFIG_FILES, ids=lambda p: p.name)
def test_config_loads_validates_and_documents_its_command(path):
  module = load(path)
  assert "python -m transformer_jax.train" in (module.__doc__ or ""), (
      f"{path.name}'s docstring must give the command that runs it")
  assert f"--config=experiments/configs/{path.name}" in module.__doc__, path.name
  if hasattr(module, "REQUIRES_ARGUMENT"):  # Validated where its argument is made.
    with pytest.raises(UserError, match="RUN_DIR"):
      module.get_config()
    return
  validate_config(module.get_config())


@pytest.mark.parametrize("scale", ["paper", "cpu"])
def test_every_table3_row_validates(table3, scale):
  for row in table3.ROWS:
    config = table3.get_config(f"{row},{scale}")
    validate_config(config)
    assert set(table3.PAPER) == set(table3.ROWS)
  cpu = table3.get_config("base,cpu")
  assert (cpu.data.dataset, cpu.model.d_model, cpu.model.num_layers) == ("multi30k", 128, 3)


@pytest.mark.parametrize("scale", ["paper", "cpu"])
def test_table3_rows_decode_as_the_paper_whatever_the_sibling_recipe_tunes(table3, scale):
  """§6.2: beam 4, α 0.6, no averaging; the cpu scale stays float32 like results/table3_cpu.

  The rows build on wmt14_base / multi30k, whose own decoding and precision may be tuned.
  """
  for row in table3.ROWS:
    config = table3.get_config(f"{row},{scale}")
    assert (config.beam_size, config.length_penalty, config.average_last_checkpoints) == (4, 0.6, 1)
    if scale == "cpu":
      assert config.model.matmul_dtype in ("", "float32")


def test_table3_cpu_base_is_the_papers_base_scaled_whatever_the_recipe_tunes(table3):
  """N 3, d_model 128, d_ff 512, h 8, d_k=d_v=16, P_drop 0.1, ε_ls 0.1, as results/table3_cpu ran.

  The cpu base builds on multi30k.py, whose shape, batch, schedule and label smoothing are
  tuned for BLEU; none of that may move the sweep's rows.
  """
  config = table3.get_config("base,cpu")
  model = ModelConfig.from_config(config.model)
  assert (model.num_encoder_layers, model.num_decoder_layers, model.d_model, model.d_ff,
          model.num_heads, model.d_k, model.d_v) == (3, 3, 128, 512, 8, 16, 16)
  assert (model.dropout_rate, model.attention_dropout_rate, model.relu_dropout_rate) == (
      0.1, 0.0, 0.0)
  assert config.label_smoothing == 0.1
  assert (config.data.tokens_per_batch, config.schedule, config.learning_rate,
          config.warmup_steps, config.num_train_steps) == (4_096, "linear_rsqrt", 2e-3, 100, 300)
  assert (config.train_minutes, config.cpu_devices) == (0.0, 0)


def test_config_flag_selects_a_table3_row():
  argv = ["prog", f"--config={CONFIG_DIR / 'table3.py'}:A1,cpu", "--config.num_train_steps=7"]
  flag_values = flags.FlagValues()
  config_flags.DEFINE_config_file("config", flag_values=flag_values, sys_argv=argv)
  flag_values(argv)
  config = flag_values.config
  assert (config.model.num_heads, config.model.d_k, config.model.d_v) == (1, 128, 128)
  assert config.num_train_steps == 7


def test_wmt14_configs_hold_the_papers_recipe():
  base = load(CONFIG_DIR / "wmt14_base.py").get_config()
  big = load(CONFIG_DIR / "wmt14_big.py").get_config()
  m = base.model
  assert (m.num_layers, m.d_model, m.d_ff, m.num_heads, m.d_k, m.d_v, m.dropout_rate) == (
      6, 512, 2048, 8, 64, 64, 0.1)
  assert (base.label_smoothing, base.warmup_steps, base.num_train_steps) == (0.1, 4000, 100_000)
  assert (base.data.dataset, base.data.vocab_size, base.data.tokens_per_batch) == (
      "wmt14", 37_000, 25_000)
  assert base.data.eval_split == "validation"  # TFDS wmt14_translate: newstest2013.
  assert (base.checkpoint_every_minutes, base.average_last_checkpoints) == (10.0, 5)
  assert (base.beam_size, base.length_penalty, base.max_decode_extra_len) == (4, 0.6, 50)
  assert (big.model.d_model, big.model.d_ff, big.model.num_heads, big.model.dropout_rate) == (
      1024, 4096, 16, 0.3)
  assert (big.num_train_steps, big.average_last_checkpoints) == (300_000, 20)
  assert big.keep_checkpoints >= 20, "averaging the last 20 needs 20 kept checkpoints"


def test_table3_parameter_counts_match_the_paper(table3):
  base = millions(table3.get_config("base"))
  for row, (_, _, paper) in table3.PAPER.items():
    ours = millions(table3.get_config(row))
    expected = paper if paper is not None else 65  # Unlisted rows: the base's size.
    assert abs(ours - expected) / expected < 0.08, (
        f"Table 3 row {row}: {ours:.1f}M parameters at a 37k vocabulary, the paper "
        f"reports {expected}M")
  assert 60 < base < 66


def test_learned_positions_must_cover_the_longest_row():
  """Past the table, jnp.take gives NaN rows: a config that would get there is refused."""
  from transformer_jax.configs import default_config

  config = default_config()
  config.model.update(dict(positions="learned", max_len=32))
  config.data.max_len = 32
  validate_config(config)
  config.task = "prefix_lm"  # Source and target share one row: 64 positions.
  with pytest.raises(UserError, match=r"max_len=32 learned positions cannot cover rows of 64 "
                                      r"tokens \(source and target in one row\)"):
    validate_config(config)
  config.task, config.model.max_len = "translation", 8
  with pytest.raises(UserError, match="raise config.model.max_len to 32"):
    validate_config(config)


def test_a_learned_position_model_refuses_a_longer_row():
  import jax
  import jax.numpy as jnp

  from transformer_jax.model.positions import PositionalEncoding

  encoding = PositionalEncoding("learned", 8, max_len=4)
  with pytest.raises(ValueError, match="5 positions exceed the 4 learned ones"):
    encoding.init(jax.random.key(0), jnp.zeros((1, 5, 8)), jnp.arange(5)[None])
