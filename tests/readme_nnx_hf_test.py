"""README "Your own Flax NNX model and a Hugging Face tokenizer": the snippet runs as is.

The code block right after `<!-- test: nnx-hf -->` in README.md is run unchanged in a
fresh interpreter (no conftest import hook, nothing imported before it), as a user who
copies it would run it; its own final asserts are the check that the output follows the
constraint. Issue 19's acceptance: a user's own jitted loop with a Flax NNX model and a
Hugging Face byte-level BPE tokenizer works from the README alone.
"""

import datetime
import json
import os
import pathlib
import re
import subprocess
import sys

import pytest

import constrained_decoding as cd

_README = pathlib.Path(__file__).resolve().parents[1] / "README.md"
_MARKER = "<!-- test: nnx-hf -->"


def _snippet() -> str:
  text = _README.read_text(encoding="utf-8")
  assert text.count(_MARKER) == 1, f"README.md must hold {_MARKER} exactly once"
  match = re.compile(re.escape(_MARKER) + r"\s*```python\n(.*?)\n```", re.S).search(text)
  assert match, f"no ```python block right after {_MARKER} in README.md"
  return match.group(1) + "\n"


def _run(code: str, tmp_path) -> subprocess.CompletedProcess:
  env = dict(os.environ, CONSTRAINED_DECODING_CACHE=str(tmp_path / "cache"),
             JAX_PLATFORMS=os.environ.get("JAX_PLATFORMS", "cpu"))
  env.pop("XLA_FLAGS", None)  # conftest's 8 fake host devices: not what a user has
  return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                        env=env, cwd=tmp_path, timeout=240, check=False)


def test_snippet_is_short_and_self_contained():
  code = _snippet()
  assert len(code.splitlines()) <= 45
  compile(code, "README.md", "exec")
  assert "import constrained_decoding as cd" in code
  assert "print(" in code and "assert " in code
  # No private attributes or test-only helpers: what the user copies is all there is.
  assert "._" not in code and "conftest" not in code


def test_snippet_runs_and_its_output_follows_the_schema(tmp_path):
  out = _run(_snippet(), tmp_path)
  assert out.returncode == 0, out.stdout + out.stderr
  value = json.loads(out.stdout.strip().splitlines()[-1])
  assert set(value) == {"date"}
  datetime.date.fromisoformat(value["date"])


def test_a_broken_snippet_fails(tmp_path):
  # Without the mask the untrained model's argmax is not the schema's text: advance sets
  # error, and the snippet's own asserts must catch it.
  code = _snippet()
  masked = "cd.mask_logits(tables, cstate, model(token))"
  assert masked in code
  out = _run(code.replace(masked, "model(token)"), tmp_path)
  assert out.returncode != 0
  assert "AssertionError" in out.stderr or "Error" in out.stderr


@pytest.fixture(scope="module")
def byte_level_bpe():
  tokenizers = pytest.importorskip("tokenizers")
  tok = tokenizers.ByteLevelBPETokenizer()
  tok.train_from_iterator(["hello world", "hello there"], vocab_size=280,
                          special_tokens=["<|endoftext|>"], show_progress=False)
  return tok


def test_from_huggingface_takes_the_tokenizers_wrappers(byte_level_bpe):
  # ByteLevelBPETokenizer (a tokenizers.implementations wrapper) reads like the
  # tokenizers.Tokenizer inside it, and like its tokenizer.json text.
  from tokenizers import Tokenizer  # pylint: disable=g-import-not-at-top

  tok = byte_level_bpe
  vocab = cd.Vocabulary.from_huggingface(tok)
  assert vocab == cd.Vocabulary.from_huggingface(Tokenizer.from_str(tok.to_str()))
  assert vocab == cd.Vocabulary.from_tokenizer_json(tok.to_str())
  assert vocab.eos_ids == (tok.token_to_id("<|endoftext|>"),)
  assert vocab.is_byte_complete
  ids = tok.encode("hello world").ids
  assert vocab.decode(ids) == b"hello world"
