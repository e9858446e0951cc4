"""`LexedArrays`: the host arrays of a grammar with a lexer, and their codes (issue 18).

`compile_lexed_grammar` (`constraints/_lexed_grammar.py`) builds them, `LexedReference`
(`constraints/_lexed_reference.py`) walks them on the host and `runtime/_lexed.py`
steps them on the device (as `LexedTables`).

Public:
  LexedArrays                                   the numpy arrays (+ host information).
  END_NOTHING, END_DEAD                         codes of `state_end_item`.
  WIDTH_NONE, WIDTH_BAD, WIDTH_EOF              codes of `class_width`.
  NEWLINE_ID, INDENT_ID, DEDENT_ID              parser terminal ids with indentation.
"""

import dataclasses

import numpy as np

from constrained_decoding.automata import _lexer
from constrained_decoding.automata import _token_table
from constrained_decoding.constraints import _lr
from constrained_decoding.constraints._lexed_options import Indentation, Semicolons

# Values of `state_end_item`: nothing pending (start state, or an ignored lexeme), and
# a partial lexeme that is no terminal yet (the text cannot end here).
END_NOTHING = -1
END_DEAD = -2

# Values of `class_width`: an ordinary lexeme; a newline lexeme that no indentation
# check can accept (a tab in the indentation, wider than `max_width`, or ending in a
# comment: dropped inside brackets, an error outside); the end-of-text newline.
WIDTH_NONE = -1
WIDTH_BAD = -2
WIDTH_EOF = -3
# Parser terminal ids of the newline, INDENT and DEDENT when `indentation` is given.
NEWLINE_ID, INDENT_ID, DEDENT_ID = 1, 2, 3


@dataclasses.dataclass(frozen=True, eq=False)
class LexedArrays:
  """Two-level tables of one grammar over one vocabulary, as numpy arrays.

  S lexer states, K outcome slots per state, O outcome classes, Qs item sequences of at
  most L items, C lexeme classes of at most M parser terminals, Q parser states, T
  parser terminals (`$END` = 0) in Tw = ceil(T / 32) words, Nt nonterminals, R
  productions, Kb bitmap slots per state, Mb bitmap rows of W = ceil(V / 32) words, N
  listed tokens per state.

  Attributes:
    lex_start: int32 [G]: the lexer's start state of each stacked grammar (one entry
      unless `stack_lexed_arrays` stacked several).
    lr_start: int32 [G]: the parser's start state (the stack's bottom) of each.
    state_outcomes: int32 [S, K]: outcome class of each slot of a state, -1 padded.
    state_seq_lanes: int32 [S, Ks]: the distinct item sequences of a state's outcome
      classes (the parser runs each once per step), -1 padded.
    state_slot_lane: int32 [S, K]: the column of `state_seq_lanes` of each slot's
      sequence, -1 padded.
    outcome_seq: int32 [O]: the item sequence a token of the class completes.
    outcome_final: int32 [O]: the lexer state it ends in.
    seq_items: int32 [Qs, L]: lexeme class ids, -1 padded (row 0 is empty).
    class_members: int32 [C, M]: parser terminal ids of a lexeme class, priority order,
      -1 padded (members the grammar never uses are left out).
    state_big_slot: int32 [S, Kb]: slots whose token set is a bitmap row, -1 padded.
    state_big_row: int32 [S, Kb]: that row of `set_bits`.
    set_bits: uint32 [Mb, W]: token sets of >= 256 tokens; token t is bit t % 32 of
      word t // 32.
    state_small_tokens: int32 [S, N]: the other tokens live in a state, ascending,
      padded with `vocab_size`.
    state_small_slot: int32 [S, N]: the slot of each, -1 padded.
    state_viable: uint32 [S, Tw]: parser terminals a lexeme pending in the state can
      still become (bit t % 32 of word t // 32).
    state_free: bool [S]: the state is the start state, or its lexeme can still become
      an ignored one (it then needs nothing of the parser).
    state_end_item: int32 [S]: at the end of the text: the lexeme class emitted,
      `END_NOTHING`, or `END_DEAD`.
    state_end_tail: int32 [S]: the class fed after it at the end (the end newline of
      an indentation grammar, `WIDTH_EOF`; the `;` that Go's mode A owes), or -1.
    state_nl_any, state_nl_width: bool [S]: a pending lexeme can still become a
      newline lexeme (any; one with a width the parser can take).
    class_width: int32 [C + 1]: per lexeme class, the indentation a newline lexeme
      carries, `WIDTH_BAD`, `WIDTH_EOF` (the last, extra class), or `WIDTH_NONE`.
    class_paren: int32 [C + 1]: +1 for a lexeme class that opens a bracket, -1 for
      one that closes it, else 0.
    nl_needs_indent: bool [Q]: a newline shifted in parser state q must be followed
      by INDENT (`_newline_needs_indent`).
    max_width: int32 []: the widest indentation the lexer reads (0: no indentation).
    eos_bits: uint32 [W]: the end-of-sequence tokens.
    action, goto, rule_lhs, rule_len: the LR tables (`_lr.LrTables` encoding); `goto`
      stays on the host: the device reads `goto_id` and `goto_chain`.
    goto_id: int32 [Q, Nt]: the index of each goto entry (-1: none).
    goto_chain: int16 (int32 past 32,767 states or when stacked) [E, T]: per goto entry (q, A) and lookahead t, the state after
      `goto[q, A]` and then every reduction by a unit production (`X: Y`) that t
      calls for (each leaves q below): one device micro-step instead of up to 20 for
      Python's expression levels (`_unit_chains`).
    action_bits: uint32 [Q, Tw]: `action != 0`, packed.
    vocab_size: Width of the logits.
    stack_depth: Capacity of the parser stack on the device.
    indent_depth: Capacity of the indentation stack (1: no indentation).
    lexer, token_table, lr, grammar, vocab: host information (not sent to the device;
      for stacked arrays, tuples of the grammars' own, `vocab` shared).
  """
  lex_start: np.ndarray
  lr_start: np.ndarray
  state_outcomes: np.ndarray
  state_seq_lanes: np.ndarray
  state_slot_lane: np.ndarray
  outcome_seq: np.ndarray
  outcome_final: np.ndarray
  seq_items: np.ndarray
  class_members: np.ndarray
  state_big_slot: np.ndarray
  state_big_row: np.ndarray
  set_bits: np.ndarray
  state_small_tokens: np.ndarray
  state_small_slot: np.ndarray
  state_viable: np.ndarray
  state_free: np.ndarray
  state_end_item: np.ndarray
  state_end_tail: np.ndarray
  state_nl_any: np.ndarray
  state_nl_width: np.ndarray
  class_width: np.ndarray
  class_paren: np.ndarray
  nl_needs_indent: np.ndarray
  max_width: np.ndarray
  eos_bits: np.ndarray
  action: np.ndarray
  action_bits: np.ndarray
  goto_id: np.ndarray
  goto_chain: np.ndarray
  rule_lhs: np.ndarray
  rule_len: np.ndarray
  vocab_size: int
  stack_depth: int
  indent_depth: int
  lexer: _lexer.LexerDfa | tuple
  token_table: _token_table.TokenTable | tuple
  lr: _lr.LrTables | tuple
  grammar: _lr.TerminalGrammar | tuple
  vocab: object
  indentation: Indentation | None | tuple = None
  goto: np.ndarray | None = None
  semicolons: Semicolons | None | tuple = None

  ARRAY_FIELDS = ("lex_start", "lr_start", "state_outcomes", "state_seq_lanes", "state_slot_lane", "outcome_seq", "outcome_final", "seq_items",
                  "class_members", "state_big_slot", "state_big_row", "set_bits",
                  "state_small_tokens", "state_small_slot", "state_viable", "state_free",
                  "state_end_item", "state_end_tail", "state_nl_any", "state_nl_width",
                  "class_width", "class_paren", "nl_needs_indent", "max_width",
                  "eos_bits", "action", "action_bits", "goto_id", "goto_chain", "rule_lhs",
                  "rule_len")

  @property
  def nbytes(self) -> dict:
    """Bytes of each device array, and their "total"."""
    out = {f: int(getattr(self, f).nbytes) for f in self.ARRAY_FIELDS}
    out["total"] = sum(out.values())
    return out

  @property
  def shapes(self) -> dict:
    return {f: tuple(getattr(self, f).shape) for f in self.ARRAY_FIELDS}
