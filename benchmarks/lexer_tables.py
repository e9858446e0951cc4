"""Lexer-state x token tables for SQL, Python and Go terminals, measured (issue 18).

The first increment of grammars with a lexer: before building the two-level runtime
(docs/lexer_runtime.md), measure how large its shared table is with the real Gemma 3
vocabulary (262,144 tokens), for three terminal sets:

* SQL: the terminals of the built-in `constraints/grammars/sql_select.lark`, read from the
  file (its keywords, punctuation literals and regex terminals, plus the `common` INT,
  NUMBER and WS it imports; `_S` is dropped: with a lexer, longest match separates words).
* Python: NAME (Unicode, `[^\\W\\d]\\w*`) minus the 35 keywords, every NUMBER form, short and
  triple-quoted STRING with all prefixes (f-strings as whole strings), operators and
  punctuation, COMMENT, NEWLINE, WS and backslash continuation; INDENT/DEDENT come from a
  line-start lexer mode (below).
* Go: identifiers minus the 25 keywords, int/float/imaginary/rune/string/raw-string
  literals, operators, line and general comments, newline (automatic semicolon insertion as
  a lexer mode).

How the table is built (all with this repository's machinery, no Lark):

1-2. `automata/_lexer.py` `build_lexer_dfa` (the library's construction, moved there from
   this script). Each terminal: `_regex.parse_regex` -> IR -> `_fsa.compile_byte_dfa`
   (minimal byte DFA). The lexer DFA: the product of the terminal DFAs (breadth-first over reachable tuples of
   terminal states), whose accepting states keep the *set* of terminals that match, ordered
   by priority (keywords > string literals > regexes, then definition order); a keyword
   removes NAME from the set (NAME minus keywords). A set with several members (SQL's `*`
   is both `"*"` and OPERATOR; `5` is INT and NUMBER) is one *lexeme class*: which member it
   is, the parser decides, as Lark's contextual lexer would. Minimized (Moore).
3. Lexer modes: lexer state = (mode, DFA state). A completed lexeme emits, depending on the
   mode it started in, a short list of parser-visible items and the mode to restart in:
   Python's line-start mode turns leading whitespace into indentation (width counted on the
   device), blank lines and comment lines into nothing, and puts the pseudo-terminal
   INDENT_CHECK (INDENT, nothing, or DEDENTs, resolved against the row's indentation stack)
   before the first terminal of a line; Go's "after a semicolon trigger" mode turns a
   newline (or a general comment containing one) into `;`.
4. Lexing is longest match without backtracking: a lexeme ends when the next byte cannot
   extend it; then its class is emitted and the byte is re-read from the restart state.
   (Text whose longest match would need to back up more than one byte, like `1e` followed
   by a letter, is dead, as the languages' own tokenizers reject it too.)
5. Composition with the vocabulary: for every reachable lexer state s and every token t,
   a numpy walk of t's bytes (all pairs of a chunk of states in lockstep, positions in
   order) gives the items t completes from s and the lexer state it ends in, or dead.
   Pairs whose first byte cannot extend s reuse the walk from the restart state (the
   emission of s's lexeme, then t from the start). This walk (with modes and viable
   sets) stays here as the measurement of the design; the library's table without modes,
   `_lexer.build_token_table` (trie walk shared per (first byte, state after it)), is
   measured next to it ("library table").

Printed and written to `benchmarks/results/lexer_tables.json`: lexer DFA states, live
(state, token) pairs, distinct item sequences, the longest sequence, the per-state mask
classes (tokens with the same item sequence and the same final "viable" set: the grouping
the device mask checks against the LR parser), the distinct token sets of those classes,
and the bytes of several encodings, with compile times.

Usage: .venv/bin/python benchmarks/lexer_tables.py [--only sql,python,go] [--flat-sql]
       [--out PATH]   (all three and --flat-sql: about a minute on 2 cores)
       .venv/bin/python benchmarks/lexer_tables.py --compile [--only ...] [--repeats N]
         compile time of the library's `compile_lexed_grammar` with Gemma 3, each compile
         in a fresh process: cold (an empty cache directory) then warm (the trie and the
         token table it left there); CPU and wall seconds with the load average.
"""

import argparse
import collections
import dataclasses
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time

import numpy as np

import constrained_decoding as cd
from constrained_decoding import models
from constrained_decoding.automata import _detokenizer
from constrained_decoding.automata import _lexer

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
SQL_GRAMMAR = os.path.join(ROOT, "constrained_decoding", "constraints", "grammars",
                           "sql_select.lark")

KW, LIT, RE = 0, 1, 2  # terminal kinds, in priority order
IGNORED = "<ignored>"  # emission list () : the lexeme is dropped


# ------------------------------------------------------------------ terminal sets


def _lit(text: str, ci: bool = False) -> str:
  return ("(?i)" if ci else "") + re.escape(text)


def sql_terminals():
  """(name, pattern, kind) read from sql_select.lark; the emission rules."""
  text = open(SQL_GRAMMAR).read()
  body = "\n".join(line for line in text.splitlines() if not line.startswith("//"))
  terms = []
  keywords = sorted(set(re.findall(r'"([A-Za-z]+)"i', body)))
  for k in keywords:
    terms.append((k.upper(), _lit(k, ci=True), KW))
  puncts = sorted(set(re.findall(r'"([^"A-Za-z]+)"(?!i)', body)))
  names = {";": "SEMICOLON", ",": "COMMA", "*": "STAR", "(": "LPAR", ")": "RPAR", ".": "DOT"}
  for p in puncts:
    terms.append((names.get(p, p), _lit(p), LIT))
  for name, pattern in re.findall(r"^([A-Z][A-Z_]*): /(.*)/$", body, re.M):
    terms.append((name, pattern, RE))
  # %import common.INT / common.NUMBER / common.WS (constraints/_lark.py's _COMMON).
  terms.append(("INT", r"[0-9]+", RE))
  terms.append(("NUMBER", r"[0-9]+(\.[0-9]*)?([eE][+-]?[0-9]+)?|\.[0-9]+([eE][+-]?[0-9]+)?",
                RE))
  terms.append(("WS", r"[ \t\f\r\n]+", RE))
  spec = dict(name="sql", terminals=terms, beaten_by_keywords={"NAME"}, modes=("N",),
              emit=lambda mode, cls: ((), mode) if cls[0] == "WS" else ((cls,), mode))
  return spec


PY_KEYWORDS = ("False None True and as assert async await break class continue def del elif "
               "else except finally for from global if import in is lambda nonlocal not or "
               "pass raise return try while with yield").split()
PY_OPERATORS = ("( ) [ ] { } , : ; . ... @ = -> + - * / // % ** << >> & | ^ ~ < > <= >= == "
                "!= := += -= *= /= //= %= @= &= |= ^= >>= <<= **=").split()


def python_terminals():
  terms = [(k.upper(), _lit(k), KW) for k in PY_KEYWORDS]
  terms += [(f"OP{op}", _lit(op), LIT) for op in PY_OPERATORS]
  digits = r"[0-9](_?[0-9])*"
  exponent = rf"[eE][-+]?{digits}"
  point_float = rf"({digits})?\.{digits}|{digits}\."
  float_ = rf"({point_float})({exponent})?|{digits}{exponent}"
  terms += [
      ("NAME", r"[^\W\d]\w*", RE),
      ("DEC_NUMBER", r"[1-9](_?[0-9])*|0(_?0)*", RE),
      ("HEX_NUMBER", r"0[xX](_?[0-9a-fA-F])+", RE),
      ("OCT_NUMBER", r"0[oO](_?[0-7])+", RE),
      ("BIN_NUMBER", r"0[bB](_?[01])+", RE),
      ("FLOAT_NUMBER", float_, RE),
      ("IMAG_NUMBER", rf"({float_}|{digits})[jJ]", RE),
  ]
  prefix = r"([rRuUfFbB]|[fF][rR]|[rR][fF]|[bB][rR]|[rR][bB])?"
  any_ = r"[\s\S]"
  short = rf"\"([^\"\\\n]|\\{any_})*\"|'([^'\\\n]|\\{any_})*'"
  def long_body(q):
    return (rf"{q}{q}{q}([^{q}\\]|\\{any_}|{q}[^{q}\\]|{q}\\{any_}|{q}{q}[^{q}\\]|"
            rf"{q}{q}\\{any_})*({q}|{q}{q})?{q}{q}{q}")
  terms += [
      ("STRING", f"{prefix}({short})", RE),
      ("LONG_STRING", f"{prefix}({long_body(chr(34))}|{long_body(chr(39))})", RE),
      ("COMMENT", r"#[^\r\n]*", RE),
      ("NEWLINE", r"\r?\n", RE),
      ("WS", r"[ \t\f]+", RE),
      ("CONTINUATION", r"\\\r?\n", RE),
  ]

  def emit(mode, cls):
    top = cls[0]
    if mode == "N":  # inside a line
      if top in ("WS", "COMMENT", "CONTINUATION"):
        return (), "N"
      if top == "NEWLINE":
        return (cls,), "B"
      return (cls,), "N"
    # "B": at the start of a line; WS is indentation (its width counted on the device),
    # blank lines and comment-only lines are ignored, as Python does.
    if top in ("WS", "COMMENT", "NEWLINE", "CONTINUATION"):
      return (), "B"
    return (("INDENT_CHECK",), cls), "N"

  return dict(name="python", terminals=terms, beaten_by_keywords={"NAME"}, modes=("N", "B"),
              emit=emit)


GO_KEYWORDS = ("break case chan const continue default defer else fallthrough for func go "
               "goto if import interface map package range return select struct switch type "
               "var").split()
GO_OPERATORS = ("+ - * / % & | ^ << >> &^ += -= *= /= %= &= |= ^= <<= >>= &^= && || <- ++ -- "
                "== < > = ! ~ != <= >= := ... ( ) [ ] { } , ; . :").split()
GO_TRIGGERS = {"IDENT", "INT", "FLOAT", "IMAG", "RUNE", "STRING", "RAW_STRING", "BREAK",
               "CONTINUE", "FALLTHROUGH", "RETURN", "OP++", "OP--", "OP)", "OP]", "OP}"}


def go_terminals():
  terms = [(k.upper(), _lit(k), KW) for k in GO_KEYWORDS]
  terms += [(f"OP{op}", _lit(op), LIT) for op in GO_OPERATORS]
  dec = r"[0-9](_?[0-9])*"
  hexd = r"[0-9a-fA-F](_?[0-9a-fA-F])*"
  int_ = rf"0|[1-9](_?[0-9])*|0[bB](_?[01])+|0[oO]?(_?[0-7])+|0[xX](_?[0-9a-fA-F])+"
  dec_float = (rf"{dec}\.({dec})?([eE][+-]?{dec})?|{dec}[eE][+-]?{dec}|"
               rf"\.{dec}([eE][+-]?{dec})?")
  hex_float = rf"0[xX](_?{hexd}(\.({hexd})?)?|_?\.{hexd})[pP][+-]?{dec}"
  float_ = f"{dec_float}|{hex_float}"
  escape = r"\\([abfnrtv\\'\"]|[0-7]{3}|x[0-9a-fA-F]{2}|u[0-9a-fA-F]{4}|U[0-9a-fA-F]{8})"
  terms += [
      ("IDENT", r"[^\W\d]\w*", RE),
      ("INT", int_, RE),
      ("FLOAT", float_, RE),
      ("IMAG", rf"({dec}|{int_}|{float_})i", RE),
      ("RUNE", rf"'([^'\\\n]|{escape})'", RE),
      ("STRING", rf"\"([^\"\\\n]|{escape})*\"", RE),
      ("RAW_STRING", r"`[^`]*`", RE),
      ("LINE_COMMENT", r"//[^\n]*", RE),
      ("COMMENT_1", r"/\*([^*\n]|\*+[^*/\n])*\*+/", RE),  # general comment on one line
      ("COMMENT_NL", r"/\*([^*]|\*+[^*/])*\*+/", RE),  # ... one with a newline
      ("NEWLINE", r"\n", RE),
      ("WS", r"[ \t\r]+", RE),
  ]

  def emit(mode, cls):
    top = cls[0]
    if top in ("WS", "LINE_COMMENT", "COMMENT_1"):
      return (), mode
    if top in ("NEWLINE", "COMMENT_NL"):  # automatic semicolon insertion
      return ((("OP;",),) if mode == "A" else ()), "B"
    return (cls,), ("A" if top in GO_TRIGGERS else "B")

  return dict(name="go", terminals=terms, beaten_by_keywords={"IDENT"}, modes=("B", "A"),
              emit=emit)


# ------------------------------------------------------------------ the lexer DFA


def library_terminals(spec):
  """The spec's terminals as `_lexer.Terminal`s (keywords and punctuation are literals)."""
  return [_lexer.Terminal(name, pattern, literal=(kind != RE))
          for name, pattern, kind in spec["terminals"]]


def build_lexer(spec):
  """Terminal DFAs -> product DFA with lexeme classes -> minimal DFA (`automata/_lexer.py`).

  Every lexeme class is kept as its own DFA label here (the modes below decide what it
  emits), so no terminal is marked ignored.
  """
  t0 = time.perf_counter()
  lexer = _lexer.build_lexer_dfa(library_terminals(spec),
                                 keyword_beats=spec["beaten_by_keywords"])
  seconds = time.perf_counter() - t0
  return dict(dfa=lexer.transitions.astype(np.int64), cls=lexer.state_class.astype(np.int64),
              class_names=list(lexer.classes), start=lexer.start,
              terminal_states=list(lexer.terminal_states),
              product_states=lexer.product_states, seconds_total=seconds, lexer=lexer)


def add_modes(spec, lex):
  """Lexer states (mode, q) with the emission items and restart state of each."""
  modes = spec["modes"]
  q = lex["dfa"].shape[0]
  s_total = len(modes) * q
  dead = s_total
  trans = np.full((s_total + 1, 256), -1, np.int64)
  accept = np.zeros(s_total + 1, bool)
  restart = np.full(s_total + 1, dead, np.int64)
  emit_items = np.full((s_total + 1, 2), -1, np.int64)
  items = {}  # parser-visible item (a lexeme class, or a pseudo-terminal) -> id
  emissions = {}  # emission tuple -> id
  emission_of = np.full(s_total + 1, -1, np.int64)
  for m, mode in enumerate(modes):
    base = m * q
    d = lex["dfa"]
    trans[base:base + q] = np.where(d < 0, -1, d + base)
    for s in range(q):
      c = lex["cls"][s]
      if c < 0:
        continue
      out, next_mode = spec["emit"](mode, lex["class_names"][c])
      accept[base + s] = True
      restart[base + s] = modes.index(next_mode) * q + lex["start"]
      ids = [items.setdefault(it, len(items)) for it in out]
      emit_items[base + s, :len(ids)] = ids
      emission_of[base + s] = emissions.setdefault(tuple(ids), len(emissions))
  starts = [m * q + lex["start"] for m in range(len(modes))]
  # Reachable lexer states from the first mode's start.
  seen = np.zeros(s_total + 1, bool)
  seen[starts[0]] = True
  frontier = np.array([starts[0]])
  while len(frontier):
    nxt = trans[frontier]
    acc = accept[frontier]
    again = trans[restart[frontier]]
    nxt = np.where((nxt < 0) & acc[:, None], again, nxt).reshape(-1)
    nxt = np.unique(nxt[nxt >= 0])
    nxt = nxt[~seen[nxt]]
    seen[nxt] = True
    frontier = nxt
  reachable = np.nonzero(seen[:s_total])[0]
  # Viable set of each state: the emissions its partial lexeme can still end with
  # (fixpoint over the one-mode DFA of the lexeme classes reachable from each state).
  d = lex["dfa"]
  n_cls = len(lex["class_names"])
  can = np.zeros((q + 1, n_cls), bool)
  has = lex["cls"] >= 0
  can[np.nonzero(has)[0], lex["cls"][has]] = True
  succ = np.where(d < 0, q, d)
  while True:
    new = can.copy()
    new[:q] |= can[succ].any(axis=1)
    if (new == can).all():
      break
    can = new
  viable_sets = {(): 0}  # () = no partial lexeme (a start state): nothing required
  viable_of = np.zeros(s_total + 1, np.int64)
  for m, mode in enumerate(modes):
    for s in range(q):
      if s == lex["start"]:
        continue
      key = []
      for c in np.nonzero(can[s])[0]:
        out, _ = spec["emit"](mode, lex["class_names"][c])
        key.append(emissions.setdefault(tuple(items.setdefault(it, len(items)) for it in out),
                                        len(emissions)))
      viable_of[m * q + s] = viable_sets.setdefault(tuple(sorted(set(key))), len(viable_sets))
  return dict(trans=trans, accept=accept, restart=restart, emit_items=emit_items,
              items=items, emissions=emissions, starts=starts, reachable=reachable,
              dead=dead, viable_of=viable_of, viable_sets=viable_sets, num_states=s_total)


# ------------------------------------------------------------------ composition


class Vocab:

  def __init__(self, vocab):
    ids = [i for i, b in enumerate(vocab.token_bytes) if b]
    self.vocab_size = vocab.vocab_size
    self.ids = np.array(ids, np.int64)
    lens = np.array([len(vocab.token_bytes[i]) for i in ids], np.int64)
    order = np.argsort(-lens, kind="stable")  # longest first: active tokens are a prefix
    self.ids, self.lens = self.ids[order], lens[order]
    self.max_len = int(self.lens.max())
    self.bytes = np.zeros((len(ids), self.max_len), np.uint8)
    for j, i in enumerate(self.ids.tolist()):
      b = vocab.token_bytes[i]
      self.bytes[j, :len(b)] = np.frombuffer(b, np.uint8)
    rng = np.random.default_rng(0)
    self.token_hash = rng.integers(1, 2**63, len(ids), dtype=np.int64).astype(np.uint64)


PRIME = np.uint64(0x100000001B3)


def walk(lx, voc, states, toks):
  """Walk tokens `toks` (indices into voc, sorted longest first) from `states`.

  Returns (final state or dead, item count, sequence hash, first item, second item).
  """
  trans, accept, restart, emit = lx["trans"], lx["accept"], lx["restart"], lx["emit_items"]
  dead = lx["dead"]
  p = len(toks)
  cur = states.copy()
  k = np.zeros(p, np.int64)
  h = np.zeros(p, np.uint64)
  first = np.full(p, -1, np.int64)
  second = np.full(p, -1, np.int64)
  lens = voc.lens[toks]
  counts = np.bincount(np.minimum(lens, voc.max_len), minlength=voc.max_len + 1)
  active = p - np.cumsum(counts)  # active[i]: pairs with len > i
  with np.errstate(over="ignore"):
    for i in range(voc.max_len):
      n = int(active[i])
      if n == 0:
        break
      c = cur[:n]
      b = voc.bytes[toks[:n], i]
      nx = trans[c, b]
      idx = np.nonzero(nx < 0)[0]
      if len(idx):
        cc = c[idx]
        ok = accept[cc]
        for j in range(2):
          it = emit[cc, j]
          m = ok & (it >= 0)
          w = idx[m]
          iv = it[m]
          h[w] = h[w] * PRIME + (iv + 1).astype(np.uint64)
          kk = k[w]
          first[w[kk == 0]] = iv[kk == 0]
          second[w[kk == 1]] = iv[kk == 1]
          k[w] += 1
        nx2 = trans[restart[cc], b[idx]]
        nx2[~ok] = -1
        nx[idx] = nx2
      nx[nx < 0] = dead
      cur[:n] = nx
  return cur, k, h, first, second


def compose(spec, lx, voc, chunk_pairs=6_000_000):
  t0 = time.perf_counter()
  n_tok = len(voc.ids)
  all_toks = np.arange(n_tok)
  dead = lx["dead"]
  start_res = {}
  for s in lx["starts"]:
    start_res[s] = walk(lx, voc, np.full(n_tok, s), all_toks)
  v_words = (voc.vocab_size + 31) // 32

  stats = collections.Counter()
  seq_hashes = []
  outcome_keys = []
  class_set_hashes = []
  class_sizes = []
  k_hist = collections.Counter()
  per_state = []
  syncode_keys = 0
  longest = (0, None, None)
  first_bytes = voc.bytes[:, 0]
  viable_of = lx["viable_of"]
  reachable = lx["reachable"].tolist()

  def finish(s, final, k, h, first, second):
    nonlocal syncode_keys, longest
    live = final != dead
    nl = int(live.sum())
    stats["live"] += nl
    if nl == 0:
      per_state.append((s, 0, 0, 0, 0, 0, 0))
      return
    f, kk, hh = final[live], k[live], h[live]
    seq_hashes.append(np.unique(hh ^ (kk.astype(np.uint64) << np.uint64(58))))
    outcome_keys.append(np.unique(hh * np.uint64(1000003) + f.astype(np.uint64)
                                  + (kk.astype(np.uint64) << np.uint64(58))))
    for v, c in zip(*np.unique(np.minimum(kk, 4), return_counts=True)):
      k_hist[int(v)] += int(c)
    j = int(np.argmax(kk))
    if kk[j] > longest[0]:
      longest = (int(kk[j]), int(s), int(voc.ids[np.nonzero(live)[0][j]]))
    # Mask classes: same item sequence and same viable set of the final state.
    key = (hh ^ (kk.astype(np.uint64) << np.uint64(58))) * np.uint64(0x9E3779B97F4A7C15) \
        + viable_of[f].astype(np.uint64)
    order = np.argsort(key, kind="stable")
    sk = key[order]
    starts = np.concatenate([[0], np.nonzero(sk[1:] != sk[:-1])[0] + 1])
    sizes = np.diff(np.append(starts, len(sk)))
    tok_h = voc.token_hash[np.nonzero(live)[0]][order]
    set_h = np.add.reduceat(tok_h, starts)
    class_set_hashes.append(set_h)
    class_sizes.append(sizes)
    kc = kk[order][starts]
    big = sizes >= 256
    n_seq = len(np.unique(hh ^ (kk.astype(np.uint64) << np.uint64(58))))
    per_state.append((s, nl, len(starts), int((kc >= 1).sum()), int(big.sum()),
                      int(sizes[~big].sum()), n_seq))
    sy = np.unique(first[live] * 100003 + second[live])
    syncode_keys += len(sy)

  with np.errstate(over="ignore"):
    for s in reachable:
      if s in start_res:
        finish(s, *start_res[s])
        continue
      cont = lx["trans"][s, first_bytes] >= 0
      final = np.full(n_tok, dead, np.int64)
      k = np.zeros(n_tok, np.int64)
      h = np.zeros(n_tok, np.uint64)
      first = np.full(n_tok, -1, np.int64)
      second = np.full(n_tok, -1, np.int64)
      toks = np.nonzero(cont)[0]
      if len(toks):
        r = walk(lx, voc, np.full(len(toks), s), toks)
        final[toks], k[toks], h[toks], first[toks], second[toks] = r
      rest = np.nonzero(~cont)[0]
      if lx["accept"][s] and len(rest):
        fs, ks, hs, f1, f2 = start_res[int(lx["restart"][s])]
        e = [int(x) for x in lx["emit_items"][s] if x >= 0]
        he = np.uint64(0)
        for x in e:
          he = he * PRIME + np.uint64(x + 1)
        kr = ks[rest]
        # hash(e ++ rest) = hash(e) * PRIME^len(rest) + hash(rest)
        powers = np.ones(voc.max_len * 2 + 4, np.uint64)
        for j in range(1, len(powers)):
          powers[j] = powers[j - 1] * PRIME
        final[rest] = fs[rest]
        k[rest] = kr + len(e)
        h[rest] = he * powers[kr] + hs[rest]
        if len(e) == 0:
          first[rest], second[rest] = f1[rest], f2[rest]
        elif len(e) == 1:
          first[rest], second[rest] = e[0], f1[rest]
        else:
          first[rest], second[rest] = e[0], e[1]
      finish(s, final, k, h, first, second)
  seconds = time.perf_counter() - t0

  n_states = len(reachable)
  all_seq = np.unique(np.concatenate(seq_hashes))
  all_outcomes = np.unique(np.concatenate(outcome_keys))
  set_h = np.concatenate(class_set_hashes)
  sizes = np.concatenate(class_sizes)
  distinct_sets, first_idx = np.unique(set_h, return_index=True)
  distinct_sizes = sizes[first_idx]
  classes_per_state = np.array([row[2] for row in per_state])
  parser_classes = np.array([row[3] for row in per_state])
  big_per_state = np.array([row[4] for row in per_state])
  small_tokens_per_state = np.array([row[5] for row in per_state])
  seqs_per_state = np.array([row[6] for row in per_state])
  live = stats["live"]
  big = distinct_sizes >= 256
  enc = {
      # (a) dense: one int32 outcome id (final state, item sequence) per (state, token).
      "dense_int32_outcomes": n_states * voc.vocab_size * 4 + len(all_outcomes) * 8,
      # (b) per-state sparse rows: (token int32, outcome int32) per live pair + offsets.
      "sparse_rows": live * 8 + (n_states + 1) * 4 + len(all_outcomes) * 8,
      # (c) mask classes as deduplicated bitmaps, like tables.py's mask_bits, plus per
      # state the class list (set id, sequence id, viable id: 3 int32).
      "class_bitmaps_dedup": len(distinct_sets) * v_words * 4 + int(sizes.size) * 12,
      # (d) hybrid: bitmaps only for distinct sets of >= 256 tokens, token lists otherwise.
      "class_hybrid_256": int(big.sum()) * v_words * 4
      + int(distinct_sizes[~big].sum()) * 4 + int(sizes.size) * 12,
      # (e) dense int16 class id per (state, token) (the mask is a gather over V).
      "dense_int16_class_ids": n_states * voc.vocab_size * 2 + int(sizes.size) * 12,
      # SynCode's DFA mask store: one bitmap per (lexer state, first <= 2 terminals).
      "syncode_mask_store": syncode_keys * v_words * 4,
  }
  # Advance without the table: walk the sampled token's bytes through the lexer on device.
  enc["advance_by_byte_walk"] = (voc.vocab_size * (voc.max_len + 4)
                                 + lx["num_states"] * 256 * 2 + lx["num_states"] * 16)
  longest_len, longest_state, longest_tok = longest
  return dict(
      seconds=seconds,
      reachable_lexer_states=n_states,
      pairs=n_states * n_tok,
      live_pairs=live,
      live_fraction=live / (n_states * n_tok),
      items_per_token_histogram={("4+" if k == 4 else str(k)): v for k, v in
                                 sorted(k_hist.items())},
      distinct_item_sequences=len(all_seq),
      distinct_outcomes=len(all_outcomes),
      longest_sequence=longest_len,
      longest_sequence_example=dict(lexer_state=longest_state, token_id=longest_tok),
      mask_classes_total=int(sizes.size),
      mask_classes_per_state_max=int(classes_per_state.max()),
      mask_classes_per_state_mean=float(classes_per_state.mean()),
      parser_checked_classes_per_state_max=int(parser_classes.max()),
      parser_checked_classes_per_state_mean=float(parser_classes.mean()),
      distinct_sequences_per_state_max=int(seqs_per_state.max()),
      distinct_sequences_per_state_mean=float(seqs_per_state.mean()),
      big_classes_per_state_max=int(big_per_state.max()),
      big_classes_per_state_mean=float(big_per_state.mean()),
      small_class_tokens_per_state_max=int(small_tokens_per_state.max()),
      small_class_tokens_per_state_mean=float(small_tokens_per_state.mean()),
      distinct_class_token_sets=len(distinct_sets),
      distinct_class_token_sets_ge_256_tokens=int(big.sum()),
      syncode_mask_store_keys=syncode_keys,
      bytes=enc,
      max_token_bytes=voc.max_len,
  )


def library_table(spec, lex, trie):
  """The library's lexer-state x token table (`_lexer.build_token_table`, no modes)."""
  ignored = {"sql": ("WS",), "python": ("WS", "COMMENT", "CONTINUATION"),
             "go": ("WS", "LINE_COMMENT", "COMMENT_1")}[spec["name"]]
  lexer = dataclasses.replace(
      lex["lexer"], class_ignored=np.array([c[0] in ignored for c in lex["class_names"]]))
  t0 = time.perf_counter()
  table = _lexer.build_token_table(lexer, trie, VOCAB.vocab_size)
  return dict(seconds=time.perf_counter() - t0, lexer_states=lexer.num_states,
              outcome_classes=int(len(table.class_final)),
              outcome_classes_per_state_max=int(np.diff(table.class_start).max()),
              item_sequences=int(len(table.seq_start) - 1),
              token_sets_bitmaps=table.num_bitmaps,
              token_sets_lists=int(len(table.set_start) - 1), nbytes=table.nbytes)


def measure(spec, voc, trie):
  t0 = time.perf_counter()
  lex = build_lexer(spec)
  lx = add_modes(spec, lex)
  t_lexer = time.perf_counter() - t0
  lib = library_table(spec, lex, trie)
  comp = compose(spec, lx, voc)
  longest = comp["longest_sequence_example"]
  if longest["token_id"] is not None:
    longest["token"] = repr(VOCAB.token_bytes[longest["token_id"]])
  result = dict(
      terminals=len(spec["terminals"]),
      lexeme_classes=len(lex["class_names"]),
      ambiguous_lexeme_classes=[list(c) for c in lex["class_names"] if len(c) > 1],
      parser_items=len(lx["items"]),
      terminal_dfa_states_sum=sum(lex["terminal_states"]),
      product_states=lex["product_states"],
      lexer_dfa_states=int(lex["dfa"].shape[0]),
      modes=list(spec["modes"]),
      lexer_states_with_modes=lx["num_states"],
      viable_sets=len(lx["viable_sets"]),
      seconds_lexer_dfa=t_lexer,
      seconds_total=time.perf_counter() - t0,
      library_token_table=lib,
      **comp,
  )
  return result


VOCAB = None


def flat_sql(vocab):
  """Today's flat token-level PDA path on the same SQL grammar, for comparison."""
  text = open(SQL_GRAMMAR).read()
  compiler = cd.Compiler(vocab)
  out = {}
  for max_depth in (None, 3):
    t0 = time.perf_counter()
    try:
      _, info = compiler.compile_with_info(cd.Grammar(text, syntax="lark", max_depth=max_depth))
      out[str(max_depth)] = dict(ok=True, seconds=time.perf_counter() - t0,
                                 token_states=info.token_states, token_edges=info.token_edges,
                                 table_bytes=info.nbytes["total"])
    except cd.GrammarError as e:
      out[str(max_depth)] = dict(ok=False, seconds=time.perf_counter() - t0,
                                 error=f"{type(e).__name__}: {e}")
    print(f"flat PDA, sql_select.lark, max_depth={max_depth}: {out[str(max_depth)]}",
          flush=True)
  return out


# The library's grammars with a lexer: file, compile options.
LEXED = dict(
    python=("python_lexed.lark", "file_input", "indentation"),
    go=("go.lark", "source_file", "semicolons"),
    sql=("sql_select_lexed.lark", "start", None))


def compile_once(name: str, cache_dir: str) -> dict:
  """One `compile_lexed_grammar` of a LEXED grammar with Gemma 3 (the vocabulary loaded
  before the clock starts): CPU and wall seconds."""
  from constrained_decoding.constraints import _lexed_grammar  # pylint: disable=g-import-not-at-top
  file, start, option = LEXED[name]
  text = open(os.path.join(os.path.dirname(SQL_GRAMMAR), file)).read()
  options = {"indentation": _lexed_grammar.Indentation(),
             "semicolons": _lexed_grammar.Semicolons()}.get(option)
  kwargs = {option: options} if option else {}
  vocab = cd.Vocabulary.from_gguf(models.default_gguf_path())
  wall, cpu = time.perf_counter(), time.process_time()
  _lexed_grammar.compile_lexed_grammar(text, vocab, start=start, cache_dir=cache_dir,
                                       **kwargs)
  return dict(wall=time.perf_counter() - wall, cpu=time.process_time() - cpu,
              load=os.getloadavg()[0])


def compile_times(names, repeats: int) -> dict:
  """Cold then warm compiles of each grammar, each in a fresh process."""
  out = {}
  for name in names:
    runs = []
    for _ in range(repeats):
      with tempfile.TemporaryDirectory() as cache:
        for kind in ("cold", "warm"):
          line = subprocess.run(
              [sys.executable, __file__, "--compile-child", name, cache], check=True,
              capture_output=True, text=True).stdout.strip().splitlines()[-1]
          runs.append(dict(json.loads(line), kind=kind))
          print(f"{name} {kind}: {runs[-1]['cpu']:.2f} s CPU, {runs[-1]['wall']:.2f} s"
                f" wall, load {runs[-1]['load']:.1f}", flush=True)
    out[name] = runs
  return out


def main():
  global VOCAB
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--only", default="sql,python,go")
  ap.add_argument("--flat-sql", action="store_true",
                  help="also compile sql_select.lark through today's flat PDA path")
  ap.add_argument("--out", default=os.path.join(HERE, "results", "lexer_tables.json"))
  ap.add_argument("--compile", action="store_true",
                  help="only time compile_lexed_grammar, cold and warm (not written)")
  ap.add_argument("--repeats", type=int, default=1)
  ap.add_argument("--compile-child", nargs=2, help=argparse.SUPPRESS)
  args = ap.parse_args()
  if args.compile_child:
    print(json.dumps(compile_once(*args.compile_child)))
    return 0
  if args.compile:
    compile_times(args.only.split(","), args.repeats)
    return 0
  t0 = time.perf_counter()
  VOCAB = cd.Vocabulary.from_gguf(models.default_gguf_path())
  voc = Vocab(VOCAB)
  trie = _detokenizer.build_trie(VOCAB)
  print(f"vocabulary: {VOCAB.num_tokens} tokens ({len(voc.ids)} with bytes, longest "
        f"{voc.max_len} bytes), loaded in {time.perf_counter() - t0:.1f} s", flush=True)
  makers = dict(sql=sql_terminals, python=python_terminals, go=go_terminals)
  results = {}
  for name in args.only.split(","):
    spec = makers[name]()
    r = measure(spec, voc, trie)
    results[name] = r
    mib = {k: round(v / 2**20, 1) for k, v in r["bytes"].items()}
    print(f"\n== {name}: {r['terminals']} terminals, {r['lexeme_classes']} lexeme classes, "
          f"lexer DFA {r['lexer_dfa_states']} states (product {r['product_states']}), "
          f"{r['reachable_lexer_states']} reachable with modes {r['modes']}")
    print(f"   live (state, token) pairs {r['live_pairs']:,} of {r['pairs']:,} "
          f"({100 * r['live_fraction']:.1f}%); items per token {r['items_per_token_histogram']}")
    print(f"   distinct item sequences {r['distinct_item_sequences']:,}, distinct outcomes "
          f"{r['distinct_outcomes']:,}, longest sequence {r['longest_sequence']} "
          f"({r['longest_sequence_example']})")
    print(f"   mask classes {r['mask_classes_total']:,} (per state max "
          f"{r['mask_classes_per_state_max']}, mean {r['mask_classes_per_state_mean']:.0f}; "
          f"needing the parser: max {r['parser_checked_classes_per_state_max']}, mean "
          f"{r['parser_checked_classes_per_state_mean']:.0f}); distinct token sets "
          f"{r['distinct_class_token_sets']:,} ({r['distinct_class_token_sets_ge_256_tokens']} "
          f"of >= 256 tokens); viable sets {r['viable_sets']}")
    print(f"   per state: classes of >= 256 tokens max {r['big_classes_per_state_max']} "
          f"(mean {r['big_classes_per_state_mean']:.0f}); distinct sequences max "
          f"{r['distinct_sequences_per_state_max']}; tokens in smaller classes max "
          f"{r['small_class_tokens_per_state_max']:,} (mean "
          f"{r['small_class_tokens_per_state_mean']:.0f})")
    print(f"   MiB: {mib}")
    print(f"   seconds: lexer DFA with terminal DFAs and modes {r['seconds_lexer_dfa']:.2f}, "
          f"composition {r['seconds']:.1f}, total {r['seconds_total']:.1f}")
    lib = r["library_token_table"]
    print(f"   library table (_lexer.build_token_table, no modes): {lib['seconds']:.2f} s, "
          f"{lib['lexer_states']} states, {lib['outcome_classes']:,} outcome classes "
          f"(per state max {lib['outcome_classes_per_state_max']}), "
          f"{lib['item_sequences']:,} sequences, {lib['token_sets_bitmaps']} bitmaps + "
          f"{lib['token_sets_lists']:,} lists, {lib['nbytes'] / 2**20:.1f} MiB", flush=True)
  flat = flat_sql(VOCAB) if args.flat_sql else None
  out = dict(
      command="benchmarks/lexer_tables.py --only " + args.only
      + (" --flat-sql" if args.flat_sql else ""),
      flat_pda_sql=flat,
      vocabulary=dict(num_tokens=VOCAB.num_tokens, vocab_size=VOCAB.vocab_size,
                      fingerprint=VOCAB.fingerprint[:16]),
      machine=dict(cpus=os.cpu_count(), python=platform.python_version()),
      results=results,
  )
  os.makedirs(os.path.dirname(args.out), exist_ok=True)
  with open(args.out, "w") as f:
    json.dump(out, f, indent=1)
  print(f"\nwrote {args.out}")


if __name__ == "__main__":
  sys.exit(main())
