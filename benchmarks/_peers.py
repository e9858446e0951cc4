"""Adapters that drive peer constrained-decoding engines through one small interface.

Every peer is built from the *same* vocabulary (`token_bytes`, `eos_ids`, `vocab_size`),
so a benchmark compares engines on one language and one tokenization, not on whatever
each library's own tokenizer loader makes of the model. The peers are imported only
inside the adapters: the library itself never depends on them.

Interface of an adapter (`make_peer(name, token_bytes, eos_ids, vocab_size)`):
  peer.compile(regex) -> compiled       host compile, with the peer's caches defeated.
  peer.grammar_source(gbnf) -> source   the peer's input for a GBNF grammar (llama.cpp's
                                        format), translated once, outside compile timing.
  peer.compile_grammar(source) -> compiled   host compile of that grammar, caches defeated;
                                        outlines-core has no grammars (NotImplementedError).
  peer.matcher(compiled) -> matcher     fresh per-sequence state (not timed as compile).
  peer.allocate(batch) -> (bitmask, logits)   int32 [B, ceil(V/32)] and float32 [B, V].
  peer.apply(logits, bitmask)           the peer's own in-place mask application.
  peer.bitmask_numpy(bitmask)           a numpy view, for checking masks.
  matcher.fill_mask(bitmask, row=0)     writes the allowed-token bitmask into `row`.
  matcher.advance(token_id)             consumes one token.
  matcher.is_accepting                  True when end-of-sequence is allowed.

Regex semantics: the library reads `\\d` as ASCII [0-9]; llguidance and outlines-core
read it as Unicode Nd (264 first-step tokens on Gemma instead of 20). `ascii_digits`
rewrites `\\d`/`\\D` so every peer gets the library's language.
"""

import time

import numpy as np

PEER_NAMES = ("xgrammar", "llguidance", "outlines_core")
_EXTRA_HINT = "pip install -e '.[bench]' (in a checkout)"
# Timing on a shared 2-core machine: every engine runs single-threaded (two intra-op torch
# threads made the torch.compile mask kernels 30-90x slower here, see notes/peers-cpu.md).
_THREADS = 1


def _import_peer(module: str, extra_name: str):
  """Imports a peer module, or raises ImportError that names the benchmark extra."""
  import importlib  # pylint: disable=import-outside-toplevel
  try:
    return importlib.import_module(module)
  except ImportError as e:
    raise ImportError(
        f"Peer engine {extra_name!r} is not installed (import of {module!r} failed: {e}). "
        f"Install the benchmark extras: {_EXTRA_HINT}") from e


def _torch():
  """Imports torch limited to one intra-op thread (see _THREADS)."""
  torch = _import_peer("torch", "torch")
  if torch.get_num_threads() != _THREADS:
    torch.set_num_threads(_THREADS)
  return torch


def _version(dist: str) -> str:
  """The installed version of distribution `dist` (peers disagree on `__version__`)."""
  import importlib.metadata  # pylint: disable=import-outside-toplevel
  return importlib.metadata.version(dist)


def ascii_digits(regex: str) -> str:
  """Rewrites `\\d` to `[0-9]` and `\\D` to `[^0-9]` (`0-9` inside a class).

  Escaped backslashes (`\\\\d`) are left alone. `\\D` inside a class has no simple
  rewrite and raises ValueError.
  """
  out, i, in_class = [], 0, False
  while i < len(regex):
    c = regex[i]
    if c == "\\" and i + 1 < len(regex):
      nxt = regex[i + 1]
      if nxt == "d":
        out.append("0-9" if in_class else "[0-9]")
      elif nxt == "D":
        if in_class:
          raise ValueError(f"Cannot rewrite \\D inside a character class: {regex!r}")
        out.append("[^0-9]")
      else:
        out.append(regex[i:i + 2])
      i += 2
      continue
    if c == "[" and not in_class:
      in_class = True
    elif c == "]" and in_class:
      in_class = False
    out.append(c)
    i += 1
  return "".join(out)


class _Peer:
  """Shared parts of the adapters: buffers (torch, CPU) and setup bookkeeping."""

  name = ""

  def __init__(self, token_bytes, eos_ids, vocab_size):
    self.vocab_size = int(vocab_size)
    self.eos_ids = [int(e) for e in eos_ids]
    self.words = -(-self.vocab_size // 32)
    self.info = {}
    start = time.perf_counter()
    self._import()
    self.info["import_s"] = time.perf_counter() - start
    start = time.perf_counter()
    self._setup(token_bytes)
    self.info["vocab_setup_s"] = time.perf_counter() - start

  def _import(self):
    """Imports the peer and its kernels (timed apart from vocabulary setup)."""
    raise NotImplementedError

  def _setup(self, token_bytes):
    """Builds the peer's tokenizer/vocabulary object from the shared token bytes."""
    raise NotImplementedError

  def allocate(self, batch: int):
    """Returns (bitmask int32 [B, W], logits float32 [B, V]) as CPU torch tensors."""
    torch = _torch()
    bitmask = torch.full((batch, self.words), -1, dtype=torch.int32)
    logits = torch.randn((batch, self.vocab_size), generator=torch.Generator().manual_seed(0))
    return bitmask, logits

  def grammar_source(self, gbnf: str) -> str:
    """What `compile_grammar` takes for a GBNF grammar: the GBNF itself by default."""
    return gbnf

  def compile_grammar(self, source: str):
    """Compiles a grammar given as `grammar_source(gbnf)` (caches defeated)."""
    raise NotImplementedError(f"{self.name} has no context-free grammars")

  def bitmask_numpy(self, bitmask) -> np.ndarray:
    """A numpy view of a bitmask made by `allocate` (shares memory)."""
    return bitmask.numpy()


# ---------------------------------------------------------------------------- xgrammar


class _XgrammarMatcher:
  """One xgrammar GrammarMatcher (one sequence)."""

  def __init__(self, compiled, xgr):
    self._m = xgr.GrammarMatcher(compiled)

  def fill_mask(self, bitmask, row: int = 0):
    self._m.fill_next_token_bitmask(bitmask, row)

  def advance(self, token_id: int):
    if not self._m.accept_token(int(token_id)):
      raise ValueError(f"xgrammar rejected token {token_id}")

  @property
  def is_accepting(self) -> bool:
    return self._m.is_completed()


class XgrammarPeer(_Peer):
  """xgrammar: RAW vocabulary of token bytes; control tokens are empty (= special)."""

  name = "xgrammar"

  def _import(self):
    _torch()  # xgrammar imports torch; pin its threads first.
    self._xgr = _import_peer("xgrammar", "xgrammar")

  def _setup(self, token_bytes):
    vocab = [b"" if t is None else t for t in token_bytes]
    self._info = self._xgr.TokenizerInfo(
        vocab, self._xgr.VocabType.RAW, vocab_size=self.vocab_size,
        stop_token_ids=self.eos_ids, add_prefix_space=False)
    self.info.update(version=_version("xgrammar"), max_threads=_THREADS, cache_enabled=False,
                     apply="xgrammar.apply_token_bitmask_inplace (C++ cpu kernel)",
                     special_token_ids=len(self._info.special_token_ids))

  def compile(self, regex: str):
    """Compiles with a fresh compiler whose cache is disabled (no cross-call reuse)."""
    compiler = self._xgr.GrammarCompiler(self._info, max_threads=_THREADS, cache_enabled=False)
    return compiler.compile_regex(regex)

  def compile_grammar(self, gbnf: str):
    """Compiles a GBNF grammar (xgrammar's EBNF is llama.cpp's GBNF), cache disabled."""
    compiler = self._xgr.GrammarCompiler(self._info, max_threads=_THREADS, cache_enabled=False)
    return compiler.compile_grammar(gbnf)

  def compile_builtin_json(self):
    """xgrammar's own JSON grammar (any value), cache disabled."""
    compiler = self._xgr.GrammarCompiler(self._info, max_threads=_THREADS, cache_enabled=False)
    return compiler.compile_builtin_json_grammar()

  def matcher(self, compiled):
    return _XgrammarMatcher(compiled, self._xgr)

  def apply(self, logits, bitmask):
    self._xgr.apply_token_bitmask_inplace(logits, bitmask, vocab_size=self.vocab_size)


# --------------------------------------------------------------------------- llguidance


class _GreedyTokenizer:
  """The `TokenizerWrapper` duck type llguidance wants, over raw token bytes.

  llguidance tokenizes forced text (e.g. a literal `-` in a regex) and then allows only
  that tokenization, so among tokens with identical bytes this picks the one the
  benchmark walks take: the highest id (a normal piece over its byte-fallback twin).
  """

  def __init__(self, tokens, eos_id):
    self.tokens = tokens
    self.special_token_ids = []
    self.eos_token_id = eos_id
    self.bos_token_id = None
    self.is_tokenizer_wrapper = True
    self._ids = {}
    for i, t in enumerate(tokens):
      if t and not t.startswith(b"\xff"):
        self._ids[t] = i  # Ascending ids: the highest one wins.
    self._max_len = max(len(t) for t in self._ids)

  def __call__(self, s):
    data = s.encode("utf-8") if isinstance(s, str) else bytes(s)
    out, i = [], 0
    while i < len(data):
      for n in range(min(self._max_len, len(data) - i), 0, -1):
        tid = self._ids.get(data[i:i + n])
        if tid is not None:
          out.append(tid)
          i += n
          break
      else:
        raise ValueError(f"No token for byte {data[i]:#x}")
    return out


class _LlguidanceMatcher:
  """One llguidance LLMatcher (one sequence)."""

  def __init__(self, matcher, row_bytes):
    self._m = matcher
    self._row_bytes = row_bytes

  def fill_mask(self, bitmask, row: int = 0):
    self._m.unsafe_compute_mask_ptr(bitmask.data_ptr() + row * self._row_bytes, self._row_bytes)

  def advance(self, token_id: int):
    if not self._m.consume_token(int(token_id)):
      raise ValueError(f"llguidance rejected token {token_id}: {self._m.get_error()}")

  @property
  def is_accepting(self) -> bool:
    return self._m.is_accepting()


class LlguidancePeer(_Peer):
  """llguidance: LLTokenizer over token bytes; control tokens are named special tokens."""

  name = "llguidance"

  def _import(self):
    self._llg = _import_peer("llguidance", "llguidance")
    self._apply, self._apply_name = self._pick_apply()

  def _setup(self, token_bytes):
    # Control tokens become llguidance special tokens by a 0xFF prefix (as its llama.cpp
    # loader does), each with a distinct name. Listing them in `special_token_ids` instead
    # works but makes LLTokenizer construction take 10-13 s instead of 0.8 s here.
    # (The byte token <0xFF> then reads as special too: harmless, 0xFF is never in UTF-8.)
    tokens = [b"\xff<|ctl_%d|>" % i if t is None else t for i, t in enumerate(token_bytes)]
    wrapper = _GreedyTokenizer(tokens, self.eos_ids[0])
    self._tok = self._llg.LLTokenizer(wrapper, n_vocab=self.vocab_size, eos_token=self.eos_ids)
    self.info.update(version=_version("llguidance"), apply=self._apply_name)

  def _pick_apply(self):
    """llguidance's own torch kernel (torch.compile), on the same CPU tensors as the others."""
    _torch()
    kernel = _import_peer("llguidance.torch", "llguidance")
    return (kernel.apply_token_bitmask_inplace,
            "llguidance.torch.apply_token_bitmask_inplace (torch.compile)")

  def compile(self, regex: str):
    """Builds the grammar and a matcher; the matcher holds the compiled lexer/parser.

    llguidance has no separate compiled object: a fresh LLMatcher per compile is the
    uncached cost. `matcher()` then deep-copies it (cheap, and not counted as compile).
    """
    return self._matcher_for(self._llg.LLMatcher.grammar_from_regex(regex))

  def grammar_source(self, gbnf: str) -> str:
    """llguidance's own translation of a GBNF grammar (to its Lark dialect), done once.

    Lark is llguidance's native grammar input; `compile_grammar` takes this text so the
    Python translation is not timed as compile.
    """
    return self._llg.grammar_from("gbnf", gbnf)

  def compile_grammar(self, source: str):
    """Builds a matcher for `grammar_source(gbnf)` text (see `compile`)."""
    return self._matcher_for(source)

  def _matcher_for(self, grammar: str):
    m = self._llg.LLMatcher(self._tok, grammar, log_level=0)
    if m.is_error():
      raise ValueError(f"llguidance: {m.get_error()}")
    return m

  def matcher(self, compiled):
    return _LlguidanceMatcher(compiled.deep_copy(), self.words * 4)

  def apply(self, logits, bitmask):
    self._apply(logits, bitmask)


# ------------------------------------------------------------------------ outlines-core


class _OutlinesMatcher:
  """One outlines-core Guide (one sequence).

  outlines-core's Vocabulary takes a single EOS id; the others are OR-ed into the mask
  in accepting states so every engine allows the same tokens. Its Guide cannot advance
  on EOS (outlines stops generating instead), so `advance(eos)` only checks finality.
  """

  def __init__(self, guide, words, eos_ids, extra_eos):
    self._g = guide
    self._eos = frozenset(eos_ids)
    self._words = words
    self._extra_eos = extra_eos  # [(word, bit value as int32)]

  def fill_mask(self, bitmask, row: int = 0):
    self._g.write_mask_into(bitmask.data_ptr() + row * self._words * 4, self._words, 4)
    if self._extra_eos and self._g.is_finished():
      view = bitmask.numpy()
      for word, bit in self._extra_eos:
        view[row, word] |= bit

  def advance(self, token_id: int):
    if token_id in self._eos:  # Guide has no EOS transition: generation just stops.
      if not self._g.is_finished():
        raise ValueError(f"outlines-core: EOS {token_id} outside a final state")
      return
    self._g.advance(int(token_id), return_tokens=False)

  @property
  def is_accepting(self) -> bool:
    return self._g.is_finished()


class OutlinesCorePeer(_Peer):
  """outlines-core: Vocabulary from bytes -> ids (the library's bytes, not outlines')."""

  name = "outlines_core"

  def _import(self):
    self._oc = _import_peer("outlines_core", "outlines-core")
    _torch()
    self._kernel = _import_peer("outlines_core.kernels.torch", "outlines-core")

  def _setup(self, token_bytes):
    eos = set(self.eos_ids)
    by_bytes = {}
    for i, t in enumerate(token_bytes):
      if t is not None and i not in eos:
        by_bytes.setdefault(t, []).append(i)
    self._vocab = self._oc.Vocabulary(self.eos_ids[0], by_bytes)
    self._extra_eos = [(e // 32, _int32_bit(e % 32)) for e in self.eos_ids[1:]]
    self.info.update(version=_version("outlines-core"),
                     distinct_byte_strings=len(by_bytes),
                     apply="outlines_core.kernels.torch.apply_token_bitmask_inplace (torch.compile)")

  def compile(self, regex: str):
    """Builds a fresh Index (outlines-core keeps no cache of its own)."""
    return self._oc.Index(regex, self._vocab)

  def matcher(self, compiled):
    return _OutlinesMatcher(self._oc.Guide(compiled), self.words, self.eos_ids,
                           self._extra_eos)

  def apply(self, logits, bitmask):
    self._kernel.apply_token_bitmask_inplace(logits, bitmask)


def _int32_bit(bit: int) -> int:
  """The int32 value with only `bit` set (bit 31 is negative)."""
  return int(np.array(1 << bit, dtype=np.uint32).view(np.int32))


_PEERS = {"xgrammar": XgrammarPeer, "llguidance": LlguidancePeer, "outlines_core": OutlinesCorePeer}


def make_peer(name: str, token_bytes, eos_ids, vocab_size) -> _Peer:
  """Builds peer `name` (one of PEER_NAMES) from the shared vocabulary.

  Raises:
    ImportError: the peer is not installed (the message names the `bench` extra).
    KeyError: unknown peer name.
  """
  if name not in _PEERS:
    raise KeyError(f"Unknown peer {name!r}; expected one of {PEER_NAMES}")
  return _PEERS[name](token_bytes, eos_ids, vocab_size)
