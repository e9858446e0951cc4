"""Loading Gemma 3 weights from GGUF: layout, quantization, disk cache, errors.

Uses a tiny Gemma 3 GGUF written in the test with `gguf.GGUFWriter` (quantized with
Q8_0, Q5_0, Q4_0 and F32, as in real files), so every check runs in a second.
"""

import subprocess
import sys

import gguf
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from constrained_decoding import models
from constrained_decoding.models import _gguf_weights

_Q = gguf.GGMLQuantizationType
_CONFIG = models.Gemma3Config.tiny(vocab_size=64, num_layers=2, embed_dim=32,
                                   hidden_dim=64, num_heads=2, num_kv_heads=1,
                                   head_dim=32, sliding_window=16, global_layer_period=6)


def _write_tiny_gguf(path, *, architecture="gemma3"):
  """Writes a random tiny Gemma 3 GGUF; returns {tensor name: dequantized (out, in)}."""
  rng = np.random.default_rng(0)
  c = _CONFIG
  writer = gguf.GGUFWriter(str(path), arch=architecture)
  writer.add_context_length(128)
  writer.add_embedding_length(c.embed_dim)
  writer.add_block_count(c.num_layers)
  writer.add_feed_forward_length(c.hidden_dim)
  writer.add_head_count(c.num_heads)
  writer.add_head_count_kv(c.num_kv_heads)
  writer.add_key_length(c.head_dim)
  writer.add_value_length(c.head_dim)
  writer.add_layer_norm_rms_eps(1e-6)
  writer.add_rope_freq_base(1e6)
  writer.add_sliding_window(c.sliding_window)
  tensors = {}

  def add(name, shape, qtype):
    value = rng.standard_normal(shape).astype(np.float32)
    if qtype == _Q.F32:
      writer.add_tensor(name, value)
      tensors[name] = value
    else:
      quantized = gguf.quants.quantize(value, qtype)
      writer.add_tensor(name, quantized, raw_dtype=qtype)
      tensors[name] = gguf.quants.dequantize(quantized, qtype)

  d, f, dh = c.embed_dim, c.hidden_dim, c.head_dim
  h, k = c.num_heads, c.num_kv_heads
  add("token_embd.weight", (c.vocab_size, d), _Q.Q8_0)
  add("output_norm.weight", (d,), _Q.F32)
  for i in range(c.num_layers):
    for name, shape, qtype in [
        ("attn_norm", (d,), _Q.F32), ("attn_q", (h * dh, d), _Q.Q5_0),
        ("attn_k", (k * dh, d), _Q.Q5_0), ("attn_v", (k * dh, d), _Q.Q8_0),
        ("attn_q_norm", (dh,), _Q.F32), ("attn_k_norm", (dh,), _Q.F32),
        ("attn_output", (d, h * dh), _Q.Q4_0), ("post_attention_norm", (d,), _Q.F32),
        ("ffn_norm", (d,), _Q.F32), ("ffn_gate", (f, d), _Q.Q5_0),
        ("ffn_up", (f, d), _Q.Q5_0), ("ffn_down", (d, f), _Q.Q4_0),
        ("post_ffw_norm", (d,), _Q.F32)]:
      add(f"blk.{i}.{name}.weight", shape, qtype)
  writer.write_header_to_file()
  writer.write_kv_data_to_file()
  writer.write_tensors_to_file()
  writer.close()
  return tensors


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory):
  path = tmp_path_factory.mktemp("gguf") / "tiny-gemma3.gguf"
  return path, _write_tiny_gguf(path)


def _expected_params(tensors):
  """The params layout documented in `constrained_decoding.models`, built by hand."""
  layers = []
  for i in range(_CONFIG.num_layers):
    t = lambda name, i=i: tensors[f"blk.{i}.{name}.weight"]
    layers.append({
        "pre_attention_norm": t("attn_norm"),
        "qkv": np.concatenate([t("attn_q"), t("attn_k"), t("attn_v")]),
        "query_norm": t("attn_q_norm"),
        "key_norm": t("attn_k_norm"),
        "attention_output": t("attn_output"),
        "post_attention_norm": t("post_attention_norm"),
        "pre_ffw_norm": t("ffn_norm"),
        "gate_up": np.concatenate([t("ffn_gate"), t("ffn_up")]),
        "down": t("ffn_down"),
        "post_ffw_norm": t("post_ffw_norm"),
    })
  return {"embedding": tensors["token_embd.weight"],
          "final_norm": tensors["output_norm.weight"], "layers": tuple(layers)}


def _assert_params_equal(actual, expected, dtype=np.float32):
  jax.tree.map(lambda a, e: np.testing.assert_array_equal(
      np.asarray(a), np.asarray(e).astype(dtype)), actual, expected)


def test_config_from_gguf(tiny_gguf):
  path, _ = tiny_gguf
  assert models.Gemma3Config.from_gguf(path) == _CONFIG


def test_params_are_dequantized_into_the_documented_layout(tiny_gguf, tmp_path):
  path, tensors = tiny_gguf
  params = models.load_gguf_params(path, cache=False, progress=False)
  _assert_params_equal(params, _expected_params(tensors))


def test_second_load_reads_the_disk_cache(tiny_gguf, tmp_path, monkeypatch):
  path, tensors = tiny_gguf
  first = models.load_gguf_params(path, cache_dir=tmp_path, progress=False)
  assert len(list(tmp_path.iterdir())) == 1

  def fail(*args):
    raise AssertionError(f"dequantized {args[1]!r} although the cache was warm")

  monkeypatch.setattr(_gguf_weights, "_dequantize", fail)
  second = models.load_gguf_params(path, cache_dir=tmp_path, progress=False)
  _assert_params_equal(second, _expected_params(tensors))
  _assert_params_equal(second, first)


def test_bfloat16_is_cached_separately(tiny_gguf, tmp_path):
  path, tensors = tiny_gguf
  for _ in range(2):  # Dequantize, then read the cache back.
    params = models.load_gguf_params(path, dtype=jnp.bfloat16, cache_dir=tmp_path,
                                     progress=False)
    assert {a.dtype for a in jax.tree.leaves(params)} == {jnp.dtype(jnp.bfloat16)}
    _assert_params_equal(params, _expected_params(tensors), dtype=jnp.bfloat16)
  models.load_gguf_params(path, cache_dir=tmp_path, progress=False)
  assert len(list(tmp_path.iterdir())) == 2


def test_corrupt_cache_is_rebuilt(tiny_gguf, tmp_path):
  path, tensors = tiny_gguf
  models.load_gguf_params(path, cache_dir=tmp_path, progress=False)
  (directory,) = tmp_path.iterdir()
  (directory / "000.npy").write_bytes(b"not a numpy file")
  params = models.load_gguf_params(path, cache_dir=tmp_path, progress=False)
  _assert_params_equal(params, _expected_params(tensors))


def test_unwritable_cache_warns_and_still_loads(tiny_gguf, tmp_path):
  path, tensors = tiny_gguf
  not_a_directory = tmp_path / "file"
  not_a_directory.write_text("")
  with pytest.warns(UserWarning, match=r"Could not write the weight cache"):
    params = models.load_gguf_params(path, cache_dir=not_a_directory, progress=False)
  _assert_params_equal(params, _expected_params(tensors))


def test_loaded_tiny_model_runs(tiny_gguf):
  path, _ = tiny_gguf
  config = models.Gemma3Config.from_gguf(path)
  params = models.load_gguf_params(path, cache=False, progress=False)
  cache = models.init_cache(config, batch_size=1, cache_len=8)
  logits, _ = models.forward(params, config, jnp.array([[1, 2, 3]]),
                             jnp.arange(3)[None], cache)
  assert logits.shape == (1, 3, config.vocab_size)
  assert np.isfinite(np.asarray(logits)).all()


def test_other_architecture_is_rejected(tmp_path):
  path = tmp_path / "llama.gguf"
  _write_tiny_gguf(path, architecture="llama")
  with pytest.raises(models.ModelFormatError,
                     match=r"general.architecture='llama'. Expected 'gemma3'"):
    models.load_gguf_params(path, cache=False, progress=False)


def test_default_gguf_path_is_the_packaged_model():
  path = models.default_gguf_path()
  assert path.endswith(".gguf")
  assert models.Gemma3Config.from_gguf(path) == models.Gemma3Config.gemma3_270m()


def test_importing_models_does_not_import_pynini():
  # STYLE.md G1: device code must run where pynini is not installed.
  code = "import sys, constrained_decoding.models; print('pynini' in sys.modules)"
  result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True)
  assert result.stdout.strip() == "False"
