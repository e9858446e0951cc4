"""Host side: constraint IR -> byte automata -> token automata (`TokenDfa`, `TokenPda`).

Nothing here is public API (`cd.Compiler` drives it, `_compiler.py`); this is the map
for readers, in pipeline order. Each module's docstring lists its own entry points.

Byte level:
  _nfa.py          IR -> epsilon-NFA over byte ranges (`build_nfa`, `nfa_size`).
  _nfa_pack.py     that NFA -> OpenFst's binary formats (`pack_const`, `pack_arcs`).
  _fsa.py          that NFA -> pynini/OpenFst -> minimal `ByteDfa` (the only place IR meets
                   pynini): `compile_byte_dfa`, `minimal_class_fst`.
  _byte_dfa.py     `ByteDfa`, plain numpy arrays; `_openfst_io.py` converts fast.
  _rtn.py          grammars: one byte DFA per rule, calls as arcs (`Rtn`, `build_rtn`).
  _lexer.py        terminal sets of lexed grammars (`docs/lexer_runtime.md`).

Token level (composition with the vocabulary, Alg. 2):
  _detokenizer.py  `VocabTrie`, the trie form of the detokenizing FST.
  _compose.py      byte DFA ∘ vocabulary trie -> token edges (`compose`).
  _pda.py          `Rtn` ∘ vocabulary trie -> `TokenPda` (grammars, calls on a stack).
  _loops.py        loops of wide states and their terminal bitmaps (pure data).
  _wide.py         `WideStates`: which states get a terminal bitmap, and the
                   per-vocabulary store of terminals (memory and disk cache).
  _near_loop.py    states that move like a loop but for a few bytes.
  _token_classes.py  bitmaps of token-class labels (`TEXT_TOKEN`, ...).
  _splice.py       shared fragments composed once, spliced in (free-form JSON values).
  _counting.py, _embedded_chains.py, _slotted_chains.py, _slotted_counting.py  counted
                   chains (`X{n,m}`, `maxLength`) as counting terminals: tables that do
                   not grow with m.
  _registers.py    guards and writes on token edges (keys checked on the device).
  _streamline.py   drops the edge groups of a `TokenPda` no stack reaches.
"""
