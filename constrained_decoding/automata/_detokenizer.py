"""The vocabulary trie and the detokenizing FST T_V (Alg. 1, trie form; App. B.1).

The trie is the product-friendly form of T_V: node = a byte prefix of some token, edges
labelled by bytes, tokens attached to the node spelling them. The token-level
composition (`_compose.py`) walks it with numpy; `detokenizing_fst` exports the same
structure as a pynini FST (token id + 1 on the last arc of each token, bytes + 1 as
outputs) for OpenFst operations such as PDT composition.

Public functions:
  build_trie(vocab)                  VocabTrie from a Vocabulary (~1 s for 262k tokens).
  load_or_build_trie(vocab, cache_dir) the same, cached on disk by fingerprint.
  detokenizing_fst(trie)             T_V as a pynini.Fst (tokens -> bytes, labels + 1).
  load_or_build_detokenizing_fst(vocab, cache_dir)  the same, cached on disk.
"""

import dataclasses
import functools
import logging
import os
import tempfile
import time
import warnings

import numpy as np

from constrained_decoding import _cache
from constrained_decoding.automata import _array_file
from constrained_decoding.vocab._vocabulary import Vocabulary

# Progress of slow one-time work, at INFO (standard `logging`, so absl's handler shows
# it under absl; the command line shows the package's INFO messages on stderr).
_LOG = logging.getLogger(__name__)

# Bumped (in `_cache.FORMATS`) when the on-disk layout of the trie changes.
TRIE_FORMAT_VERSION = _cache.FORMATS["trie"].version
# The name ending of `_array_file` cache files (`read_cache_file`, `write_cache_file`).
ARRAYS_SUFFIX = ".arrays"
_FIELDS = ("child_start", "child_byte", "child_node", "node_depth", "token_start",
           "token_ids")


@dataclasses.dataclass(frozen=True, eq=False)
class VocabTrie:
  """Prefix trie of the vocabulary's byte strings, as CSR numpy arrays.

  Node 0 is the root (the empty prefix). Tokens without bytes are not in the trie.

  Attributes:
    child_start: int32 `[N + 1]`; children of node n are `child_start[n]:child_start[n+1]`.
    child_byte: uint8 `[N - 1]`; edge byte of each child slot (sorted within a node).
    child_node: int32 `[N - 1]`; the child node of each slot.
    node_depth: int32 `[N]`; length of each node's prefix.
    token_start: int32 `[N + 1]`; tokens spelled by node n are
      `token_ids[token_start[n]:token_start[n+1]]` (several ids may share bytes).
    token_ids: int32 `[num tokens with bytes]`.
    fingerprint: The vocabulary's fingerprint.
  """

  child_start: np.ndarray
  child_byte: np.ndarray
  child_node: np.ndarray
  node_depth: np.ndarray
  token_start: np.ndarray
  token_ids: np.ndarray
  fingerprint: str

  @property
  def num_nodes(self) -> int:
    return int(self.node_depth.shape[0])

  def child_slots(self, node: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(pair, slot): every child slot of each node in `node`, and which node it is of.

    The vectorized step of every trie walk: `child_byte[slot]` and `child_node[slot]`
    are the children, `pair` indexes back into `node` (and any array aligned with it).
    """
    first = self.child_start[node]
    counts = self.child_start[node + 1] - first
    pair = np.repeat(np.arange(len(node), dtype=np.int32), counts)
    slot = np.arange(int(counts.sum()), dtype=np.int32) + np.repeat(
        first - (np.cumsum(counts) - counts), counts)
    return pair, slot

  @functools.cached_property
  def parent(self) -> np.ndarray:
    """int32 `[N]`: each node's parent (the root's is itself)."""
    parent = np.zeros(self.num_nodes, np.int32)
    parent[self.child_node] = np.repeat(np.arange(self.num_nodes, dtype=np.int32),
                                        np.diff(self.child_start))
    return parent

  @functools.cached_property
  def child_key(self) -> np.ndarray:
    """int64 `[N - 1]`: `node * 256 + byte` of each child slot, ascending (nodes and
    each node's bytes are in order): `searchsorted` finds the child of (node, byte)."""
    parent = np.repeat(np.arange(self.num_nodes, dtype=np.int64), np.diff(self.child_start))
    return parent * 256 + self.child_byte

  @functools.cached_property
  def token_node(self) -> np.ndarray:
    """int32, aligned with `token_ids`: the node spelling each token."""
    return np.repeat(np.arange(self.num_nodes, dtype=np.int32), np.diff(self.token_start))

  @functools.cached_property
  def token_first_byte(self) -> np.ndarray:
    """int16 `[max token id + 1]`: each token's first byte, -1 for tokens without bytes."""
    roots = self.child_node[self.child_start[0]:self.child_start[1]]
    # Nodes are numbered depth first: a subtree is a contiguous range of nodes.
    which = np.searchsorted(roots, self.token_node, side="right") - 1
    first = np.full(int(self.token_ids.max()) + 1 if len(self.token_ids) else 0, -1, np.int16)
    first[self.token_ids] = self.child_byte[self.child_start[0] + which]
    return first

  @functools.cached_property
  def is_byte_complete(self) -> bool:
    """Whether every single byte is a token (then every byte path is tokenizable)."""
    lo, hi = self.child_start[0], self.child_start[1]
    children = self.child_node[lo:hi]
    return bool(hi - lo == 256) and bool((self.token_start[children + 1] > self.token_start[children]).all())


def build_trie(vocab: Vocabulary) -> VocabTrie:
  """Builds the prefix trie of `vocab`'s token bytes.

  The nodes are the distinct prefixes in ascending order (depth first, children by
  byte): each token of the sorted vocabulary adds the prefixes past its longest common
  prefix (LCP) with the previous one. Vectorized over the tokens (0.57 -> 0.15 s for
  Gemma 3's 262k, so that a cold lexed-grammar compile stays short).
  """
  token_bytes = vocab.token_bytes
  ids = [i for i, b in enumerate(token_bytes) if b is not None]
  ids.sort(key=token_bytes.__getitem__)  # by bytes, then id
  strings = [token_bytes[i] for i in ids]
  m = len(strings)
  lens = np.fromiter(map(len, strings), np.int64, m)
  data = np.frombuffer(b"".join(strings), np.uint8)
  at = np.cumsum(lens) - lens  # where each string starts in `data`
  lcp = _adjacent_lcp(data, at, lens)
  # String k adds the nodes of depths lcp[k] + 1 .. lens[k], numbered from base[k]
  # (none for a repeat of the previous string).
  count = lens - lcp
  base = 1 + np.cumsum(count) - count
  node_k = np.repeat(np.arange(m), count)
  depth = lcp[node_k] + 1 + np.arange(int(count.sum())) - (base - 1)[node_k]
  node_id = np.arange(1, len(node_k) + 1)
  # The parent of a string's first new node is the node of its LCP prefix, added by
  # the last string before it whose own LCP is shorter.
  creator = _previous_smaller(lcp)
  first = depth == lcp[node_k] + 1
  k = node_k[first]
  j = np.maximum(creator[k], 0)
  parents = node_id - 1
  parents[first] = np.where(lcp[k] > 0, base[j] + lcp[k] - lcp[j] - 1, 0)
  parents = np.concatenate([[0], parents])
  edge_bytes = np.concatenate([[0], data[at[node_k] + depth - 1]])
  depths = np.concatenate([[0], depth])
  # A token's node: the last one its string added, or its first copy's.
  run_start = np.maximum.accumulate(np.where(count > 0, np.arange(m), 0))
  node_of_token = np.where(lens > 0, base[run_start] + count[run_start] - 1, 0)
  parent = np.asarray(parents, np.int64)
  num_nodes = len(parents)
  # Children in creation order are already sorted by byte within each parent.
  order = np.argsort(parent[1:], kind="stable") + 1
  child_start = np.zeros(num_nodes + 1, np.int32)
  np.cumsum(np.bincount(parent[1:], minlength=num_nodes), out=child_start[1:])
  token_start = np.zeros(num_nodes + 1, np.int32)
  np.cumsum(np.bincount(node_of_token, minlength=num_nodes), out=token_start[1:])
  token_ids = np.asarray(ids, np.int32)
  token_ids = token_ids[np.argsort(node_of_token, kind="stable")]
  return VocabTrie(
      child_start=child_start,
      child_byte=np.asarray(edge_bytes, np.uint8)[order],
      child_node=order.astype(np.int32),
      node_depth=np.asarray(depths, np.int32),
      token_start=token_start,
      token_ids=token_ids,
      fingerprint=vocab.fingerprint,
  )


def _adjacent_lcp(data: np.ndarray, at: np.ndarray, lens: np.ndarray) -> np.ndarray:
  """int64 `[m]`: the longest common prefix of string k and string k - 1 (0 for k = 0),
  strings k being `data[at[k]:at[k] + lens[k]]`; one pass per shared byte."""
  lcp = np.zeros(len(lens), np.int64)
  pairs = np.arange(1, len(lens))
  d = 0
  while len(pairs):
    pairs = pairs[(lens[pairs] > d) & (lens[pairs - 1] > d)]
    pairs = pairs[data[at[pairs] + d] == data[at[pairs - 1] + d]]
    lcp[pairs] = d + 1
    d += 1
  return lcp


def _previous_smaller(a: np.ndarray) -> np.ndarray:
  """int64 `[m]`: for each k, the largest j < k with a[j] < a[k], or -1 (pointer
  jumping: every j between the candidate and k holds a value >= a[k])."""
  cand = np.arange(len(a)) - 1
  todo = np.arange(1, len(a))
  while len(todo):
    c = cand[todo]
    todo = todo[(c >= 0) & (a[np.maximum(c, 0)] >= a[todo])]
    cand[todo] = cand[cand[todo]]
  return cand


_UNWRITABLE: set[str] = set()  # Cache directories already warned about.


def read_cache_file(path: str | None, names=None) -> dict | None:
  """The arrays `names` (all when None) of the file `write_cache_file` wrote at `path`,
  its file touched as recently used (pruned last); None when there is no path, or the
  file is missing (maybe pruned by another process) or damaged: the caller rebuilds.

  A path ending in `ARRAYS_SUFFIX` is an `_array_file` (mapped, pages read as touched:
  the trie and class counts; Gemma 3's trie in ~0.1 ms where its .npz took ~6 ms), any
  other a .npz."""
  if path is None:
    return None
  try:
    if path.endswith(ARRAYS_SUFFIX):
      arrays = _array_file.read(path)
      if names is not None:
        arrays = {name: arrays[name] for name in names}
    else:
      with np.load(path) as f:
        arrays = {name: f[name] for name in (f.files if names is None else names)}
  except _cache.READ_ERRORS:
    return None
  _cache.touch(path)
  return arrays


def write_cache_file(cache_dir: str, path: str, arrays: dict, save=None, *,
                     max_bytes: int | None = None) -> bool:
  """Writes `arrays` to `path` in `cache_dir` as an `_array_file` when `path` ends in
  `ARRAYS_SUFFIX`, else as .npz (or with `save(file, arrays)`), atomically (write, then
  rename, so a concurrent reader never sees a partial file, and a reader's mapping of
  the old file stays whole), then keeps the directory within `max_bytes`
  (`_cache.after_write`).

  The disk cache is an optimization: when the directory cannot be written (read-only
  home, full disk), this warns once per directory and returns False instead of failing
  the compile.
  """
  tmp = None
  try:
    os.makedirs(cache_dir, exist_ok=True)
    if save is None and path.endswith(ARRAYS_SUFFIX):
      save = _array_file.write
    fd, tmp = tempfile.mkstemp(dir=cache_dir, suffix=".tmp" if save else ".npz")
    with os.fdopen(fd, "wb") as f:
      if save is None:
        np.savez(f, **arrays)
      else:
        save(f, arrays)
    os.replace(tmp, path)
  except OSError as e:
    if tmp is not None and os.path.exists(tmp):
      os.remove(tmp)
    if cache_dir not in _UNWRITABLE:
      _UNWRITABLE.add(cache_dir)
      warnings.warn(
          f"constrained_decoding cannot write its cache in {cache_dir!r} ({e}); compiling "
          "without it (slower). Pass CompileOptions(cache_dir=...) a writable directory, "
          "or cache_dir=None to silence this.", RuntimeWarning, stacklevel=3)
    return False
  _cache.after_write(cache_dir, path, max_bytes)
  return True


def load_or_build_trie(vocab: Vocabulary, cache_dir: str | None) -> VocabTrie:
  """`build_trie`, cached in `cache_dir` under the vocabulary fingerprint (None: no cache)."""
  if cache_dir is None:
    return build_trie(vocab)
  path = os.path.join(cache_dir, f"trie-v{TRIE_FORMAT_VERSION}-{vocab.fingerprint}"
                      f"{_cache.FORMATS['trie'].suffix}")
  arrays = read_cache_file(path, _FIELDS)
  if arrays is not None:
    return VocabTrie(**arrays, fingerprint=vocab.fingerprint)
  started = time.perf_counter()
  _LOG.info("building the token trie for %r (cached afterwards)", vocab)
  trie = build_trie(vocab)
  write_cache_file(cache_dir, path, {name: getattr(trie, name) for name in _FIELDS})
  _LOG.info("trie with %d nodes built in %.2f s", trie.num_nodes,
            time.perf_counter() - started)
  return trie


def detokenizing_fst(trie: VocabTrie):
  """T_V (Alg. 1, compact trie form) as a pynini.Fst mapping token ids to bytes.

  Labels are shifted by one because OpenFst reserves 0 for epsilon: token t is input
  label t + 1 and byte b is output label b + 1. States are the root and the proper
  prefixes of tokens; the last byte of each token is emitted on an arc that consumes the
  token and returns to the root, which is the only initial and final state.
  """
  from constrained_decoding.automata import _openfst_io  # pylint: disable=g-import-not-at-top

  num_nodes = trie.num_nodes
  parent = np.zeros(num_nodes, np.int64)
  counts = np.diff(trie.child_start)
  parent[trie.child_node] = np.repeat(np.arange(num_nodes), counts)
  byte_of = np.zeros(num_nodes, np.int64)
  byte_of[trie.child_node] = trie.child_byte
  # States: nodes with children (proper prefixes of some token), root first.
  has_children = counts > 0
  has_children[0] = True
  state_of = np.full(num_nodes, -1, np.int64)
  state_of[has_children] = np.arange(int(has_children.sum()))
  inner = trie.child_node[has_children[trie.child_node]]
  token_nodes = np.repeat(np.arange(num_nodes), np.diff(trie.token_start))
  num_states = int(has_children.sum())
  final = np.zeros(num_states, bool)
  final[0] = True
  return _openfst_io.fst_from_arrays(
      num_states=num_states,
      start=0,
      final=final,
      arc_source=np.concatenate([state_of[parent[inner]], state_of[parent[token_nodes]]]),
      arc_ilabel=np.concatenate([np.zeros(len(inner), np.int64), trie.token_ids + 1]),
      arc_olabel=np.concatenate([byte_of[inner] + 1, byte_of[token_nodes] + 1]),
      arc_target=np.concatenate([state_of[inner], np.zeros(len(token_nodes), np.int64)]),
  )


def load_or_build_detokenizing_fst(vocab: Vocabulary, cache_dir: str | None):
  """`detokenizing_fst`, cached in `cache_dir` as an OpenFst file (None: no cache)."""
  import pynini  # pylint: disable=g-import-not-at-top

  if cache_dir is None:
    return detokenizing_fst(build_trie(vocab))
  path = os.path.join(cache_dir, f"tv-v{_cache.FORMATS['tv'].version}-{vocab.fingerprint}.fst")
  if os.path.exists(path):
    try:
      fst = pynini.Fst.read(path)
      _cache.touch(path)
      return fst
    except (pynini.FstIOError, OSError):
      pass  # Unreadable (or pruned meanwhile): rebuild below.
  fst = detokenizing_fst(load_or_build_trie(vocab, cache_dir))
  try:
    fd, tmp = tempfile.mkstemp(dir=cache_dir, suffix=".fst")
    os.close(fd)
    fst.write(tmp)
    os.replace(tmp, path)
  except (OSError, pynini.FstIOError):
    return fst  # Best effort, as `write_cache_file` (which has warned about the directory).
  _cache.after_write(cache_dir, path)
  return fst
