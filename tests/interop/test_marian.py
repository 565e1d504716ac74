"""Marian (opus-mt) import: the imported model computes what Hugging Face's MarianMTModel computes.

A small MarianMTModel with random weights and opus-mt's layout (swish, tied
embeddings, its <pad> as decoder start, a final-logits bias, separate source
and target SentencePiece models over one vocab.json) is saved with
`save_pretrained`, imported, and compared with PyTorch: encoder outputs and
logits, greedy and beam tokens of `generate()`, and the tokenizer's ids.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys

import jax.numpy as jnp
import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the Marian tests need torch and transformers "
                            "(pip install -e '.[test]')")
transformers = pytest.importorskip("transformers")

from transformer_jax.data.generated import sample_pair  # noqa: E402
from transformer_jax.decode.translator import DecodeOptions, decode_batch  # noqa: E402
from transformer_jax.errors import UserError  # noqa: E402
from transformer_jax.interop import marian  # noqa: E402
from transformer_jax.configs import load_module, validate_config  # noqa: E402
from transformer_jax.model.transformer import Transformer  # noqa: E402
from transformer_jax.special_tokens import EOS_ID, PAD_ID  # noqa: E402
from transformer_jax.tasks.registry import load_run  # noqa: E402

SENTENCES = [sample_pair(random.Random(i)) for i in range(1500)]
SOURCES = [en for en, _ in SENTENCES[:12]] + ["Zebras ☃ wander.", ""]


@pytest.fixture(scope="module")
def hf_model(marian_dir):
  return transformers.MarianMTModel.from_pretrained(marian_dir).eval()


@pytest.fixture(scope="module")
def hf_tokenizer(marian_dir):
  return transformers.MarianTokenizer(
      source_spm=os.path.join(marian_dir, "source.spm"),
      target_spm=os.path.join(marian_dir, "target.spm"),
      vocab=os.path.join(marian_dir, "vocab.json"))


@pytest.fixture(scope="module")
def imported(marian_dir, tmp_path_factory):
  workdir = str(tmp_path_factory.mktemp("imported"))
  report = marian.import_marian(marian_dir, workdir)
  return workdir, report, load_run(workdir)


@pytest.fixture(scope="module")
def permutation(imported) -> np.ndarray:
  """int[our vocab]: the Marian id of each of our ids."""
  return imported[1].marian_ids


def test_tokenizer_gives_marians_ids(imported, hf_tokenizer, permutation):
  _, _, run = imported
  texts = [en for en, _ in SENTENCES[1000:1200]] + SOURCES
  for text in texts:
    theirs = hf_tokenizer(text)["input_ids"]
    ours = [int(permutation[i]) for i in run.tokenizer.encode(text)]
    assert ours == theirs, f"{text!r}: Marian's tokenizer gives {theirs}, ours {ours}"


def _batch(hf_tokenizer, texts):
  encoded = hf_tokenizer(texts, padding=True, return_tensors="pt")
  return encoded["input_ids"], encoded["attention_mask"]


def test_encoder_and_logits_equal_pytorch(imported, hf_model, hf_tokenizer, permutation):
  _, _, run = imported
  input_ids, attention_mask = _batch(hf_tokenizer, SOURCES[:6])
  decoder_ids = input_ids[:, :7].clone()  # Any tokens: the decoder is compared step by step.
  decoder_ids[:, 0] = hf_model.config.decoder_start_token_id
  with torch.no_grad():
    out = hf_model(input_ids=input_ids, attention_mask=attention_mask,
                   decoder_input_ids=decoder_ids)
  ours_of = {int(m): i for i, m in reversed(list(enumerate(permutation)))}
  ours_of[hf_model.config.pad_token_id] = PAD_ID  # Padding: PAD here.
  to_ours = np.vectorize(lambda m: ours_of[int(m)])
  src = jnp.asarray(to_ours(input_ids.numpy()))
  target_input = to_ours(decoder_ids.numpy())
  target_input[:, 0] = 2  # BOS: Marian's decoder start row.
  encoded = run.model.apply({"params": run.params}, src, method=Transformer.encode)
  mask = attention_mask.numpy().astype(bool)
  encoder_difference = np.abs(np.asarray(encoded) - out.encoder_last_hidden_state.numpy())[mask]
  print(f"largest differences: encoder {encoder_difference.max():.2e}", end=" ")
  assert encoder_difference.max() < 1e-4, f"encoder outputs differ by {encoder_difference.max()}"
  logits = run.model.apply({"params": run.params}, src, jnp.asarray(target_input))
  theirs = out.logits.numpy()
  logit_difference = np.abs(np.asarray(logits)[..., 1:] - theirs[..., permutation[1:]])
  scale = np.abs(theirs).max()
  print(f"logits {logit_difference.max():.2e} (largest logit {scale:.1f})")
  # The two engines' float32 kernels sum in different orders, and this random model (weights
  # N(0, 0.5)) amplifies that: 5.3e-5 on an AVX2 EPYC, 3.1e-4 on an AMX Xeon, whose largest
  # logit was 10.2 (both engines' plain matmuls are float32-exact there). A mistake in the
  # import moves logits by whole units.
  assert logit_difference.max() < 1e-4 * max(scale, 1.0), f"logits differ by {logit_difference.max()}"


@pytest.mark.parametrize("beam_size", [1, 4])
def test_decoding_equals_generate(imported, hf_model, hf_tokenizer, permutation, beam_size):
  """Greedy and beam search give generate()'s tokens.

  The settings on which the two searches agree: finish_rule="fairseq" (which
  hypotheses finish, as generate() decides), no length penalty (its
  length_penalty=0.0 and α=0 both score a hypothesis by its log-probability),
  no minimum length, its early_stopping=False, and one maximum length:
  max_new_tokens = the source's length + max_extra_len, as here.
  """
  _, _, run = imported
  extra = 6
  options = DecodeOptions(method="beam" if beam_size > 1 else "greedy", beam_size=beam_size,
                          alpha=0.0, max_extra_len=extra, min_length=0,
                          finish_rule="fairseq")
  texts = SOURCES[:12]
  rows = [run.tokenizer.encode(text) for text in texts]
  width = max(map(len, rows))  # One batch: each row still stops at its own length + extra.
  src = jnp.asarray([row + [PAD_ID] * (width - len(row)) for row in rows], jnp.int32)
  decoded = np.asarray(decode_batch(run.model, run.params, src, options, width + extra))
  for text, ours in zip(texts, decoded.tolist()):
    input_ids, attention_mask = _batch(hf_tokenizer, [text])
    with torch.no_grad():
      generated = hf_model.generate(
          input_ids=input_ids, attention_mask=attention_mask, num_beams=beam_size,
          do_sample=False, length_penalty=0.0, early_stopping=False, min_length=0,
          max_new_tokens=input_ids.shape[1] + extra)[0, 1:].tolist()
    if hf_model.config.eos_token_id in generated:
      generated = generated[:generated.index(hf_model.config.eos_token_id) + 1]
    if EOS_ID in ours:
      ours = ours[:ours.index(EOS_ID) + 1]
    ours = [int(permutation[i]) for i in ours if i != PAD_ID]
    assert ours == generated, f"{text!r}, beam {beam_size}: generate() gives {generated}, ours {ours}"


def _command(*args: str, stdin: str = "", cwd: str | None = None) -> subprocess.CompletedProcess:
  return subprocess.run([sys.executable, "-m", *args], input=stdin, capture_output=True,
                        text=True, timeout=600, cwd=cwd)


def test_import_translate_evaluate_commands(marian_dir, hf_model, hf_tokenizer, tmp_path):
  """The run directory the command writes is used by translate and evaluate unchanged."""
  workdir = str(tmp_path / "run")
  imported = _command("transformer_jax.import_marian", f"--model_dir={marian_dir}",
                      f"--workdir={workdir}")
  assert imported.returncode == 0, imported.stderr[-2000:]
  assert "imported" in imported.stdout
  texts = SOURCES[:4]
  translated = _command("transformer_jax.translate", f"--workdir={workdir}", "--method=greedy",
                        "--min_length=0", "--max_extra_len=6", stdin="\n".join(texts) + "\n")
  assert translated.returncode == 0, translated.stderr[-2000:]
  lines = translated.stdout.splitlines()
  assert len(lines) == len(texts)
  for text, line in zip(texts, lines):
    input_ids, attention_mask = _batch(hf_tokenizer, [text])
    with torch.no_grad():
      generated = hf_model.generate(input_ids=input_ids, attention_mask=attention_mask,
                                    num_beams=1, do_sample=False,
                                    max_new_tokens=input_ids.shape[1] + 6)[0]
    if hf_tokenizer.unk_token_id not in generated.tolist():  # Shown as ⁇ here, dropped there.
      assert line == hf_tokenizer.decode(generated, skip_special_tokens=True), text
  source, reference = tmp_path / "source.en", tmp_path / "reference.de"
  source.write_text("\n".join(texts) + "\n")
  reference.write_text("\n".join(de for _, de in SENTENCES[:4]) + "\n")
  evaluated = _command("transformer_jax.evaluate", f"--workdir={workdir}", f"--source={source}",
                       f"--reference={reference}", "--beam_size=2")
  assert evaluated.returncode == 0, evaluated.stderr[-2000:]
  scores = json.loads(evaluated.stdout.strip().splitlines()[-1])
  assert scores["sentences"] == 4 and "sacrebleu" in scores
  assert scores["decoding"] == dict(method="beam", beam_size=2, alpha=0.6, finish_rule="t2t",
                                    stop_rule="exact",
                                    max_extra_len=50, min_length=1), scores["decoding"]


def test_fine_tuning_starts_from_every_imported_parameter(imported, tmp_path):
  """marian_finetune.py: the imported run's model, weights and vocabulary, on a corpus."""
  run_dir = imported[0]
  config = load_module(os.path.join(os.path.dirname(__file__), "..", "..", "experiments", "configs",
                                    "marian_finetune.py")).get_config(run_dir)
  validate_config(config)
  trained = _command(
      "transformer_jax.train", f"--config=experiments/configs/marian_finetune.py:{run_dir}",
      f"--workdir={tmp_path / 'ft'}", "--config.data.dataset=generated_translation",
      "--config.data.num_generated_train=300", "--config.data.num_generated_eval=20",
      f"--config.data.prepared_dir={tmp_path / 'cache'}", "--config.num_train_steps=2",
      "--config.warmup_steps=1", "--config.eval_bleu_sentences=0", "--config.final_eval_split=",
      "--config.data.tokens_per_batch=512", "--config.data.max_len=32",
      cwd=os.path.join(os.path.dirname(__file__), "..", ".."))
  assert trained.returncode == 0, trained.stderr[-3000:]
  assert "initialised afresh: none" in trained.stdout, trained.stdout[-2000:]


@pytest.mark.parametrize("field, value, message", [
    ("model_type", "bart", "is not a Marian model (config.json model_type='bart')"),
    ("scale_embedding", False, "config.json scale_embedding=False is not supported"),
    ("decoder_ffn_dim", 32, "config.json encoder_ffn_dim=64 differs from decoder_ffn_dim=32"),
    ("activation_function", "tanh", "activation_function='tanh' is not supported"),
])
def test_an_unsupported_checkpoint_is_a_one_line_error(marian_dir, tmp_path, field, value, message):
  broken = tmp_path / "model"
  broken.mkdir()
  for name in os.listdir(marian_dir):
    os.symlink(os.path.join(marian_dir, name), broken / name)
  hf = json.load(open(os.path.join(marian_dir, "config.json")))
  hf[field] = value
  os.remove(broken / "config.json")
  (broken / "config.json").write_text(json.dumps(hf))
  with pytest.raises(UserError, match=message.replace("(", r"\(").replace(")", r"\)")):
    marian.import_marian(str(broken), str(tmp_path / "run"))
  assert not (tmp_path / "run").exists(), "a refused import must write nothing"


def test_a_directory_without_marian_files_is_a_one_line_error(tmp_path):
  result = _command("transformer_jax.import_marian", f"--model_dir={tmp_path}",
                    f"--workdir={tmp_path / 'run'}")
  assert result.returncode == 2  # exit_on_user_error's status.
  errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
  assert "Traceback" not in result.stderr, result.stderr
  assert len(errors) == 1 and "config.json does not exist" in errors[0], result.stderr
