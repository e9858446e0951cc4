"""Shared fixtures. Real vocabulary: the Gemma 3 tokenizer in the default model's GGUF."""

import os

# Test pmap/shard_map code on several host devices; must precede importing jax.
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

import jaxtyping  # noqa: E402

# Check jaxtyping shape annotations of the whole package while tracing (STYLE.md G15).
jaxtyping.install_import_hook("constrained_decoding", "beartype.beartype")

import pytest  # noqa: E402

import constrained_decoding as cd  # noqa: E402


@pytest.fixture(scope="session")
def gemma_vocab():
  from constrained_decoding.models import default_gguf_path  # pylint: disable=g-import-not-at-top

  return cd.Vocabulary.from_gguf(default_gguf_path())


@pytest.fixture(scope="session")
def gemma_compiler(gemma_vocab):
  return cd.Compiler(gemma_vocab)


@pytest.fixture(scope="session")
def byte_vocab():
  """The byte-level vocabulary: 256 one-byte tokens and an end-of-sequence token."""
  return cd.Vocabulary.from_token_bytes([bytes([b]) for b in range(256)] + [None],
                                        eos_ids=[256])


@pytest.fixture(scope="session")
def byte_compiler(byte_vocab, tmp_path_factory):
  return cd.Compiler(byte_vocab, cd.CompileOptions(cache_dir=str(tmp_path_factory.mktemp("c"))))


@pytest.fixture
def spy(monkeypatch):
  """`spy(module, name)` wraps `module.name` for the test and returns the list its
  calls' results are appended to."""

  def install(module, name: str) -> list:
    calls = []
    original = getattr(module, name)

    def wrapper(*args, **kwargs):
      calls.append(original(*args, **kwargs))
      return calls[-1]

    monkeypatch.setattr(module, name, wrapper)
    return calls

  return install
