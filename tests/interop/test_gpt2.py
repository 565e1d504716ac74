"""GPT-2 import: the imported model computes what Hugging Face's GPT2LMHeadModel computes.

A small GPT2LMHeadModel with random weights and a byte-level BPE trained here (no
download) is saved with `save_pretrained`, imported, and compared with PyTorch: the
tokenizer's ids, the logits of a padded batch, greedy continuations of `generate()`, and
the distributions its sampling draws from.
"""

from __future__ import annotations

import json
import random
import re

import jax
import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the GPT-2 tests need torch and transformers "
                            "(pip install -e '.[test]')")
transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

from transformer_jax.data.generated import sample_pair  # noqa: E402
from transformer_jax.data.tokenizer import load_tokenizer  # noqa: E402
from transformer_jax.decode.generate import generate  # noqa: E402
from transformer_jax.errors import UserError  # noqa: E402
from transformer_jax.interop import gpt2  # noqa: E402
from transformer_jax.special_tokens import BOS_ID, EOS_ID, PAD_ID  # noqa: E402
from transformer_jax.tasks.registry import load_run  # noqa: E402

REPO = str(__import__("pathlib").Path(__file__).resolve().parents[2])
TEXTS = [de for _, de in (sample_pair(random.Random(i)) for i in range(800))]
PROMPTS = ["Der Hund sieht die Katze.", "Zwei große Vögel", "Zebras ☃ wandern — naïve café",
           "  spaces\tand\nnewlines "]
EOT = "<|endoftext|>"


@pytest.fixture(scope="module")
def gpt2_dir(tmp_path_factory):
  """A save_pretrained folder: random GPT-2 weights and a byte-level BPE whose <|endoftext|>
  is its last id, as GPT-2's is."""
  folder = tmp_path_factory.mktemp("gpt2")
  bpe = tokenizers.ByteLevelBPETokenizer()
  bpe.train_from_iterator(TEXTS, vocab_size=400, min_frequency=2, show_progress=False)
  bpe.add_special_tokens([EOT])
  bpe.save(str(folder / "tokenizer.json"))
  vocab_size = bpe.get_vocab_size()
  eot = bpe.token_to_id(EOT)
  assert eot == vocab_size - 1
  config = transformers.GPT2Config(vocab_size=vocab_size, n_positions=256, n_embd=32, n_layer=2,
                                   n_head=4, bos_token_id=eot, eos_token_id=eot)
  torch.manual_seed(0)
  model = transformers.GPT2LMHeadModel(config).eval()
  with torch.no_grad():  # Larger biases and norms than the initialisation's, so they count.
    for name, parameter in model.named_parameters():
      if name.endswith("bias") or "ln_" in name:
        parameter.add_(0.1 * torch.randn_like(parameter))
  model.save_pretrained(folder)
  return folder


@pytest.fixture(scope="module")
def hf(gpt2_dir):
  model = transformers.GPT2LMHeadModel.from_pretrained(gpt2_dir).eval()
  tokenizer = transformers.PreTrainedTokenizerFast(tokenizer_file=str(gpt2_dir / "tokenizer.json"))
  return model, tokenizer


@pytest.fixture(scope="module")
def imported(gpt2_dir, tmp_path_factory):
  workdir = tmp_path_factory.mktemp("run") / "gpt2"
  report = gpt2.import_gpt2(str(gpt2_dir), str(workdir))
  return report, load_run(str(workdir), expected_task="causal_lm")


def multi30k_lines(data_dir, name: str, count: int = 300) -> list[str]:
  with open(data_dir / "multi30k" / name, encoding="utf-8") as f:
    return [line.rstrip("\n") for _, line in zip(range(count), f)]


def test_the_tokenizer_gives_transformers_ids_in_our_numbering(hf, imported, data_dir):
  _, tokenizer = hf
  report, run = imported
  ours_of_theirs = {int(theirs): ours for ours, theirs in enumerate(report.their_ids)
                    if ours >= 4}
  for text in PROMPTS + TEXTS[:50] + multi30k_lines(data_dir, "val.de"):
    theirs = tokenizer(text)["input_ids"]
    ours = run.tokenizer.encode(text)
    assert ours[-1] == EOS_ID
    assert ours[:-1] == [ours_of_theirs[t] for t in theirs], text
    assert run.tokenizer.decode(ours) == tokenizer.decode(theirs) == text


def _padded(run, prompts):
  encoded = [[BOS_ID] + run.tokenizer.encode(p)[:-1] for p in prompts]
  width = max(map(len, encoded))
  tokens = np.full((len(prompts), width), PAD_ID, np.int32)
  for row, ids in enumerate(encoded):
    tokens[row, :len(ids)] = ids
  return tokens, [len(ids) for ids in encoded]


def test_logits_of_a_padded_batch_equal_pytorch(hf, imported):
  model, _ = hf
  report, run = imported
  tokens, lengths = _padded(run, PROMPTS)
  ours = np.asarray(run.model.apply({"params": run.params}, tokens))
  theirs_ids = np.where(tokens == PAD_ID, 0, report.their_ids[tokens])
  attention_mask = (tokens != PAD_ID).astype(np.int64)
  with torch.no_grad():
    theirs = model(torch.tensor(theirs_ids), attention_mask=torch.tensor(attention_mask)).logits
  theirs = theirs.numpy()
  columns = np.arange(4, len(report.their_ids))
  for row, length in enumerate(lengths):
    np.testing.assert_allclose(ours[row, :length][:, columns],
                               theirs[row, :length][:, report.their_ids[columns]],
                               rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(ours[row, :length, EOS_ID],
                               theirs[row, :length, report.their_ids[EOS_ID]], rtol=1e-4, atol=1e-4)
  assert np.all(ours[:, :, PAD_ID] < -1e8) and np.all(ours[:, :, 1] < -1e8)  # Never predicted.


def test_greedy_continuations_equal_generate(hf, imported):
  model, _ = hf
  report, run = imported
  prompts = PROMPTS[:3]
  encoded = [run.tokenizer.encode(p)[:-1] for p in prompts]
  width = max(map(len, encoded))
  prompt_tokens = np.full((len(prompts), width), PAD_ID, np.int32)
  for row, ids in enumerate(encoded):
    prompt_tokens[row, :len(ids)] = ids
  new = 12
  out = np.asarray(generate(run.model, run.params, prompt_tokens,
                            np.array([len(ids) for ids in encoded]), new, jax.random.key(0),
                            temperature=0.0))
  for row, ids in enumerate(encoded):
    ours = out[row, 1 + len(ids):]
    theirs_prompt = [int(report.their_ids[BOS_ID])] + [int(report.their_ids[i]) for i in ids]
    with torch.no_grad():
      theirs = model.generate(torch.tensor([theirs_prompt]), max_new_tokens=new, do_sample=False,
                              pad_token_id=int(report.their_ids[EOS_ID]))[0, len(theirs_prompt):]
    theirs = theirs.numpy()
    stop = next((i for i, t in enumerate(ours) if t in (EOS_ID, PAD_ID)), len(ours))
    assert [int(report.their_ids[t]) for t in ours[:stop]] == theirs[:stop].tolist()
    if stop < len(theirs):  # Ours stopped at EOS: so did theirs (generate's last token).
      assert ours[stop] == EOS_ID and theirs[stop] == report.their_ids[EOS_ID]


def test_sampled_continuations_draw_from_the_distributions_generate_draws_from(hf, imported):
  """PyTorch's and JAX's random streams differ, so sampled tokens cannot be compared one for
  one. What can: at every step of our sampled continuation, the distribution we drew from
  (temperature, then top-k, then top-p) equals the one `generate(do_sample=True)` draws
  from, its logits warped by transformers' own warpers in generate's order."""
  from transformers.generation.logits_process import (TemperatureLogitsWarper,
                                                      TopKLogitsWarper, TopPLogitsWarper)

  from transformer_jax.decode.search import filter_logits

  model, _ = hf
  report, run = imported
  temperature, top_k, top_p, new = 0.7, 8, 0.9, 16
  warpers = [TemperatureLogitsWarper(temperature), TopKLogitsWarper(top_k),
             TopPLogitsWarper(top_p)]
  ids = run.tokenizer.encode(PROMPTS[0])[:-1]
  out = np.asarray(generate(run.model, run.params, np.array([ids], np.int32),
                            np.array([len(ids)]), new, jax.random.key(3), temperature=temperature,
                            top_k=top_k, top_p=top_p))[0]
  stop = next((i for i, t in enumerate(out[1 + len(ids):]) if t in (EOS_ID, PAD_ID)), new)
  sequence = out[:1 + len(ids) + stop]  # BOS, the prompt and the sampled tokens before EOS.
  assert stop > 4, f"too short a continuation to compare: {sequence}"
  steps = range(len(ids), len(sequence))  # Position t predicts token t + 1.

  ours = np.asarray(run.model.apply({"params": run.params}, sequence[None]))[0]
  ours = np.asarray(jax.nn.softmax(filter_logits(ours[list(steps)], temperature, top_k, top_p)))
  theirs_ids = torch.tensor(np.asarray(report.their_ids[sequence])[None])
  with torch.no_grad():
    logits = model(theirs_ids).logits[0]
  theirs = []
  for t in steps:
    warped = logits[t:t + 1]
    for warper in warpers:
      warped = warper(theirs_ids[:, :t + 1], warped)
    theirs.append(torch.softmax(warped, dim=-1)[0].numpy())
  theirs = np.stack(theirs)
  columns = np.concatenate([[EOS_ID], np.arange(4, len(report.their_ids))])
  np.testing.assert_allclose(ours[:, columns], theirs[:, report.their_ids[columns]], atol=1e-5)
  assert np.all(ours[:, [PAD_ID, 1]] == 0)  # Ids with no GPT-2 token are never drawn.
  kept = (theirs > 0).sum(-1)
  assert np.all((1 <= kept) & (kept <= top_k)) and np.any(kept > 1), kept  # Sampling, not greedy.
  drawn = sequence[1 + len(ids):]
  assert np.all(theirs[np.arange(len(drawn)), report.their_ids[drawn]] > 0)  # Each drawn token
  # is one generate could have drawn.


def test_the_run_directory_is_a_causal_lm_run(imported):
  report, run = imported
  assert run.config.task == "causal_lm" and run.step == 0
  assert run.model.config.vocab_size == len(report.their_ids) == run.tokenizer.vocab_size
  assert load_tokenizer(f"{report.workdir}/tokenizer.model").sha256 == run.tokenizer.sha256


@pytest.mark.parametrize("field, value, message", [
    ("model_type", "bert", "is not a GPT-2 (GPT2LMHeadModel) model"),
    ("activation_function", "relu", "activation_function='relu' is not supported"),
    ("scale_attn_by_inverse_layer_idx", True, "scale_attn_by_inverse_layer_idx=True"),
])
def test_an_unsupported_config_is_a_one_line_refusal_that_writes_nothing(
    gpt2_dir, tmp_path, field, value, message):
  changed = tmp_path / "changed"
  changed.mkdir()
  for file in gpt2_dir.iterdir():
    (changed / file.name).write_bytes(file.read_bytes())
  config = json.loads((changed / "config.json").read_text())
  config[field] = value
  (changed / "config.json").write_text(json.dumps(config))
  with pytest.raises(UserError, match=re.escape(message)) as error:
    gpt2.import_gpt2(str(changed), str(tmp_path / "run"))
  assert "\n" not in str(error.value)
  assert not (tmp_path / "run").exists()


def test_import_hf_names_the_model_types_it_reads(tmp_path):
  from transformer_jax.cli.import_hf import model_type

  (tmp_path / "config.json").write_text(json.dumps(dict(model_type="t5")))
  with pytest.raises(UserError, match="model_type='t5'; supported: gpt2, bert, marian"):
    model_type(str(tmp_path))
  with pytest.raises(UserError, match="does not exist"):
    model_type(str(tmp_path / "nowhere"))


def test_exported_back_transformers_loads_it_with_equal_logits(hf, imported, tmp_path):
  from transformer_jax.interop.hf_export import export_hf

  model, _ = hf
  _, run = imported
  assert export_hf(run, str(tmp_path / "out")) == "gpt2"
  exported = transformers.GPT2LMHeadModel.from_pretrained(tmp_path / "out").eval()
  tokenizer = transformers.PreTrainedTokenizerFast(tokenizer_file=str(tmp_path / "out" /
                                                                      "tokenizer.json"))
  ids = torch.tensor([tokenizer(PROMPTS[0])["input_ids"]])
  with torch.no_grad():
    np.testing.assert_allclose(exported(ids).logits.numpy(), model(ids).logits.numpy(),
                               rtol=1e-5, atol=1e-5)
  with pytest.raises(UserError, match="is not empty"):
    export_hf(run, str(tmp_path / "out"))


def test_a_run_gpt2_cannot_express_is_a_one_line_refusal(imported, tmp_path):
  import dataclasses

  from transformer_jax.interop.hf_export import export_hf
  from transformer_jax.model.decoder_only import DecoderOnly

  _, run = imported
  post_ln = dataclasses.replace(run, model=DecoderOnly(dict(run.model.config.__dict__, norm="post")))
  with pytest.raises(UserError, match="config.model.norm='post' cannot be written as GPT-2"):
    export_hf(post_ln, str(tmp_path / "out"))
  assert not (tmp_path / "out").exists()


def test_gpt2_finetune_trains_on_multi30k_from_the_import(imported, data_dir, tmp_path):
  """experiments/configs/gpt2_finetune.py: the German side through GPT-2's own BPE, the
  imported weights as the start (its loss at step 0 is the import's), a few steps."""
  from transformer_jax.configs import load_module, validate_config
  from transformer_jax.tasks.registry import make_task
  from transformer_jax.training.loop import train_and_evaluate

  report, _ = imported
  config = load_module(f"{REPO}/experiments/configs/gpt2_finetune.py",
                       "config_gpt2_finetune").get_config(report.workdir)
  config.data.update(dict(data_dir=str(data_dir), prepared_dir=str(tmp_path / "prepared"),
                          max_len=32, tokens_per_batch=256))
  config.update(dict(num_train_steps=4, eval_every_steps=4, checkpoint_every_steps=4,
                     log_every_steps=2, warmup_steps=2))
  validate_config(config)
  task = make_task(config)
  train_and_evaluate(config, str(tmp_path / "ft"), task)
  dev = [json.loads(line) for line in (tmp_path / "ft" / "metrics.jsonl").read_text().splitlines()]
  assert [r["step"] for r in dev if r["split"] == "eval"] == [4]
  assert np.isfinite(dev[-1]["perplexity"])
