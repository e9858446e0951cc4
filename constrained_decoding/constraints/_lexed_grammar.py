"""Host compiler of grammars with a lexer into two-level tables (issue 18, increment 3).

A Lark grammar with terminals, `%ignore` and keywords becomes the arrays that
`runtime/_lexed.py` steps inside `jax.jit` (design: docs/lexer_runtime.md):

* the lexer level, shared by every parse state: the lexer DFA (`automata/_lexer.py`)
  composed with the vocabulary trie into the lexer-state x token table, where each
  lexer state's live tokens fall into *outcome classes* (same completed lexeme
  sequence, same final lexer state); per lexer state, its outcome classes padded to
  `K` slots, and the tokens of each slot: sets of >= 256 tokens as bitmap rows, smaller
  ones as one sorted token list per state (token, slot);
* the parser level: canonical LR(1) tables over the terminals (`constraints/_lr.py`,
  `method="lr1"`). Canonical LR(1) never reduces on a lookahead it then rejects, so
  "terminal t can come next" is one table bit, `action[top, t] != error`: that makes
  the check of a pending partial lexeme one AND of two small bitsets;
* the glue: per lexeme class, its parser terminals in priority order (the parser takes
  the first with an action: a contextual choice, as Lark's contextual lexer makes; a
  keyword, a word literal, is a class of its own: it beats the regex terminals that
  also match it, NAME);
  per lexer state, the terminals a lexeme pending there can still become (`viable`), and
  whether it can become an ignored lexeme or is empty (`free`); per lexer state, what
  the end of the text emits there;
* Python-style indentation (`Indentation`): the newline lexeme built per indentation
  width (one lexeme class each), the bracket classes, and per parser state whether a
  newline there opens a block (needs an INDENT, so room on the device's stack);
* Go-style automatic semicolons (`Semicolons`): two lexer modes (after a trigger
  lexeme, a line break is a `;`), static in the lexer and its token table
  (`_lexer.with_semicolon_modes`); the end of the text adds the `;` that mode A owes.

Split along concepts: the arrays and their codes are `_lexed_arrays.py`'s, the lexer
options `_lexed_options.py`'s, the host reference stepper `_lexed_reference.py`'s (the
device step is tested against it); their names are re-exported here.

Public:
  LexedArrays                              the numpy arrays (+ host information).
  Indentation                              INDENT/DEDENT options (Lark's PythonIndenter).
  Semicolons                               Go's automatic semicolon insertion.
  compile_lexed_grammar(text, vocab, ...)  a Lark grammar + vocabulary -> LexedArrays.
  stack_lexed_arrays(arrays)               several grammars in one table set.
  LexedReference(arrays)                   host reference: allowed set and advance.
"""

import dataclasses

import numpy as np

from constrained_decoding import _arrays
from constrained_decoding import errors
from constrained_decoding.automata import _detokenizer
from constrained_decoding.automata import _lexer
from constrained_decoding.automata import _token_table
from constrained_decoding.constraints import _lr
# Re-exported: the names this module had before the split.
from constrained_decoding.constraints._lexed_arrays import DEDENT_ID
from constrained_decoding.constraints._lexed_arrays import END_DEAD
from constrained_decoding.constraints._lexed_arrays import END_NOTHING
from constrained_decoding.constraints._lexed_arrays import INDENT_ID
from constrained_decoding.constraints._lexed_arrays import NEWLINE_ID
from constrained_decoding.constraints._lexed_arrays import WIDTH_BAD
from constrained_decoding.constraints._lexed_arrays import WIDTH_EOF
from constrained_decoding.constraints._lexed_arrays import WIDTH_NONE
from constrained_decoding.constraints._lexed_arrays import LexedArrays
from constrained_decoding.constraints._lexed_options import Indentation
from constrained_decoding.constraints._lexed_options import Semicolons
from constrained_decoding.constraints._lexed_reference import LexedReference

# The lexer DFA's reachability, under the name the tests use.
_reachable = _lexer.reachable

__all__ = [
    "DEDENT_ID",
    "END_DEAD",
    "END_NOTHING",
    "INDENT_ID",
    "Indentation",
    "LexedArrays",
    "LexedReference",
    "NEWLINE_ID",
    "Semicolons",
    "WIDTH_BAD",
    "WIDTH_EOF",
    "WIDTH_NONE",
    "compile_lexed_grammar",
    "stack_lexed_arrays",
]

def _pack_bits(rows: np.ndarray, width: int) -> np.ndarray:
  """bool [R, n] -> uint32 [R, ceil(width / 32)] (bit i % 32 of word i // 32)."""
  words = max((width + 31) // 32, 1)
  padded = np.zeros((rows.shape[0], words * 32), np.uint8)
  padded[:, :rows.shape[1]] = rows
  return np.packbits(padded, axis=1, bitorder="little").view(np.uint32).reshape(
      rows.shape[0], words)


def _pack_rows(row: np.ndarray, n_rows: int, *columns) -> list:
  """Entries grouped by `row` (ascending) as left-aligned rows: per (values, fill) of
  `columns`, int32 [n_rows, max(entries of a row, 1)] padded with fill."""
  counts = np.bincount(row, minlength=n_rows)
  width = max(int(counts.max()) if len(row) else 0, 1)
  col = np.arange(len(row)) - (np.cumsum(counts) - counts)[row]
  out = []
  for values, fill in columns:
    a = np.full((n_rows, width), fill, np.int32)
    a[row, col] = values
    out.append(a)
  return out


def _state_slots(tt: _token_table.TokenTable, n_states: int, vocab_size: int) -> dict:
  """The per-lexer-state arrays of `LexedArrays` that lay out `tt`'s outcome classes:
  `state_outcomes`, `state_seq_lanes`, `state_slot_lane`, `state_big_slot`,
  `state_big_row`, `state_small_tokens`, `state_small_slot` (class k of state s is
  slot k - class_start[s])."""
  counts = np.diff(tt.class_start)
  k_state = np.repeat(np.arange(n_states), counts)
  k_slot = np.arange(len(k_state)) - tt.class_start[k_state]
  out = {}
  (out["state_outcomes"],) = _pack_rows(k_state, n_states, (np.arange(len(k_state)), -1))
  big = tt.class_set < tt.num_bitmaps
  out["state_big_slot"], out["state_big_row"] = _pack_rows(
      k_state[big], n_states, (k_slot[big], -1), (tt.class_set[big], -1))
  # Smaller sets: each state's tokens ascending (a token is in one class of a state),
  # sorted as one packed key (state, token, slot).
  small = np.nonzero(~big)[0]
  j = tt.class_set[small] - tt.num_bitmaps
  lo, hi = tt.set_start[j].astype(np.int64), tt.set_start[j + 1].astype(np.int64)
  cls = np.repeat(small, hi - lo)
  k_max = out["state_outcomes"].shape[1]
  key = np.sort((k_state[cls] * (vocab_size + 1)
                 + tt.set_tokens[_token_table.ranges(lo, hi)]) * k_max + k_slot[cls])
  out["state_small_tokens"], out["state_small_slot"] = _pack_rows(
      key // k_max // (vocab_size + 1), n_states,
      (key // k_max % (vocab_size + 1), vocab_size), (key % k_max, -1))
  # Distinct sequences per state: one parser lane each, ascending.
  n_seq = len(tt.seq_start)
  pairs, lane = _arrays.sorted_unique(k_state * n_seq + tt.class_seq, return_inverse=True)
  (out["state_seq_lanes"],) = _pack_rows(pairs // n_seq, n_states, (pairs % n_seq, -1))
  lane_counts = np.bincount(pairs // n_seq, minlength=n_states)
  out["state_slot_lane"] = np.full(out["state_outcomes"].shape, -1, np.int32)
  out["state_slot_lane"][k_state, k_slot] = (lane.reshape(-1)
                                             - (np.cumsum(lane_counts) - lane_counts)[k_state])
  return out


def _beaten_by_keywords(terms, dfas, defs) -> tuple[str, ...]:
  """The regex terminals that match a word literal (a keyword): NAME for `"select"`.

  A keyword is a whole lexeme of its own (`SELECT` never reads as NAME, `SELECTa` is
  one NAME), as Lark's basic lexer makes it. Punctuation literals do not beat regexes:
  `*` is STAR or OPERATOR, whichever the parser can take (a lexeme class). `dfas`:
  the terms' `_lexer.terminal_dfas`. (The keyword's own DFA stays live along its text,
  so a lexer of `terms` reads it as one lexeme, of the class of every terminal that
  matches it whole: running it through each DFA finds the same names.)
  """
  literal = {t.name for t in terms if t.literal}
  beaten = set()
  for t in terms:
    text = defs[t.name].literal if t.name in defs else None
    if t.literal and text and all(ch.isalnum() or ch == "_" for ch in text):
      data = text.encode("utf-8")
      beaten.update(u.name for u, d in zip(terms, dfas)
                    if u.name not in literal and _lexer.dfa_accepts(d, data))
  return tuple(sorted(beaten))


def compile_lexed_grammar(text: str, vocab, *, start: str = "start",
                          stack_depth: int = 64, token_table=None,
                          indentation: Indentation | None = None,
                          semicolons: Semicolons | None = None,
                          cache_dir: str | None = None, trie=None) -> LexedArrays:
  """Compiles a Lark grammar with a lexer for the vocabulary `vocab`.

  ```python
  arrays = compile_lexed_grammar('''
      start: NAME ("," NAME)*
      NAME: /[a-z]+/
      %ignore " "
  ''', vocab)
  ```

  Args:
    text: The Lark grammar: rules over terminals, terminal definitions, `%ignore`,
      `%import common.*`. Word literals (keywords) beat the regex terminals that also
      match them (NAME); other literals share their text with such terminals and the
      parser picks (`*`: STAR or OPERATOR).
    vocab: A `Vocabulary`.
    start: The start rule.
    stack_depth: Capacity of the device parser stack (a row refuses a token that
      would push past it).
    token_table: A prebuilt `_token_table.TokenTable` of this grammar's lexer and `vocab`
      (e.g. from `_token_table.load_or_build_token_table`); built when None.
    indentation: Python-style INDENT/DEDENT (`Indentation`), or None.
    semicolons: Go-style automatic semicolons (`Semicolons`), or None.
    cache_dir: Where the vocabulary trie and the lexer-state x token table are kept
      between compiles, by (vocabulary, lexer) fingerprint: `_cache.compiler_cache_dir()`
      (the `Compiler`'s default) shares the trie with it. None: both are built.
    trie: The vocabulary's `_detokenizer.VocabTrie` when the caller has it (a
      `Compiler` does); loaded or built from `cache_dir` when None.

  Raises:
    ConstraintError: `stack_depth` is not an int >= 2, or both `indentation` and
      `semicolons` are given.
    GrammarSyntaxError, UnsupportedGrammarFeatureError: as `_lr.read_lark_rules`.
    UnsupportedGrammarFeatureError: a terminal the rules use has no pattern
      (`%declare`d), other than `indentation`'s; with `indentation`, its terminals
      are missing, or a newline could need an INDENT that a reduction decides; with
      `semicolons`, its terminals are missing or its newlines not ignored.
    NondeterministicGrammarError: the rules are not LR(1) (as `_lr.build_tables`), or a
      lexeme class holds two terminals that one parser state both accepts.
    GrammarError: a terminal matches the empty string or nothing.
  """
  if isinstance(stack_depth, bool) or not isinstance(stack_depth, int) or stack_depth < 2:
    raise errors.ConstraintError(f"stack_depth {stack_depth!r} is not an int >= 2. Expected"
                                 " the capacity of the parser stack, e.g. 64.")
  if indentation is not None and semicolons is not None:
    raise errors.ConstraintError(
        "compile_lexed_grammar got both indentation and semicolons. Expected at most one"
        " lexer mode option (Python's or Go's). Pass one.")
  grammar = _lr.read_lark_rules(text, start=start)
  defs = {d.name: d for d in grammar.terminal_defs}
  if semicolons is not None:
    semicolons.check(grammar)
  built = ()
  if indentation is not None:
    indentation.check()
    built = (indentation.newline, indentation.indent, indentation.dedent)
    absent = [t for t in built if t not in grammar.terminals]
    if absent:
      raise errors.UnsupportedGrammarFeatureError(
          f"Lark grammar does not use the indentation terminals {absent}. Expected rules"
          f" over {list(built)} (the newline defined, the other two %declare'd), as for"
          " Lark's PythonIndenter. Use them, or name yours in Indentation(...).")
    # Their ids are fixed (1, 2, 3) so that the device step knows them in any stack.
    grammar = dataclasses.replace(
        grammar, terminals=built + tuple(t for t in grammar.terminals if t not in built),
        terminal_defs=tuple(d for d in grammar.terminal_defs if d.name not in built))
    defs = {d.name: d for d in grammar.terminal_defs}
  missing = [t for t in grammar.terminals
             if t not in built and (defs.get(t) is None or defs[t].pattern is None)]
  if missing:
    raise errors.UnsupportedGrammarFeatureError(
        f"Lark grammar uses the terminals {missing} without a pattern (%declare). Expected"
        " every terminal the rules use to be defined by a string or a regex (INDENT and"
        " DEDENT come from `indentation`; Go's inserted semicolons are the `;` terminal"
        " itself, with `semicolons`). Define them.")
  terms, ignored = _lexer.terminals_from_grammar(grammar)
  # Pattern fragments: a terminal named `_X` that no rule uses and no `%ignore` names
  # is only a piece of other terminals' patterns (already inlined there), never a
  # lexeme of its own (`_FFIELD_D` of python_lexed.lark would otherwise read `{x}` in
  # code as one lexeme). Unused terminals without the underscore stay lexemes that no
  # rule takes (BAD_NUMBER: `1if` is one refused lexeme).
  terms = [t for t in terms if not (t.name.startswith("_") and t.name not in grammar.terminals
                                    and t.name not in ignored)]
  # Python's newline lexemes (one per indentation width) join the grammar's terminals.
  extra = ([_lexer.Terminal(n, rx) for n, rx in indentation.newline_terminals()]
           if indentation is not None else [])
  try:
    dfas = _lexer.terminal_dfas(terms + extra)
    beaten = _beaten_by_keywords(terms, dfas[:len(terms)], defs)
    lexer = _lexer.build_lexer_dfa(terms + extra, ignored=ignored, keyword_beats=beaten,
                                   dfas=dfas)
    if semicolons is not None:
      lexer = _lexer.with_semicolon_modes(
          lexer, semicolon=semicolons.semicolon, triggers=semicolons.triggers,
          newlines=semicolons.newlines)
  except ValueError as e:
    raise errors.GrammarError(f"Lark grammar's terminals cannot be lexed: {e}. Expected "
                              "terminals that match a non-empty string, and semicolon"
                              " terminals of their own lexeme classes. Change them.") from e
  lr = _lr.build_tables(grammar, method="lr1")
  if token_table is None:
    if trie is None:
      trie = _detokenizer.load_or_build_trie(vocab, cache_dir)
    token_table = _token_table.load_or_build_token_table(lexer, trie, cache_dir,
                                                         vocab.vocab_size)
  num_t = len(lr.terminals)

  # Lexeme classes -> parser terminals; refuse a class two of whose members one state
  # accepts (which one the text means would be a guess).
  members = [[lr.terminal_id(n) for n in cls if n in lr.terminals[1:]]
             for cls in lexer.classes]
  # Newline lexemes: their width (or WIDTH_BAD) per class; one more class, the end of
  # the text's newline (WIDTH_EOF); bracket terminals.
  class_width = np.full(len(members) + 1, WIDTH_NONE, np.int32)
  class_paren = np.zeros(len(members) + 1, np.int32)
  if indentation is not None:
    prefix = indentation.newline + "@"
    for c, cls in enumerate(lexer.classes):
      if cls[0].startswith(prefix):
        tail = cls[0][len(prefix):]
        class_width[c] = WIDTH_BAD if tail == "x" else int(tail)
        members[c] = [NEWLINE_ID]
    class_width[-1] = WIDTH_EOF
    for c, cls in enumerate(lexer.classes):
      for names, sign in ((indentation.open, 1), (indentation.close, -1)):
        if cls[0] in names:
          class_paren[c] = sign
  members.append([])
  nl_needs_indent = _newline_needs_indent(lr, indentation)
  _check_newline_first(lr, indentation)
  goto_id, goto_chain = _unit_chains(lr)
  width = max([len(m) for m in members] + [1])
  class_members = np.full((max(len(members), 1), width), -1, np.int32)
  for c, m in enumerate(members):
    class_members[c, :len(m)] = m
    if len(m) > 1:
      both = (lr.action[:, m] != 0).sum(axis=1) > 1
      if both.any():
        q = int(np.argmax(both))
        names = [lr.terminals[t] for t in m if lr.action[q, t] != 0]
        raise errors.NondeterministicGrammarError(
            f"Lark grammar's terminals {names} match the same text and parser state {q}"
            f" accepts both. Expected at most one terminal of a lexeme class "
            f"{lexer.classes[c]} to be possible in any parser state. Make the terminals"
            " distinct (or give one a pattern the other does not match).")

  # Lexer states: what a pending lexeme can still become, and what the end emits.
  n_states = lexer.num_states
  reach = _lexer.reachable(lexer.transitions)
  cls_of = lexer.state_class
  class_terms = np.zeros((max(len(members), 1), max(num_t, 1)), bool)
  for c, m in enumerate(members[:-1]):
    if not lexer.class_ignored[c] and class_width[c] == WIDTH_NONE:
      class_terms[c, m] = True
  reach_cls = np.zeros((n_states, max(len(members), 1)), bool)
  rs, rt = np.nonzero(reach & (cls_of >= 0)[None, :])
  reach_cls[rs, cls_of[rt]] = True
  viable = (reach_cls.astype(np.int32) @ class_terms.astype(np.int32)) > 0
  state_viable = _pack_bits(viable, num_t)
  # Newline lexemes a pending lexeme can become: any (fine inside brackets), one with
  # a width (the parser then decides).
  state_nl_any = (reach_cls & (class_width != WIDTH_NONE)[None, :]).any(axis=1)
  state_nl_width = (reach_cls & (class_width >= 0)[None, :]).any(axis=1)
  ign = np.asarray(lexer.class_ignored, bool)
  state_free = (reach_cls[:, :len(ign)] & ign[None, :]).any(axis=1) if len(ign) else (
      np.zeros(n_states, bool))
  state_free[lexer.is_start] = True
  state_end_item = np.where(cls_of >= 0, lexer.emitted, END_DEAD).astype(np.int32)
  state_end_item[lexer.is_start] = END_NOTHING
  state_end_tail = np.full(n_states, -1, np.int32)
  lex_start = lexer.start
  if semicolons is not None:
    # Mode A at the end (after the pending lexeme): Go's scanner adds a `;`.
    a_mode = lexer.restart_states != lexer.start
    state_end_tail[a_mode] = lexer.classes.index((semicolons.semicolon,))
  if indentation is not None:
    # A newline pending at the end is trailing blank text: the end newline replaces it.
    pending_nl = (state_end_item >= 0) & (class_width[np.maximum(state_end_item, 0)]
                                          != WIDTH_NONE)
    state_end_item[pending_nl] = END_NOTHING
    state_end_tail[:] = len(members) - 1
    # The text starts at a line start: inside a newline lexeme.
    lex_start = int(lexer.transitions[lexer.start, ord("\n")])

  # Outcome slots per lexer state, and their tokens.
  tt = token_table
  slots = _state_slots(tt, n_states, vocab.vocab_size)
  words = (vocab.vocab_size + 31) // 32
  set_bits = tt.set_bits if tt.num_bitmaps else np.zeros((1, words), np.uint32)
  n_seq = len(tt.seq_start) - 1
  (seq_items,) = _pack_rows(np.repeat(np.arange(n_seq), np.diff(tt.seq_start)), n_seq,
                            (tt.seq_items, -1))

  eos = np.zeros((1, vocab.vocab_size), bool)
  eos[0, list(vocab.eos_ids)] = True
  return LexedArrays(
      lex_start=np.array([lex_start], np.int32), lr_start=np.zeros(1, np.int32),
      **slots, outcome_seq=tt.class_seq.astype(np.int32),
      outcome_final=tt.class_final.astype(np.int32), seq_items=seq_items,
      class_members=class_members, set_bits=np.asarray(set_bits, np.uint32),
      state_viable=state_viable, state_free=state_free,
      state_end_item=state_end_item, state_end_tail=state_end_tail,
      state_nl_any=state_nl_any, state_nl_width=state_nl_width, class_width=class_width,
      class_paren=class_paren, nl_needs_indent=nl_needs_indent,
      max_width=np.array(indentation.max_width if indentation else 0, np.int32),
      eos_bits=_pack_bits(eos, vocab.vocab_size)[0],
      action=lr.action.astype(np.int32), action_bits=_pack_bits(lr.action != 0, num_t),
      goto=lr.goto.astype(np.int32), goto_id=goto_id, goto_chain=goto_chain,
      rule_lhs=lr.rule_lhs.astype(np.int32),
      rule_len=lr.rule_len.astype(np.int32), vocab_size=int(vocab.vocab_size),
      stack_depth=int(stack_depth),
      indent_depth=indentation.max_depth if indentation else 1, lexer=lexer,
      token_table=tt, lr=lr, grammar=grammar, vocab=vocab, indentation=indentation,
      semicolons=semicolons)


def _unit_chains(lr: _lr.LrTables) -> tuple[np.ndarray, np.ndarray]:
  """(goto_id [Q, Nt], goto_chain [E, T]): goto entries, and where each leads under a
  lookahead after the reductions by unit productions that follow it.

  A unit production `A: X` pops one state and pushes `goto[q, A]` for the same state q
  below, so a chain of them after entering `goto[q, A]` under lookahead t depends on
  (q, A, t) only; canonical LR(1) reduces only on a lookahead it then shifts, so the
  device's choice of terminal never changes along a chain. -1: the chain meets a
  missing goto (never, for tables that `_lr` built).
  """
  goto = lr.goto
  qs, ns = np.nonzero(goto >= 0)
  goto_id = np.full(goto.shape, -1, np.int32)
  goto_id[qs, ns] = np.arange(len(qs), dtype=np.int32)
  num_t = lr.action.shape[1]
  chain = np.repeat(goto[qs, ns][:, None], num_t, axis=1).astype(np.int32)
  # (state, lookahead) pairs that reduce by a unit production; only the chains that
  # enter one are followed (a few of the 2.6M (entry, lookahead) pairs for Python).
  unit_reduce = (lr.action < -1) & (lr.rule_len == 1)[np.maximum(-lr.action - 1, 0)]
  rows, cols = np.nonzero(unit_reduce[chain[:, 0]])
  for _ in range(goto.shape[1] + 1):  # A chain visits each nonterminal at most once.
    if not len(rows):
      break
    p = -lr.action[chain[rows, cols], cols] - 1
    chain[rows, cols] = at = goto[qs[rows], lr.rule_lhs[p]]
    more = (at >= 0) & unit_reduce[np.maximum(at, 0), cols]
    rows, cols = rows[more], cols[more]
  if lr.action.shape[0] < 2**15:  # Half the bytes (stacked tables widen it again).
    chain = chain.astype(np.int16)
  return goto_id, chain


def _check_newline_first(lr: _lr.LrTables, indentation) -> None:
  """With indentation the text starts at a line start: the parser's first terminal is
  the newline (`Indentation`), so a start rule that cannot begin with it (`start:
  stmt+`) would allow no token at all. Raises UnsupportedGrammarFeatureError then."""
  if indentation is not None and lr.action[0, NEWLINE_ID] == 0:
    raise errors.UnsupportedGrammarFeatureError(
        f"Lark grammar's start rule cannot begin with {indentation.newline}, and with"
        " indentation the text starts at a line start (a newline lexeme first), so no"
        f" token would be allowed. Expected a start rule that takes {indentation.newline}"
        f" first, as Python's `file_input: ({indentation.newline} | stmt)*`. Write the"
        " start rule so.")


def _newline_needs_indent(lr: _lr.LrTables, indentation) -> np.ndarray:
  """bool [Q]: a newline shifted in state q leaves a state whose only action is INDENT.

  That is the only case where a newline needs room on the indentation stack (checked
  in the mask before the newline is taken, so no row is left without a token).

  Raises:
    UnsupportedGrammarFeatureError: some state entered by a reduction (a goto target)
      shifts a newline into such a state, or a newline leaves a state that needs
      neither INDENT nor any lexeme (the mask could not see it one lexeme ahead).
  """
  q = lr.action.shape[0]
  out = np.zeros(q, bool)
  if indentation is None:
    return out
  a = lr.action[:, NEWLINE_ID]
  shifts = a > 0
  after = np.maximum(a - 1, 0)
  live = lr.action[after] != 0  # [Q, T]
  only_indent = live[:, INDENT_ID] & (live.sum(axis=1) == 1)
  out = shifts & only_indent
  lexemes = live.copy()
  lexemes[:, [0, INDENT_ID, DEDENT_ID]] = False
  stuck = shifts & ~only_indent & ~lexemes.any(axis=1)
  targets = np.zeros(q, bool)
  targets[lr.goto[lr.goto >= 0]] = True
  bad = np.nonzero((out & targets) | stuck)[0]
  if len(bad):
    raise errors.UnsupportedGrammarFeatureError(
        f"Lark grammar's newline in parser state {int(bad[0])} is followed by neither a"
        " lexeme nor INDENT alone, or that state is entered by a reduction. Expected"
        f" `{indentation.newline} {indentation.indent}` right after the terminal that"
        " opens a block (as `suite: _NEWLINE _INDENT stmt+ _DEDENT` after `:`). Write"
        " the block rule so.")
  return out


def _pad(a: np.ndarray, width: int, fill) -> np.ndarray:
  """`a` [n, w] padded on the right to [n, width] with `fill`."""
  out = np.full((a.shape[0], width), fill, a.dtype)
  out[:, :a.shape[1]] = a
  return out


def _shift(a: np.ndarray, offset: int, *, keep_below: int = 0) -> np.ndarray:
  """`a + offset` where `a >= keep_below` (ids), `a` itself elsewhere (sentinels)."""
  a = a.astype(np.int32)  # (an int16 table plus an offset must not wrap)
  return np.where(a >= keep_below, a + offset, a).astype(np.int32)


def stack_lexed_arrays(parts) -> LexedArrays:
  """Several compiled grammars of one vocabulary as one table set.

  Row r of a batch then follows grammar `constraint_ids[r]` (`runtime/_lexed.init_state`):
  every id (lexer state, outcome, sequence, lexeme class, bitmap row, parser state,
  production) is offset into one range, widths are padded to the widest grammar, so
  each row steps only its own grammar's part and one compiled step serves them all.

  Raises:
    VocabularyMismatchError: the grammars were compiled for different vocabularies.
  """
  parts = list(parts)
  if not parts:
    raise errors.ConstraintError("stack_lexed_arrays got no tables. Expected at least one"
                                 " LexedArrays.")
  first = parts[0]
  for i, p in enumerate(parts):
    mine, theirs = (getattr(x.vocab, "fingerprint", None) for x in (p, first))
    if p.vocab_size != first.vocab_size or mine != theirs:
      raise errors.VocabularyMismatchError(
          f"stack_lexed_arrays: tables {i} were compiled for another vocabulary than"
          f" tables 0 ({p.vocab_size} tokens, fingerprint {str(mine)[:12]}, against"
          f" {first.vocab_size}, {str(theirs)[:12]}). Expected one vocabulary. Compile"
          " them with the same one.")
  width = lambda f, axis=1: max(getattr(p, f).shape[axis] for p in parts)
  out = {f: [] for f in LexedArrays.ARRAY_FIELDS if f not in ("eos_bits", "max_width")}
  off = dict(state=0, outcome=0, seq=0, cls=0, bitmap=0, lr=0, rule=0, goto=0)
  gotos = []
  for p in parts:
    out["lex_start"].append(p.lex_start + off["state"])
    out["lr_start"].append(p.lr_start + off["lr"])
    out["state_outcomes"].append(_pad(_shift(p.state_outcomes, off["outcome"]),
                                      width("state_outcomes"), -1))
    out["state_seq_lanes"].append(_pad(_shift(p.state_seq_lanes, off["seq"]),
                                       width("state_seq_lanes"), -1))
    out["state_slot_lane"].append(_pad(p.state_slot_lane, width("state_slot_lane"), -1))
    out["outcome_seq"].append(p.outcome_seq + off["seq"])
    out["outcome_final"].append(p.outcome_final + off["state"])
    out["seq_items"].append(_pad(_shift(p.seq_items, off["cls"]), width("seq_items"), -1))
    out["class_members"].append(_pad(p.class_members, width("class_members"), -1))
    out["state_big_slot"].append(_pad(p.state_big_slot, width("state_big_slot"), -1))
    out["state_big_row"].append(_pad(_shift(p.state_big_row, off["bitmap"]),
                                     width("state_big_row"), -1))
    out["set_bits"].append(p.set_bits)
    out["state_small_tokens"].append(_pad(p.state_small_tokens, width("state_small_tokens"),
                                          first.vocab_size))
    out["state_small_slot"].append(_pad(p.state_small_slot, width("state_small_slot"), -1))
    out["state_viable"].append(_pad(p.state_viable, width("state_viable"), 0))
    out["state_free"].append(p.state_free)
    out["state_end_item"].append(_shift(p.state_end_item, off["cls"]))
    out["state_end_tail"].append(_shift(p.state_end_tail, off["cls"]))
    out["state_nl_any"].append(p.state_nl_any)
    out["state_nl_width"].append(p.state_nl_width)
    out["class_width"].append(p.class_width)
    out["class_paren"].append(p.class_paren)
    out["nl_needs_indent"].append(p.nl_needs_indent)
    # Shifts move to offset states; reductions name offset productions; -1 (accept)
    # and 0 (error) stay.
    action = np.where(p.action > 0, p.action + off["lr"],
                      np.where(p.action < -1, p.action - off["rule"], p.action))
    out["action"].append(_pad(action.astype(np.int32), width("action"), 0))
    out["action_bits"].append(_pad(p.action_bits, width("action_bits"), 0))
    out["goto_id"].append(_pad(_shift(p.goto_id, off["goto"]), width("goto_id"), -1))
    out["goto_chain"].append(_pad(_shift(p.goto_chain, off["lr"]), width("goto_chain"), -1))
    gotos.append(_pad(_shift(p.goto, off["lr"]), max(x.goto.shape[1] for x in parts), -1))
    out["rule_lhs"].append(p.rule_lhs)
    out["rule_len"].append(p.rule_len)
    off["state"] += p.state_free.shape[0]
    off["outcome"] += p.outcome_seq.shape[0]
    off["seq"] += p.seq_items.shape[0]
    off["cls"] += p.class_width.shape[0]
    off["bitmap"] += p.set_bits.shape[0]
    off["lr"] += p.action.shape[0]
    off["goto"] += p.goto_chain.shape[0]
    off["rule"] += p.rule_len.shape[0]
  arrays = {f: np.concatenate(v).astype(getattr(first, f).dtype) for f, v in out.items()
            if f != "goto_chain"}
  arrays["goto_chain"] = np.concatenate(out["goto_chain"]).astype(np.int32)
  arrays["eos_bits"] = first.eos_bits
  arrays["max_width"] = np.array(max(int(p.max_width) for p in parts), np.int32)
  info = lambda f: tuple(x for p in parts for x in (
      getattr(p, f) if isinstance(getattr(p, f), tuple) else (getattr(p, f),)))
  return LexedArrays(
      **arrays, vocab_size=first.vocab_size,
      stack_depth=max(p.stack_depth for p in parts),
      indent_depth=max(p.indent_depth for p in parts), lexer=info("lexer"),
      token_table=info("token_table"), lr=info("lr"), grammar=info("grammar"),
      vocab=first.vocab, indentation=tuple(p.indentation for p in parts),
      goto=np.concatenate(gotos), semicolons=tuple(p.semicolons for p in parts))


