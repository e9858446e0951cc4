"""`Compiler`: the host front door, bound to one vocabulary.

spec -> constraint IR -> minimal byte DFA (pynini) -> token DFA (composition with the
vocabulary trie, Alg. 2) -> `ConstraintTables`. A grammar with a lexer
(`Grammar(..., lexer=True)`) takes its own path instead: lexer DFA x vocabulary trie and
LR(1) tables (`constraints/_lexed_grammar.py`) -> `LexedTables`.
"""

import collections
import dataclasses
import logging
import time
from typing import Protocol, runtime_checkable

import numpy as np

from constrained_decoding import _cache
from constrained_decoding import _lexed_cache
from constrained_decoding import _packing
from constrained_decoding import tables as _tables
from constrained_decoding import lexed_tables as _lexed_tables
from constrained_decoding.automata import _compose
from constrained_decoding.automata import _counting
from constrained_decoding.automata import _detokenizer
from constrained_decoding.automata import _embedded_chains
from constrained_decoding.automata import _pda_chains
from constrained_decoding.automata import _pda
from constrained_decoding.automata import _registers
from constrained_decoding.automata import _splice
from constrained_decoding.automata import _streamline
from constrained_decoding.automata import _unique_strings
from constrained_decoding.automata import _wide
from constrained_decoding.constraints import _grammar
from constrained_decoding.constraints import _ir as ir
from constrained_decoding.constraints import _json_schema
from constrained_decoding.constraints._specs import Grammar
from constrained_decoding.errors import CompileBudgetError
from constrained_decoding.errors import EmptyConstraintError
from constrained_decoding.errors import NondeterministicGrammarError
from constrained_decoding.vocab._vocabulary import Vocabulary

_log = logging.getLogger(__name__)

# Bump when compiled tables for the same spec and vocabulary would change.
FORMAT_VERSION = 1


@runtime_checkable
class Spec(Protocol):
  """What `Compiler.compile` accepts: `Regex`, and later `JsonSchema`, `Grammar`, ..."""

  def to_ir(self) -> ir.Node: ...

  def describe(self) -> str: ...


@dataclasses.dataclass(frozen=True, kw_only=True)
class CompileOptions:
  """Budgets, padding and caching for `Compiler`.

  Attributes:
    max_states: Most states a byte or token automaton may have before compilation stops
      with `CompileBudgetError` (a guard against state explosion, e.g. `(a|b)*a(a|b){20}`).
    max_edges: Most token edges the token automaton may have.
    max_table_bytes: Most bytes the packed tables may take (device memory). Every
      distinct allowed set costs a 32 KiB mask row (262k vocabulary), so bounded
      repetitions of wide classes such as `[^"]{0,200}` (200 states, each with its own
      set) hit this first; prefer `*`.
    max_seconds: Wall-clock budget for one compilation.
    min_bucket: Smallest padded size of the state, edge and mask axes. Sizes are padded
      to powers of two: a fixed bucket avoids recompiling the step function when the
      constraint changes, at the cost of up to 2x padding.
    cache_dir: Where per-vocabulary work (the token trie, terminal bitmaps, the token
      character counts of counted classes, ~0.8 MB each for Gemma 3, and the whole
      compiled tables of grammars with a lexer) is cached on disk; None disables the
      disk cache. Default: `$CONSTRAINED_DECODING_CACHE`,
      else `~/.cache/constrained_decoding` (read when the options are created; see
      `constrained_decoding/_cache.py`).
    max_cache_bytes: Size past which the files in `cache_dir` (every kind above, not the
      models/ folder) are pruned after a write, least recently used first; files of
      other format versions are deleted (`_cache.prune_cache`).
    wide_states: Represent states that loop on a large byte class (string bodies, free
      text) by one terminal edge with a cached token bitmap instead of ~255k explicit
      edges (exact; see `automata/_wide.py`). Off only to compare against plain
      composition.
    memoize: Keep compiled tables in memory, keyed by spec; `Compiler.compile` then
      returns the same object for an equal spec.
    memo_size: Number of compiled tables kept by `memoize`.
    stack_depth: Stack capacity per row for recursive grammars (push-down tables): how
      many rules may be pending at once (JSON nesting depth, roughly). Near the bound the
      mask stops offering tokens after which the row could not finish within it
      (`tables.py`, "Stack-aware masks"), so sampling never overflows; a row fed such a
      token anyway gets `error` set once it would overflow, and never reads or writes
      past the stack. A grammar none of whose inputs fits raises `CompileBudgetError`.
    max_pops, max_pushes: Most stack symbols one token may pop / push in a push-down
      automaton. Tokens that would exceed them (`"}}}}}}}}}"`) are not offered; the same
      text stays reachable through shorter tokens.
    streamline: Remove the edge groups of a push-down automaton that no reachable stack
      matches (`automata/_streamline.py`; exact). Off only to measure what it saves.
    counted_chains: Compile a bounded repetition of a wide character class (`[^"]{0,n}`,
      JSON Schema `maxLength`) with relative targets, so that its tables grow with the
      longest token instead of with n (`automata/_counting.py`; exact). Off only to
      compare against plain composition.
  """

  max_states: int = 100_000
  max_edges: int = 20_000_000
  max_table_bytes: int = 512 << 20
  max_seconds: float = 120.0
  min_bucket: int = _tables.DEFAULT_MIN_BUCKET
  cache_dir: str | None = dataclasses.field(default_factory=_cache.compiler_cache_dir)
  max_cache_bytes: int = _cache.DEFAULT_MAX_CACHE_BYTES
  wide_states: bool = True
  memoize: bool = True
  memo_size: int = 256
  stack_depth: int = 64
  max_pops: int = _pda.DEFAULT_MAX_POPS
  max_pushes: int = _pda.DEFAULT_MAX_PUSHES
  streamline: bool = True
  counted_chains: bool = True


@dataclasses.dataclass(frozen=True)
class CompileInfo:
  """What a compilation produced and what it cost (host-side; not part of the tables).

  Attributes:
    description: The spec, e.g. `Regex('a|b')`.
    byte_states: States of the minimal byte DFA (of the recursive transition network,
      all rules together, for a push-down automaton).
    token_states: States of the trimmed token DFA.
    token_edges: Explicit token edges.
    num_terminals: Distinct terminal bitmaps (wide states).
    num_masks: Distinct allowed-token sets.
    nbytes: Size of the packed tables, per array and total.
    seconds: Wall-clock time per stage.
    num_groups: Edge groups (one per state and pop sequence; push-down tables only).
    dropped_paths: Token paths of a push-down automaton not offered because they pop
      more than `CompileOptions.max_pops` symbols (paths pushing more than `max_pushes`
      are cut while exploring and not counted).
    streamlined: Groups and edges before and after streamlining (push-down tables
      compiled with `CompileOptions.streamline`), else None.

  For `LexedTables` (a grammar with a lexer): `byte_states` and `token_states` are the
  lexer DFA's states, `token_edges` the tokens listed per lexer state, `num_terminals`
  the parser's terminals, `num_masks` the token-set bitmap rows; `seconds` has the total.
  """

  description: str
  byte_states: int
  token_states: int
  token_edges: int
  num_terminals: int
  num_masks: int
  nbytes: dict[str, int]
  seconds: dict[str, float]
  num_groups: int | None = None
  dropped_paths: int = 0
  streamlined: _streamline.StreamlineReport | None = None


# Composed fragments a compiler keeps (each ~1 MB for depth-2 schema-free JSON).
_MAX_FRAGMENTS = 8
# Byte-NFA states allowed per `max_states` before the NFA is built (`_check_nfa_size`).
# The NFA is 1.0-1.4x the estimate; the largest schema of `benchmarks/schema_corpus.py`
# estimates 330k, with the default budget the bound is 1M.
_NFA_STATES_PER_STATE = 10


class Compiler:
  """Compiles constraint specs into `ConstraintTables` for one vocabulary.

  ```python
  compiler = cd.Compiler(vocab)
  tables = compiler.compile(cd.Regex(r"(yes|no)"))
  ```

  The per-vocabulary work (the token trie, i.e. the detokenizing FST T_V of Alg. 1) is
  done once here and cached on disk by the vocabulary's fingerprint.
  """

  def __init__(self, vocab: Vocabulary, options: CompileOptions | None = None):
    if not isinstance(vocab, Vocabulary):
      raise TypeError(f"Compiler got {type(vocab).__name__}. Expected a cd.Vocabulary.")
    self.vocab = vocab
    self.options = options or CompileOptions()
    # The limit of the writers not given one (trie, class counts, lexer tables).
    _cache.set_max_bytes(self.options.cache_dir, self.options.max_cache_bytes)
    self.trie = _detokenizer.load_or_build_trie(vocab, self.options.cache_dir)
    self.wide_states = _wide.WideStates(self.trie, _tables.num_words(vocab.vocab_size),
                                        self.options.cache_dir,
                                        self.options.max_cache_bytes)
    self._memo: collections.OrderedDict = collections.OrderedDict()
    # Shared fragments (schema-free JSON values) composed with the vocabulary, by name.
    self._fragments: collections.OrderedDict = collections.OrderedDict()

  def compile(self, spec: Spec) -> _tables.ConstraintTables | _lexed_tables.LexedTables:
    """Compiles `spec` into tables for this vocabulary (memoized by spec).

    `ConstraintTables`, or `LexedTables` for a grammar with a lexer
    (`Grammar(..., lexer=True)`, `Grammar.builtin("python")`); the runtime functions
    and decode loops take either.
    """
    if self.options.memoize and spec in self._memo:
      self._memo.move_to_end(spec)
      return self._memo[spec]
    tables, _ = self.compile_with_info(spec)
    if self.options.memoize:
      self._memo[spec] = tables
      while len(self._memo) > self.options.memo_size:
        self._memo.popitem(last=False)
    return tables

  def compile_with_info(self, spec: Spec) -> tuple[
      _tables.ConstraintTables | _lexed_tables.LexedTables, CompileInfo]:
    """Compiles `spec` (never memoized) and reports sizes and stage timings.

    Raises:
      UnsupportedFeatureError: The spec uses a construct that is not supported.
      EmptyConstraintError: No token sequence of this vocabulary satisfies the spec.
      CompileBudgetError: The automaton exceeds `CompileOptions` budgets.
    """
    # One deadline for the first attempt and the fallback: `max_seconds` bounds both.
    deadline = time.perf_counter() + self.options.max_seconds
    return self._compile_or_fall_back(spec, deadline)

  def _compile_or_fall_back(self, spec: Spec, deadline: float):
    try:
      return self._compile_with_info(spec, deadline)
    except CompileBudgetError as e:
      # Objects checked in registers (`automata/_registers.py`) may fail to fold (a
      # union of objects that start alike) or to determinize: fall back to objects
      # that keep schema order past the any-order budget.
      fallback = getattr(spec, "without_registers", lambda: None)()
      if fallback is None or not _registers.has_markers(_regular_ir(spec)):
        raise
      _log.info("%s: register objects failed (%s); compiling with property_order="
                "'any_bounded' instead.", spec.describe(), e)
      return self._compile_with_info(fallback, deadline)

  def _compile_with_info(self, spec: Spec, deadline: float
                         ) -> tuple[_tables.ConstraintTables | _lexed_tables.LexedTables,
                                    CompileInfo]:
    opts = self.options
    what = spec.describe()
    t0 = time.perf_counter()
    if isinstance(spec, Grammar) and spec.lexer:
      return self._compile_lexed(spec, what, t0)
    pushdown = getattr(spec, "pushdown_grammar", None)
    grammar = pushdown() if pushdown is not None else None
    if grammar is not None:
      try:
        return self._compile_pushdown(grammar, what, t0, time.perf_counter(), deadline)
      except NondeterministicGrammarError as error:
        return self._compile_aligned(spec, error, what, t0, deadline)
    node = spec.to_ir()
    t1 = time.perf_counter()
    chain = (_counting.find_chain(node) if opts.wide_states and opts.counted_chains
             else None)
    if chain is not None:
      counted = self._compile_chain(chain, what, t0, t1, deadline)
      if counted is not None:
        return counted
    # Register markers (objects and arrays checked on the device) are folded into byte
    # arcs before splicing and composition.
    if chain is None and opts.wide_states and opts.counted_chains:
      counted = self._compile_embedded_chains(node, what, t0, t1, deadline)
      if counted is not None:
        return counted
    self._check_nfa_size(node, opts.wide_states, what)
    dfa, contracted = self._byte_dfa(node, opts.wide_states)
    given = None
    if len(dfa.fragment_arcs):
      automata = [self._fragment(f, deadline, what) for f in dfa.fragments]
      spliced = _splice.splice(dfa, automata,
                               arc_ops=None if contracted is None else contracted.arc_ops)
      if spliced is None:
        self._check_nfa_size(node, False, what)
        dfa, contracted = self._inlined(node, dfa if contracted is None else contracted.source,
                                        automata)
      else:
        dfa, given = spliced
        if contracted is not None:
          contracted = dataclasses.replace(contracted, dfa=dfa, arc_ops=given.arc_ops)
    t2 = time.perf_counter()
    if dfa.num_states > opts.max_states:
      raise CompileBudgetError(
          f"{what} needs {dfa.num_states} byte-automaton states. Expected at most "
          f"CompileOptions.max_states={opts.max_states}. Raise the budget, or bound "
          f"repetitions such as '{{1000}}' and nested alternations that multiply states."
      )
    if dfa.num_states == 0:
      raise EmptyConstraintError(
          f"{what} matches no string at all. Expected a constraint with at least one "
          f"match; check for empty classes such as '[^\\x00-\\U0010ffff]'."
      )
    skip = _unique_strings.item_borders(contracted, dfa.num_states)
    if given is not None:
      skip |= given.states
    wide = (self.wide_states.find(dfa, skip, deadline=deadline, what=what)
            if opts.wide_states else {})
    token_dfa = _compose.compose_token_dfa(
        dfa, self.trie, wide=wide, token_class_bits=self.wide_states.token_class_bits,
        num_words=_tables.num_words(self.vocab.vocab_size),
        max_edges=opts.max_edges, deadline=deadline, what=what, given=given)
    t3 = time.perf_counter()
    if token_dfa.num_states == 0:
      raise EmptyConstraintError(
          f"{what} matches strings, but no sequence of tokens of {self.vocab!r} spells "
          f"one. Expected a constraint this vocabulary can produce; check for bytes the "
          f"vocabulary has no token for."
      )
    if token_dfa.num_states > opts.max_states:
      raise CompileBudgetError(
          f"{what} needs {token_dfa.num_states} token-automaton states. Expected at most "
          f"CompileOptions.max_states={opts.max_states}. Raise the budget or simplify."
      )
    guards = None
    if contracted is not None:
      guards = _registers.attach(token_dfa, token_dfa.byte_state, contracted,
                                 self.vocab.token_bytes)
    hash_bytes = (guards.token_hash.nbytes  # Distinct strings.
                  if guards is not None and guards.token_hash is not None else 0)
    packed_bytes = hash_bytes + _packing.estimate_nbytes(
        token_dfa, self.vocab, min_bucket=opts.min_bucket,
        within=opts.max_table_bytes - hash_bytes)
    if packed_bytes > opts.max_table_bytes:
      raise CompileBudgetError(
          f"{what} would need {packed_bytes / 2**20:.1f} MiB of tables "
          f"({token_dfa.num_states} states, {len(token_dfa.edge_token)} token edges, one "
          f"32 KiB mask per distinct allowed set). Expected at most "
          f"CompileOptions.max_table_bytes={opts.max_table_bytes}. Replace bounded "
          f"repetitions of wide classes such as '[^\"]{{0,200}}' with '*', or raise the "
          f"budget.")
    tables = _packing.pack_tables(token_dfa, self.vocab, min_bucket=opts.min_bucket,
                                 guards=guards)
    t4 = time.perf_counter()
    info = CompileInfo(
        description=what,
        byte_states=dfa.num_states,
        token_states=token_dfa.num_states,
        token_edges=len(token_dfa.edge_token),
        num_terminals=int(token_dfa.terminal_bits.shape[0]),
        num_masks=int(tables.group_mask[:token_dfa.num_states].max()) + 1,
        nbytes=_tables.tables_nbytes(tables),
        seconds={"parse": t1 - t0, "byte_dfa": t2 - t1, "compose": t3 - t2,
                 "pack": t4 - t3, "total": t4 - t0},
    )
    return tables, info

  @staticmethod
  def _byte_dfa(node, fragments: bool):
    """(byte DFA, `_registers.Contracted` or None): register markers folded in."""
    from constrained_decoding.automata import _fsa  # pylint: disable=g-import-not-at-top

    dfa = _fsa.compile_byte_dfa(node, fragments=fragments)
    if not len(dfa.marker_arcs):
      return dfa, None
    contracted = _registers.contract(dfa)
    return contracted.dfa, contracted

  @classmethod
  def _inlined(cls, node, dfa, automata: list):
    """`_byte_dfa(node, False)` after `_splice.splice` refused `dfa` (`node`'s DFA with
    fragment arcs, markers not folded): the same DFA, inlined from the fragments'
    automata at hand (`_splice.inline`, 2-4x faster), or compiled from the IR."""
    inlined = None if dfa is None else _splice.inline(dfa, automata)
    if inlined is None:
      return cls._byte_dfa(node, False)
    if not len(inlined.marker_arcs):
      return inlined, None
    contracted = _registers.contract(inlined)
    return contracted.dfa, contracted

  def _check_nfa_size(self, node, fragments: bool, what: str) -> None:
    """Refuses, in milliseconds, an IR whose byte NFA alone would exceed the state budget
    many times over (nested bounded repetitions multiply: `maxProperties` 200 of objects
    with `maxProperties` 200 is 40,000 copies), before minutes of building it."""
    from constrained_decoding.automata import _nfa  # pylint: disable=g-import-not-at-top

    limit = _NFA_STATES_PER_STATE * self.options.max_states
    size = _nfa.nfa_size(node, fragments)
    if size > limit:
      raise CompileBudgetError(
          f"{what} would need about {size} byte-NFA states before minimization. Expected"
          f" at most {limit} ({_NFA_STATES_PER_STATE} x CompileOptions.max_states)."
          " Nested bounded repetitions multiply (maxItems or maxProperties of items that"
          " are themselves bounded lists, '(x{1,100}){1,100}'): lower the bounds, or"
          " raise max_states.")

  def _compile_chain(self, chain, what: str, t0: float, t1: float, deadline: float):
    """A counted chain (`X{n,m}` of a wide class, `automata/_counting.py`) -> tables with
    relative targets, or None when its byte DFA is not a clean chain."""
    opts = self.options
    built = _counting.compile_chain(chain, self.trie, self.vocab, min_bucket=opts.min_bucket,
                                    max_edges=opts.max_edges,
                                    max_table_bytes=opts.max_table_bytes, deadline=deadline,
                                    what=what, cache_dir=opts.cache_dir)
    if built is None:
      return None
    tables, stats = built
    return tables, self._counted_info(tables, stats, what, {"parse": t1 - t0, "byte_dfa": 0.0},
                                      t0, t1)

  def _compile_embedded_chains(self, node, what: str, t0: float, t1: float, deadline: float):
    """Counted chains inside a larger constraint (`automata/_embedded_chains.py`) ->
    tables, or None when `node` has none or they cannot be spliced."""
    opts = self.options
    span = int(self.trie.node_depth.max(initial=0)) + 2
    marked, chains = _embedded_chains.extract(node, span)
    if not chains:
      return None
    self._check_nfa_size(marked, True, what)
    try:
      dfa, contracted = self._byte_dfa(marked, True)
    except _registers.RegisterError:
      return None  # A marker next to a chain: the chains stay inline (plain composition).
    if dfa.num_states == 0:
      return None
    spliced = _embedded_chains.splice_chains(
        dfa, chains, None if contracted is None else contracted.arc_ops)
    if spliced is None:
      return None
    dfa, copies, arc_ops = spliced
    given = None
    if len(dfa.fragment_arcs):
      automata = [self._fragment(f, deadline, what) for f in dfa.fragments]
      done = _splice.splice(dfa, automata, drop_unreached=False, arc_ops=arc_ops)
      if done is None:
        return None
      dfa, given = done
      arc_ops = given.arc_ops
    if contracted is not None:
      contracted = dataclasses.replace(contracted, dfa=dfa, arc_ops=arc_ops)
    if dfa.num_states > opts.max_states:
      raise CompileBudgetError(
          f"{what} needs {dfa.num_states} byte-automaton states. Expected at most "
          f"CompileOptions.max_states={opts.max_states}. Raise the budget, or bound "
          f"repetitions such as '{{1000}}' and nested alternations that multiply states.")
    t2 = time.perf_counter()
    skip = np.zeros(dfa.num_states, bool)
    for copy in copies:
      skip[copy.cell[copy.cell >= 0]] = True
    if given is not None:
      skip |= given.states
    skip |= _unique_strings.item_borders(contracted, dfa.num_states)
    wide = self.wide_states.find(dfa, skip, deadline=deadline, what=what)
    built = _embedded_chains.compile_tables(
        dfa, copies, given, wide, self.trie, self.vocab,
        token_class_bits=self.wide_states.token_class_bits, min_bucket=opts.min_bucket,
        max_edges=opts.max_edges, max_table_bytes=opts.max_table_bytes, deadline=deadline,
        what=what, cache_dir=opts.cache_dir, contracted=contracted)
    if built is None:
      return None
    tables, stats = built
    return tables, self._counted_info(tables, stats, what,
                                      {"parse": t1 - t0, "byte_dfa": t2 - t1}, t0, t2)

  def _counted_info(self, tables, stats: dict, what: str, seconds: dict, t0: float,
                    composing_since: float) -> CompileInfo:
    """`CompileInfo` of tables with counted chains, after checking their bytes (they
    are built directly, so the budget is checked on the real size)."""
    limit = self.options.max_table_bytes
    nbytes = _tables.tables_nbytes(tables)
    if nbytes["total"] > limit:
      raise CompileBudgetError(
          f"{what} would need {nbytes['total'] / 2**20:.1f} MiB of tables "
          f"({stats['token_states']} states, {stats['token_edges']} token edges, "
          f"{stats['num_masks']} masks of 32 KiB). Expected at most "
          f"CompileOptions.max_table_bytes={limit}. Raise the budget or lower the "
          "repetition bounds.")
    done = time.perf_counter()
    return CompileInfo(
        description=what, byte_states=stats["byte_states"],
        token_states=stats["token_states"], token_edges=stats["token_edges"],
        num_terminals=stats["num_terminals"], num_masks=stats["num_masks"], nbytes=nbytes,
        seconds={**seconds, "compose": done - composing_since, "pack": 0.0,
                 "total": done - t0})

  def _fragment(self, fragment: ir.Fragment, deadline: float,
                what: str) -> _splice.FragmentAutomaton | None:
    """`fragment` composed with this compiler's vocabulary, built once (a few kept);
    None if it cannot be spliced (`_splice.build_fragment`)."""
    if fragment not in self._fragments:
      self._fragments[fragment] = _splice.build_fragment(
          fragment, self.trie, self.wide_states, max_edges=self.options.max_edges,
          deadline=deadline, what=what)
      while len(self._fragments) > _MAX_FRAGMENTS:
        self._fragments.popitem(last=False)
    self._fragments.move_to_end(fragment)
    return self._fragments[fragment]

  def _compile_pushdown(self, grammar, what: str, t0: float, t_parsed: float,
                        deadline: float):
    """A recursive grammar -> token-level push-down automaton -> tables (Alg. 3)."""
    opts = self.options
    rtn = _pda.build_rtn(grammar)
    chains = []
    if opts.wide_states and opts.counted_chains:
      # Counted chains (`automata/_pda_chains.py`): positions laid out consecutively.
      chains = _pda_chains.find_chains(rtn, _pda_chains.grammar_classes(grammar))
    new_of = None
    if chains:
      rtn, new_of = _pda_chains.renumber(rtn, chains)
    t1 = time.perf_counter()
    token_pda, counted = self._token_pda(rtn, what, deadline, chains, new_of)
    report = None
    if opts.streamline:
      token_pda, report = _streamline.streamline(token_pda)
    terminal_counts = token_counts = second = None
    if counted is not None:
      state_rows, token_counts = counted
      token_pda, terminal_counts, second = _pda_chains.attach_counting(
          token_pda, state_rows, token_counts)
    t2 = time.perf_counter()
    tables = _packing.pack_pda_tables(token_pda, self.vocab, stack_depth=opts.stack_depth,
                                     min_bucket=opts.min_bucket, guards=token_pda.guards,
                                     terminal_counts=terminal_counts,
                                     token_counts=token_counts, second_terminals=second)
    nbytes = _tables.tables_nbytes(tables)
    if nbytes["total"] > opts.max_table_bytes:
      raise CompileBudgetError(
          f"{what} needs {nbytes['total'] / 2**20:.1f} MiB of tables "
          f"({len(token_pda.edge_token)} token edges). Expected at most "
          f"CompileOptions.max_table_bytes={opts.max_table_bytes}. Raise the budget or "
          "simplify the grammar's free-text parts.")
    t3 = time.perf_counter()
    groups = len(token_pda.group_state)
    info = CompileInfo(
        description=what, byte_states=rtn.num_states, token_states=token_pda.num_states,
        token_edges=len(token_pda.edge_token),
        num_terminals=int(token_pda.terminal_bits.shape[0]),
        num_masks=int(tables.group_mask[:groups].max(initial=0)) + 1, nbytes=nbytes,
        seconds={"parse": t_parsed - t0, "byte_dfa": t1 - t_parsed, "compose": t2 - t1,
                 "pack": t3 - t2, "total": t3 - t0},
        num_groups=groups, dropped_paths=token_pda.dropped_paths, streamlined=report)
    return tables, info

  def _compile_aligned(self, spec, error: NondeterministicGrammarError, what: str,
                       t0: float, deadline: float):
    """A JSON schema whose free-form calls (`free_form_depth=None`) made its grammar
    nondeterministic (`error`), compiled again with the calls inlined where they
    compete with inline values (`_json_schema.free_form_alignments`: at competition
    points, then through whole rules; the same language). Raises `error` when no way
    compiles, or for any other spec."""
    if getattr(spec, "free_form_depth", 2) is not None or not hasattr(spec, "options"):
      raise error
    for scope, language in _json_schema.free_form_alignments(spec.schema_value,
                                                             spec.options()):
      _log.info("%s: free-form calls make the grammar nondeterministic (%s); compiling"
                " with them inlined where they compete (scope %r).", what,
                str(error).split(":")[0], scope)
      if not isinstance(language, _grammar.GrammarIR):
        continue
      try:
        return self._compile_pushdown(language, what, t0, time.perf_counter(), deadline)
      except NondeterministicGrammarError:
        continue
    raise error

  def _token_pda(self, rtn, what: str, deadline: float, chains=(), new_of=None):
    """(The token-level push-down automaton of a recursive transition network, None or
    the `(state_rows, token_counts)` of its counted chains): with `chains`
    (`_pda_chains.find_chains`, `rtn` renumbered by `new_of`) their positions walk
    only the tokens not wholly in their class (`_pda_chains.chain_edges`)."""
    opts = self.options
    if rtn.num_states > opts.max_states:
      raise CompileBudgetError(
          f"{what} needs {rtn.num_states} automaton states. Expected at most "
          f"CompileOptions.max_states={opts.max_states}. Raise the budget or simplify.")
    # Tokens that open or finish a distinct string item must be explicit edges (guards).
    skip = (None if rtn.contracted is None
            else _unique_strings.item_borders(rtn.contracted, rtn.num_states))
    wide = self.wide_states.find(rtn.byte_dfa(), skip) if opts.wide_states else {}
    counted = None
    if chains:
      # Positions walk only the tokens not wholly in their class; the others get a
      # terminal made counting after streamlining (`_pda_chains.attach_counting`).
      extra, state_rows, token_counts = _pda_chains.chain_edges(
          chains, new_of, wide, self.trie, self.vocab,
          _tables.num_words(self.vocab.vocab_size), opts.cache_dir)
      if state_rows:
        wide = {**wide, **extra}
        counted = state_rows, token_counts
    token_pda = _pda.compose_token_pda(
        rtn, self.trie, vocab_bytes=self._token_text, wide=wide,
        num_words=_tables.num_words(self.vocab.vocab_size), max_pops=opts.max_pops,
        max_pushes=opts.max_pushes, max_edges=opts.max_edges, deadline=deadline, what=what,
        token_bytes=self.vocab.token_bytes)
    return token_pda, counted

  def _compile_lexed(self, spec, what: str, t0: float
                     ) -> tuple[_lexed_tables.LexedTables, CompileInfo]:
    """A Lark grammar with a lexer -> `LexedTables`: the lexer-state x token table
    (cached in `cache_dir`) and canonical LR(1) tables, stepped by `runtime/_lexed.py`
    with a parser stack of `stack_depth` entries. Not bounded by `max_seconds`."""
    from constrained_decoding.constraints import _lexed_grammar  # pylint: disable=g-import-not-at-top

    opts = self.options
    # Whole tables cached on disk by every input (`_lexed_cache.py`).
    kwargs = dict(start=spec.start_rule, stack_depth=opts.stack_depth,
                  indentation=spec.indentation, semicolons=spec.semicolons)
    compiled = _lexed_cache.load_or_compile(
        spec.text, self.vocab, kwargs, opts.cache_dir, max_cache_bytes=opts.max_cache_bytes,
        build=lambda: _lexed_grammar.compile_lexed_grammar(
            spec.text, self.vocab, **kwargs, cache_dir=opts.cache_dir, trie=self.trie))
    tables = arrays = compiled.tables
    nbytes = tables.nbytes
    if nbytes["total"] > opts.max_table_bytes:
      raise CompileBudgetError(
          f"{what} needs {nbytes['total'] / 2**20:.1f} MiB of tables "
          f"({compiled.lexer_states} lexer states, {arrays.action.shape[0]} parser "
          f"states). Expected at most CompileOptions.max_table_bytes="
          f"{opts.max_table_bytes}. Raise the budget, or lower Indentation.max_width.")
    total = time.perf_counter() - t0
    info = CompileInfo(
        description=what, byte_states=compiled.lexer_states,
        token_states=compiled.lexer_states,
        token_edges=int((arrays.state_small_tokens < arrays.vocab_size).sum()),
        num_terminals=compiled.num_terminals, num_masks=int(arrays.set_bits.shape[0]),
        nbytes=nbytes, seconds={"total": total})
    return tables, info

  def _token_text(self, token: int) -> bytes:
    return self.vocab.token_bytes[token] or b""


def _regular_ir(spec) -> ir.Node:
  """`spec.to_ir()`, or for specs compiled as push-down grammars the union of the
  grammar's rule bodies (what `_registers.has_markers` looks into)."""
  pushdown = getattr(spec, "pushdown_grammar", None)
  grammar = pushdown() if pushdown is not None else None
  if grammar is not None:
    return ir.union(*(grammar[name] for name in grammar.names))
  return spec.to_ir()


# Compilers shared by callers that only have a vocabulary (`generate(constraint=spec)`),
# most recently used last; each holds its vocabulary's trie and memoized tables.
_SHARED: collections.OrderedDict = collections.OrderedDict()
_SHARED_SIZE = 4


def compiler_for(vocab: Vocabulary) -> Compiler:
  """A `Compiler` with default options for `vocab`, shared by every caller in the process.

  ```python
  tables = compiler_for(model.vocab).compile(cd.Regex(r"yes|no"))
  ```

  Keyed by the vocabulary's fingerprint, so two equal vocabularies (e.g. loaded twice
  from one GGUF file) share one compiler, its trie and its memo of compiled specs. The
  few most recently used compilers are kept.
  """
  if not isinstance(vocab, Vocabulary):
    raise TypeError(f"compiler_for got {type(vocab).__name__}. Expected a cd.Vocabulary.")
  compiler = _SHARED.get(vocab)
  if compiler is None:
    compiler = _SHARED[vocab] = Compiler(vocab)
    while len(_SHARED) > _SHARED_SIZE:
      _SHARED.popitem(last=False)
  _SHARED.move_to_end(vocab)
  return compiler
