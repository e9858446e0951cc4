"""`LexedReference`: the host reference stepper of grammars with a lexer (issue 18).

It walks a token's bytes through the lexer DFA (not through the token table) and feeds
the items to `_lr.LrParser` (explicit reductions), so it shares no table with the
device path (`runtime/_lexed.py`) beyond the two automata: the tests check the device
step against it.
"""

import numpy as np

from constrained_decoding.automata import _lexer
from constrained_decoding.constraints import _lr
from constrained_decoding.constraints._lexed_arrays import (
    DEDENT_ID, INDENT_ID, NEWLINE_ID, WIDTH_BAD, WIDTH_EOF, WIDTH_NONE, LexedArrays)


class LexedReference:
  """Host reference of the device step: byte walk + `_lr.LrParser`, no token table.

  ```python
  ref = LexedReference(arrays)
  row = ref.start()                 # (lexer state, parser stack, widths, brackets)
  ref.allowed(row)                  # bool [V]
  row = ref.advance(row, token_id)  # None if the token is refused
  ```

  A token is allowed iff every lexeme it completes is accepted by the parser in turn
  (the first member of its class the parser can take; a newline lexeme as
  `Indentation` says, with the indentation stack a list of widths) and the lexeme left
  pending can still become an ignored lexeme or a terminal the parser can take next
  (a newline: dropped inside brackets, else one the parser takes and after which some
  lexeme, or INDENT with room, can come); an end-of-sequence token iff the pending
  lexeme can end here and the parser then accepts the end (after the end's newline
  and dedents). A push past `stack_depth` refuses the token, as on the device.
  """

  def __init__(self, arrays: LexedArrays):
    self.arrays = arrays
    lexer = arrays.lexer
    self.lexer = lexer
    self.reach = _lexer.reachable(lexer.transitions)
    self.members = [[int(t) for t in row if t >= 0] for row in arrays.class_members]
    self.width = [int(w) for w in arrays.class_width]
    self.paren = [int(p) for p in arrays.class_paren]
    self.eos = set(arrays.vocab.eos_ids)
    self.indentation = arrays.indentation
    num_t = len(arrays.lr.terminals)
    self.lexeme_terms = [t for t in range(1, num_t) if self.indentation is None
                         or t not in (INDENT_ID, DEDENT_ID)]

  def start(self):
    return (int(self.arrays.lex_start[0]), (0,), (0,), 0)

  def _feed(self, parser: _lr.LrParser, cls: int, ctx: list) -> bool:
    """Feeds lexeme class `cls`; ctx = [widths (list), bracket depth], updated."""
    depth = self.arrays.stack_depth
    width = self.width[cls] if cls < len(self.width) else WIDTH_NONE
    if width == WIDTH_NONE:
      for t in self.members[cls] if cls < len(self.members) else ():
        if parser.viable(t):
          ctx[1] += self.paren[cls]
          return parser.feed(t) and len(parser.stack) <= depth
      return False
    if ctx[1] > 0:
      return True  # inside brackets
    if width == WIDTH_BAD:
      return False
    if width == WIDTH_EOF:
      if parser.viable(NEWLINE_ID) and not parser.feed(NEWLINE_ID):
        return False
      width = 0
    elif not parser.feed(NEWLINE_ID):
      return False
    widths = ctx[0]
    if len(parser.stack) > depth:
      return False
    if width > widths[-1]:
      if len(widths) >= self.indentation.max_depth or not parser.feed(INDENT_ID):
        return False
      widths.append(width)
    while width < widths[-1]:
      if not parser.feed(DEDENT_ID) or len(parser.stack) > depth:
        return False
      widths.pop()
    return width == widths[-1] and len(parser.stack) <= depth

  def _pending_ok(self, parser: _lr.LrParser, state: int, ctx) -> bool:
    lexer = self.lexer
    if lexer.is_start[state]:
      return True
    classes = {int(c) for c in lexer.state_class[self.reach[state]] if c >= 0}
    if any(lexer.class_ignored[c] for c in classes):
      return True
    if any(parser.viable(t) for c in classes if self.width[c] == WIDTH_NONE
           for t in self.members[c]):
      return True
    newlines = [self.width[c] for c in classes if self.width[c] != WIDTH_NONE]
    if newlines and ctx[1] > 0:
      return True
    if any(w >= 0 for w in newlines) and parser.viable(NEWLINE_ID):
      after = parser.copy()
      after.feed(NEWLINE_ID)
      widths = ctx[0]
      room = (len(widths) < self.indentation.max_depth
              and widths[-1] < self.indentation.max_width)
      return (any(after.viable(t) for t in self.lexeme_terms)
              or (room and after.viable(INDENT_ID)))
    return False

  def step(self, row, data: bytes):
    """The row after the bytes `data`, or None if they are refused."""
    lexer = self.lexer
    state, stack, widths, paren = row
    ctx = [list(widths), paren]
    parser = _lr.LrParser(self.arrays.lr, stack)
    for b in data:
      nxt = lexer.transitions[state, b]
      if nxt < 0:
        if lexer.is_start[state] or lexer.state_class[state] < 0:
          return None
        e = int(lexer.emitted[state])
        if e >= 0 and not self._feed(parser, e, ctx):
          return None
        nxt = lexer.transitions[lexer.restart_states[state], b]
        if nxt < 0:
          return None
      state = int(nxt)
    if not self._pending_ok(parser, state, ctx):
      return None
    return (state, tuple(parser.stack), tuple(ctx[0]), ctx[1])

  def end_ok(self, row) -> bool:
    state, stack, widths, paren = row
    ctx = [list(widths), paren]
    lexer = self.lexer
    parser = _lr.LrParser(self.arrays.lr, stack)
    if not lexer.is_start[state]:
      if lexer.state_class[state] < 0:
        return False
      e = int(lexer.emitted[state])
      # A pending newline lexeme is trailing blank text: the end's newline replaces it.
      if e >= 0 and self.width[e] == WIDTH_NONE and not self._feed(parser, e, ctx):
        return False
    if self.indentation is not None and not self._feed(parser, len(self.width) - 1, ctx):
      return False
    # Go: the `;` that mode A owes at the end (after the pending lexeme).
    if (self.arrays.semicolons is not None and lexer.restart_states[state] != lexer.start
        and not self._feed(parser, int(self.arrays.state_end_tail[state]), ctx)):
      return False
    return parser.accepts_end()

  def advance(self, row, token: int):
    if token in self.eos:
      return "done" if self.end_ok(row) else None
    data = self.arrays.vocab.token_bytes[token]
    return None if data is None else self.step(row, data)

  def allowed(self, row) -> np.ndarray:
    out = np.zeros(self.arrays.vocab_size, bool)
    for t, data in enumerate(self.arrays.vocab.token_bytes):
      if t in self.eos:
        out[t] = self.end_ok(row)
      elif data:
        out[t] = self.step(row, data) is not None
    return out
