"""Grammars with a lexer (`LexedTables`, issue 18) beyond `generate`: jump-forward,
streaming, speculative decoding, rewind, grammar-aligned sampling, sharded evaluation,
the evaluation job, several such grammars stacked in one batch; and the typed
refusals where such tables meet other kinds of constraints in one batch.

Oracles: CPython's parser (`ast.parse`) on every finished text of the Python grammar;
plain greedy `generate`, which jump-forward, speculative decoding, sharded evaluation
and stacked grammars must reproduce token for token under greedy sampling; the states a row
passed through, which `rewind` must restore exactly. The model and vocabulary are
`lexed_generate_test`'s (a random bigram model over every byte plus multi-byte tokens
that cross lexeme, line and indentation boundaries). The greedy tests share one batch
of 8 prompts and one budget, so each driver compiles its loop once.
"""

import ast
import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import constrained_decoding as cd
from constrained_decoding import evaluation_job
from constrained_decoding import runtime
from constrained_decoding.sampling import _evaluate

from lexed_generate_test import (  # pylint: disable=import-error  (same directory)
    _EOS, _NAMES, _PYTHON, _TOKENS, bigram_model)

# Rows differ in their last prompt token, so the bigram model writes different texts.
_PROMPTS = ["# a\n", "x = 1\n", "def f():\n    pass\n", "if x:\n    y\n", "for", "(", "'a'",
            "#c\n"]
_BUDGET = 32
_GREEDY = cd.SamplingConfig()


@pytest.fixture(scope="module")
def model():
  """`lexed_generate_test`'s bigram model (logits of the next token: a function of the
  last one; multi-byte tokens and the end of sequence favoured)."""
  return bigram_model(cd.Vocabulary.from_token_bytes(_TOKENS + [None], eos_ids=[_EOS]))


@pytest.fixture(scope="module")
def tables(model):
  return cd.Compiler(model.vocab).compile(_PYTHON)


@pytest.fixture(scope="module")
def greedy(model, tables):
  """Plain greedy `generate`: the reference the other drivers must reproduce."""
  out = cd.generate(model, _PROMPTS, constraint=tables, max_new_tokens=_BUDGET)
  assert not any(c.error for c in out)
  return out


def _parse_finished(completions) -> list[ast.Module]:
  """`ast.parse` of every finished row's text (SyntaxError: a text wrongly allowed)."""
  assert not any(c.error for c in completions), [c.text for c in completions]
  return [ast.parse(c.text) for c in completions if c.finished]


def test_greedy_reference_is_python_and_not_vacuous(greedy):
  assert len(_parse_finished(greedy)) >= 2, [c.text for c in greedy]
  assert len({c.text for c in greedy}) >= 4  # the rows differ: comparisons can fail


def test_jump_forward_equals_plain_greedy_and_parses(model, tables, greedy):
  jumped = cd.generate(model, _PROMPTS, constraint=tables, max_new_tokens=_BUDGET,
                       sampling=cd.SamplingConfig(jump_forward=4))
  assert [c.token_ids for c in jumped] == [c.token_ids for c in greedy]
  sampled = cd.generate(model, _PROMPTS, constraint=tables, max_new_tokens=_BUDGET,
                        sampling=cd.SamplingConfig(temperature=1.0, jump_forward=4), seed=3)
  assert _parse_finished(sampled)


def test_stream_yields_what_generate_returns(model, tables, greedy):
  final = {}
  for row, item in cd.generate_stream(model, _PROMPTS, constraint=tables,
                                      max_new_tokens=_BUDGET, chunk_size=5):
    if isinstance(item, cd.Completion):
      final[row] = item
  assert [final[row] for row in range(len(_PROMPTS))] == greedy


def test_speculative_greedy_equals_plain_greedy(model, tables, greedy):
  out, stats = cd.generate_speculative(model, _PROMPTS, draft=cd.NGramDrafter(),
                                       num_draft_tokens=3, constraint=tables,
                                       max_new_tokens=_BUDGET)
  assert [c.token_ids for c in out] == [c.token_ids for c in greedy]
  assert [c.finished for c in out] == [c.finished for c in greedy]
  assert sum(stats.drafted) > 0 and sum(stats.rounds) > 0


def test_speculative_with_a_model_drafter_equals_plain_greedy(model, tables, greedy):
  """The target drafting for itself: under greedy every constrained draft token is the
  target's own choice, so all are accepted."""
  out, stats = cd.generate_speculative(model, _PROMPTS, draft=model, num_draft_tokens=3,
                                       constraint=tables, max_new_tokens=_BUDGET)
  assert [c.token_ids for c in out] == [c.token_ids for c in greedy]
  assert stats.accepted == stats.drafted and sum(stats.drafted) > len(_PROMPTS)


def _tokenize(text: bytes) -> list[int]:
  """Greedy longest-match tokenization over the test vocabulary (multi-byte first)."""
  ids, at = [], 0
  pieces = sorted(range(len(_TOKENS)), key=lambda t: -len(_TOKENS[t]))
  while at < len(text):
    token = next(t for t in pieces if text.startswith(_TOKENS[t], at))
    ids.append(token)
    at += len(_TOKENS[token])
  return ids


def test_rewind_restores_every_earlier_lexed_state(tables):
  program = b"def f(x):\n    if x:\n        return x + 1\n    return 'a'\n"
  ast.parse(program)
  tokens = _tokenize(program)
  assert len(tokens) > 10
  state = cd.init_state(tables, batch_size=1)
  history = runtime.init_history(state, max_rewind=len(tokens))
  states = [state]
  advance = jax.jit(runtime.advance)
  for t in tokens:
    state = advance(tables, state, jnp.asarray([t], jnp.int32))
    history = runtime.record(history, state)
    states.append(state)
  assert not bool(state.error[0])
  bits = jax.jit(runtime.allowed_bits)
  distinct = set()
  for n in (0, 1, 4, len(tokens) // 2, len(tokens)):
    _, restored = runtime.rewind(history, state, jnp.asarray([n], jnp.int32))
    expected = states[-1 - n]
    for got, want in zip(jax.tree.leaves(restored), jax.tree.leaves(expected)):
      np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    distinct.add(np.asarray(bits(tables, restored)).tobytes())
  assert len(distinct) >= 3  # the states rewound to allow different tokens
  # Further than the history holds: the row is flagged, never corrupted.
  _, past = runtime.rewind(history, state, jnp.asarray([len(tokens) + 1], jnp.int32))
  assert bool(past.error[0])


def test_aligned_sampling_with_a_lexer(model, tables):
  samples, store = cd.generate_aligned(model, "# code\n", constraint=tables, num_samples=8,
                                       batch_size=4, max_new_tokens=_BUDGET, seed=2)
  assert len(samples) == 8 and store.num_samples == 8
  assert _parse_finished(samples)
  efgs = store.prefixes()
  assert efgs and all(0.0 <= v <= 1.0 + 1e-6 for v in efgs.values())
  assert store.log_mass_bound <= 1e-6
  # Another grammar with a lexer is another constraint: its store does not carry over.
  other = cd.Compiler(model.vocab).compile(cd.Grammar(_NAMES, syntax="lark", lexer=True))
  with pytest.raises(cd.StoreMismatchError, match="constraint"):
    cd.generate_aligned(model, "# code\n", constraint=other, num_samples=4, batch_size=4,
                        max_new_tokens=_BUDGET, store=store)
  with pytest.raises(cd.UnsupportedFeatureError, match="not stacked"):
    cd.generate_aligned(model, "# code\n", constraint=[tables, cd.Regex("ab")],
                        num_samples=2)


def test_sharded_evaluation_equals_plain_greedy(model, tables, greedy):
  assert jax.local_device_count() == 8  # conftest: 8 host devices
  result = cd.evaluate(model, _PROMPTS, tables, max_new_tokens=_BUDGET, batch_size=8)
  assert [r.completion.token_ids for r in result.rows] == [c.token_ids for c in greedy]
  assert [r.conforms for r in result.rows] == [c.finished for c in greedy]
  with pytest.raises(cd.UnsupportedFeatureError, match="prompt 1 differs"):
    cd.evaluate(model, _PROMPTS[:2], [tables, cd.Regex("ab")], max_new_tokens=4)


def test_stacked_grammars_with_a_lexer_step_as_each_alone(model, tables, greedy):
  """Rows of a per-row list of two grammars with a lexer (stacked into one LexedTables)
  write, token for token, what each grammar writes alone."""
  names = cd.Compiler(model.vocab).compile(cd.Grammar(_NAMES, syntax="lark", lexer=True))
  alone = cd.generate(model, _PROMPTS, constraint=names, max_new_tokens=_BUDGET)
  assert any(a.token_ids != g.token_ids for a, g in zip(alone, greedy))  # not vacuous
  per_row = [tables if row % 2 == 0 else names for row in range(len(_PROMPTS))]
  mixed = cd.generate(model, _PROMPTS, constraint=per_row, max_new_tokens=_BUDGET)
  expected = [g if row % 2 == 0 else a for row, (g, a) in enumerate(zip(greedy, alone))]
  assert [c.token_ids for c in mixed] == [c.token_ids for c in expected]
  stacked = cd.stack_tables([names, tables])
  assert isinstance(stacked, cd.LexedTables) and stacked.num_constraints == 2
  ids = [1 - row % 2 for row in range(len(_PROMPTS))]
  again = cd.generate(model, _PROMPTS, constraint=stacked, constraint_ids=ids,
                      max_new_tokens=_BUDGET)
  assert again == mixed
  # Sharded evaluation stacks each distinct grammar once.
  once, row_ids = _evaluate._stack_per_row([names, tables, names], 3, model)  # pylint: disable=protected-access
  assert once.num_constraints == 2 and list(row_ids) == [0, 1, 0]
  with pytest.raises(cd.UnsupportedFeatureError, match="differs from constraint 0 in kind"):
    cd.generate(model, _PROMPTS[:2], constraint=[tables, cd.Regex("ab")], max_new_tokens=4)


def test_stacking_without_pynini_is_a_typed_refusal(model, tables, tmp_path):
  """Where pynini is missing, saved grammars load and step, but stacking (the host's
  offsets) raises UnsupportedFeatureError instead of an ImportError."""
  names = cd.Compiler(model.vocab).compile(cd.Grammar(_NAMES, syntax="lark", lexer=True))
  tables.save(tmp_path / "a.cdt", vocab=model.vocab)
  names.save(tmp_path / "b.cdt", vocab=model.vocab)
  script = (
      "import sys\n"
      "sys.modules['pynini'] = None\n"
      "import constrained_decoding as cd\n"
      "a, b = (cd.load_tables(p, vocab=None) for p in sys.argv[1:])\n"
      "try:\n"
      "  cd.stack_tables([a, b])\n"
      "except cd.UnsupportedFeatureError as e:\n"
      "  print('refused:', e)\n")
  out = subprocess.run([sys.executable, "-c", script, str(tmp_path / "a.cdt"),
                        str(tmp_path / "b.cdt")], capture_output=True, text=True, check=False)
  assert out.returncode == 0, out.stderr[-3000:]
  assert out.stdout.startswith("refused: stack_tables: stacking 2 grammars with a lexer")


def _job_config(tmp_path, **constraint):
  config = evaluation_job.default_config()
  data = tmp_path / "rows.jsonl"
  data.write_text("".join(json.dumps({"id": i, "prompt": p, "answer": ""}) + "\n"
                          for i, p in enumerate(_PROMPTS)))
  config.data_path = str(data)
  config.output_dir = str(tmp_path / "out")
  config.max_new_tokens = _BUDGET
  config.batch_size = 8
  config.constraint.update(constraint)
  return config


def test_evaluation_job_with_saved_lexed_tables(model, tables, greedy, tmp_path):
  path = str(tmp_path / "python.cdt")
  tables.save(path, vocab=model.vocab)
  config = _job_config(tmp_path, kind="grammar", value="", tables_path=path)
  summary = evaluation_job.run(config, model=model)
  with open(os.path.join(config.output_dir, evaluation_job.RESULTS), encoding="utf-8") as f:
    lines = [json.loads(line) for line in f]
  assert [line["token_ids"] for line in lines] == [list(c.token_ids) for c in greedy]
  for line in lines:
    if line["conforms"]:
      ast.parse(line["completion"])
  assert summary["conformance"] == sum(c.finished for c in greedy) / len(greedy)


def test_evaluation_job_compiles_builtin_grammars_and_refuses_mixing(model, tmp_path):
  rows = [evaluation_job.Row(index=0, id=0, prompt="x", constraint=("builtin_grammar", "sql"),
                             answer=None)]
  config = _job_config(tmp_path, kind="builtin_grammar", value="sql")
  evaluation_job.check_config(config)
  compiled = evaluation_job.compile_constraints(config, rows, model.vocab)
  assert isinstance(compiled["builtin_grammar", "sql"], cd.LexedTables)
  mixed = rows + [evaluation_job.Row(index=1, id=1, prompt="y", constraint=("regex", "ab"),
                                     answer=None)]
  with pytest.raises(cd.EvaluationJobError, match="grammar with a lexer .* not stacked"):
    evaluation_job.compile_constraints(config, mixed, model.vocab)
  two = rows + [evaluation_job.Row(index=1, id=1, prompt="y",
                                   constraint=("builtin_grammar", "python"), answer=None)]
  both = evaluation_job.compile_constraints(config, two, model.vocab)  # stack in evaluate
  assert all(isinstance(t, cd.LexedTables) for t in both.values()) and len(both) == 2
  unknown = [evaluation_job.Row(index=0, id=0, prompt="x",
                                constraint=("builtin_grammar", "cobol"), answer=None)]
  with pytest.raises(cd.EvaluationJobError, match="'cobol' does not exist"):
    evaluation_job.compile_constraints(config, unknown, model.vocab)
