"""Issue 18's acceptance for Python (and Go) with the Gemma 3 vocabulary, on the device step.

```sh
.venv/bin/python benchmarks/python_acceptance.py                    # python and go, full
.venv/bin/python benchmarks/python_acceptance.py --langs python --functions 40 \
    --mutants 40 --walks 64 --out /tmp/pa_smoke.json                # a quick look
```

Per language, `cd.Compiler(vocab).compile(cd.Grammar.builtin(lang))` with the Gemma 3
vocabulary (262,144 tokens, the packaged GGUF), stepped by `runtime/_lexed.py`'s jitted
`advance` and `allowed_tokens`, `--batch` rows at a time. Three checks, each against an
independent oracle (`ast.parse` for Python, `gofmt -e` for Go):

1. **Real functions accepted.** Python: top-level functions of this interpreter's
   `Lib/*.py`, filtered to the grammar's subset by their AST with the test suite's own
   filter (`tests/runtime/lexed_python_test.py` `_stdlib_functions`, `_in_subset`;
   imported, not copied). Go: the functions of `tests/data/go/*.go` (written for the
   tests, gofmt-checked), each as a file of its own (`lexed_go_test._functions`). Each is
   fed as Gemma's own SentencePiece tokenization and `--random` random segmentations into
   Gemma tokens that spell the same bytes (`testing.TokenIndex.random_tokenization`:
   uniform over the tokens that fit at each position), then end of sequence: every token
   must be taken and the end accepted.
2. **Broken functions refused.** One token of a function's canonical tokenization deleted
   or duplicated, drawn until `--mutants` of them are refused by the oracle. The tables
   must refuse each (a token refused, or the end), never accept it, and not before the
   mutated token (the prefix before it is a prefix of a valid text). Up to `--mutants`
   mutants the oracle accepts are also run: a refusal there is reported, and for Python
   counted as a finding only when the mutant is still in the subset (`_in_subset`, and
   no string escape that CPython warns about: the grammar's strings take only the
   escapes Python defines; deleting the `r` of `r"\("` makes one).
3. **Random walks.** Over the allowed tokens (end of sequence excluded) for the first
   `--wind-down` tokens (the end with chance 0.01): uniform, or with chance
   `--structural-bias` uniform among the ASCII ones with a byte other than
   `[A-Za-z0-9_]` (most of Gemma's tokens continue a name or are other scripts); then
   winding down until `--steps`: closing tokens (`_CLOSERS`) drawn with chance 0.8 and
   the end taken with chance 0.5 when allowed. No row may ever have an empty mask (nor `advance` refuse an offered token);
   every finished text must pass the oracle. Walks start at the text's start (Python: half of
   them after `def f(a, b=1):\\n    `; Go: after a function header, as the test suite's).

Writes `benchmarks/results/python_acceptance.json` (counts, failures with examples, CPU
and wall times, load average, commit).
"""

import argparse
import ast
import importlib.util
import json
import os
import random
import re
import shutil
import subprocess
import sys
import time
import warnings
from concurrent import futures

import jax
import jax.numpy as jnp
import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, REPO)

import constrained_decoding as cd  # noqa: E402
from constrained_decoding.runtime import _lexed  # noqa: E402
from constrained_decoding import testing as cd_testing  # noqa: E402
from constrained_decoding.testing import TokenIndex  # noqa: E402

_WALK_PREFIXES = {"python": (b"", b"def f(a, b=1):\n    "),
                  "go": (b"package p\n\nfunc f(x int, s []string) int {\n\t",)}
_CLOSERS = {"python": (b")", b"]", b"}", b"\n", b"0", b"x", b" ", b":", b"'", b"\"",
                       b"\"\"\"", b"\'\'\'", b"\n    ", b" pass", b"\n\n"),
            "go": (b")", b"]", b"}", b"\n", b"0", b"x", b" ", b"\"", b"'", b"`", b"*/",
                   b";", b"}\n")}


def _test_module(name):
  """A module of `tests/runtime/` (the suite's filters and data, imported not copied)."""
  path = os.path.join(REPO, "tests", "runtime", name + ".py")
  spec = importlib.util.spec_from_file_location(name, path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def python_parses(text: bytes) -> bool:
  """CPython's verdict (warnings such as invalid escapes are not errors)."""
  with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    try:
      ast.parse(text.decode("utf-8"))
      return True
    except (SyntaxError, ValueError, UnicodeDecodeError):
      return False


def gofmt_accepts(text: bytes) -> bool:
  """go/parser's verdict through `gofmt -e`. gofmt 1.19 panics formatting an import
  group written on one line with `;`, after parsing: not a syntax error."""
  r = subprocess.run(["gofmt", "-e"], input=text, capture_output=True, timeout=60)
  return r.returncode == 0 or b"invalid line number" in r.stderr


def _judge_all(oracle, texts):
  with futures.ThreadPoolExecutor(4) as pool:
    return list(pool.map(oracle, texts))


def functions(lang: str) -> list[str]:
  """The texts of check 1 (see the module docstring)."""
  if lang == "python":
    suite = _test_module("lexed_python_test")
    return [body for _, _, body in suite._stdlib_functions() if suite._in_subset(body)]  # pylint: disable=protected-access
  return _test_module("lexed_go_test")._functions()  # pylint: disable=protected-access


def _subset_filter(lang):
  """Python: whether a text (that parses) is in the grammar's subset, by the suite's AST
  filter; Go: always (the grammar claims the language)."""
  if lang != "python":
    return lambda text: True
  suite = _test_module("lexed_python_test")
  def in_subset(text: bytes) -> bool:
    # The grammar's strings take the escapes Python defines only: CPython warns about
    # the others ("invalid escape sequence"), the suite's filter does not look.
    with warnings.catch_warnings(record=True) as caught:
      warnings.simplefilter("always")
      try:
        if not suite._in_subset(text.decode("utf-8")):  # pylint: disable=protected-access
          return False
      except (SyntaxError, ValueError, UnicodeDecodeError):
        return False
    return not any("invalid escape sequence" in str(w.message) for w in caught)
  return in_subset


class Stepper:
  """One compiled grammar, its jitted device step and batched runs over it."""

  def __init__(self, lang, vocab, batch, structural_bias=0.5, wind_down=40):
    self.vocab, self.batch, self.structural_bias = vocab, batch, structural_bias
    self.wind_down = wind_down
    self.eos = vocab.eos_ids[0]
    t0, c0 = time.perf_counter(), time.process_time()
    self.tables = cd.Compiler(vocab).compile(cd.Grammar.builtin(lang))
    self.compile_s = time.perf_counter() - t0
    self.compile_cpu_s = time.process_time() - c0
    self.allowed = jax.jit(_lexed.allowed_tokens)
    self.advance = jax.jit(_lexed.advance)

  def run(self, rows):
    """Feeds token rows then end of sequence: (accepted [R], first refused token index
    or -1 [R]); rows batched by length."""
    return cd_testing.run_lexed_rows(self.tables, rows, self.eos, self.batch, self.advance)

  def walks(self, lang, n, steps, rng):
    """`n` random walks (module docstring, check 3): (finished texts, dead ends as
    texts, texts unfinished after `steps`)."""
    by_bytes = {t: i for i, t in enumerate(self.vocab.token_bytes) if t}
    closers = np.array([by_bytes[c] for c in _CLOSERS[lang] if c in by_bytes])
    # ASCII tokens with a byte other than a letter, digit or `_`: most of the
    # vocabulary continues a name (or is other scripts, in strings and comments), so a
    # uniform walk would mostly write one long name.
    text = np.array([t is not None for t in self.vocab.token_bytes])
    structural = np.flatnonzero([t is not None and t.isascii() and bool(
        re.search(rb"[^A-Za-z0-9_]", t)) for t in self.vocab.token_bytes])
    anything = np.flatnonzero(text)  # EOS tokens have no text
    textless = np.setdiff1d(np.flatnonzero(~text), self.vocab.eos_ids)
    eos_ids = np.array(self.vocab.eos_ids)
    prefixes = _WALK_PREFIXES[lang]
    finished, dead, unfinished = [], [], []
    b = self.batch
    for k in range(0, n, b):
      prefix = prefixes[(k // b) % len(prefixes)]
      state = _lexed.init_state(self.tables, b)
      for t in prefix:
        state = self.advance(self.tables, state, jnp.full(b, by_bytes[bytes([t])], jnp.int32))
      texts = [prefix] * b
      ended = np.zeros(b, bool)
      for step in range(steps):
        allowed = np.asarray(self.allowed(self.tables, state))
        empty, leak = ~allowed.any(1), allowed[:, textless].any(1)
        tokens = np.full(b, self.eos, np.int32)
        late = step >= self.wind_down
        for r in range(b):
          if ended[r]:
            continue
          if empty[r] or leak[r]:
            dead.append((b"TEXTLESS TOKEN ALLOWED: " if leak[r] else b"") + texts[r])
            ended[r] = True
            continue
          if allowed[r, eos_ids].any() and rng.random() < (0.5 if late else 0.01):
            finished.append(texts[r])
            ended[r] = True
            continue
          token = -1
          if late and rng.random() < 0.8:
            token = _draw(allowed[r], closers, rng)
          elif rng.random() < self.structural_bias:
            token = _draw(allowed[r], structural, rng)
          if token < 0:
            token = _draw(allowed[r], anything, rng)
          if token < 0:  # only the end is left
            finished.append(texts[r])
            ended[r] = True
            continue
          tokens[r] = token
          texts[r] += self.vocab.token_bytes[token]
        if ended.all():
          break
        state = self.advance(self.tables, state, jnp.asarray(tokens))
        err = np.asarray(state.error) & ~ended
        if err.any():  # a token the mask offered and advance refused
          for r in np.flatnonzero(err):
            dead.append(b"ADVANCE REFUSED AN OFFERED TOKEN: " + texts[r])
          ended |= err
      unfinished += [t for t, e in zip(texts, ended) if not e]
    return finished, dead, unfinished


def _draw(allowed, candidates, rng, tries=32) -> int:
  """A token drawn uniformly among the `candidates` that `allowed` (one row's mask)
  offers, or -1 if none: by rejection (the first offered of `tries` uniform draws is
  uniform over the offered ones), else from the offered list."""
  draws = candidates[rng.integers(0, len(candidates), tries)]
  hits = draws[allowed[draws]]
  if len(hits):
    return int(hits[0])
  offered = candidates[allowed[candidates]]
  return int(rng.choice(offered)) if len(offered) else -1


def _mutants(rows, oracle, count, rng, vocab):
  """(text, tokens, mutated token index, oracle verdict): random one-token deletions or
  duplications of the rows, drawn until `count` are refused by the oracle (those, and up
  to `count` it accepts)."""
  refused, accepted = [], []
  while len(refused) < count:
    drawn = []
    for _ in range(count):
      ids = rng.choice(rows)
      i = rng.randrange(len(ids))
      new = ids[:i] + ids[i + 1:] if rng.random() < 0.5 else ids[:i + 1] + ids[i:]
      drawn.append((b"".join(vocab.token_bytes[t] for t in new), new, i))
    for m, ok in zip(drawn, _judge_all(oracle, [t for t, _, _ in drawn])):
      (accepted if ok else refused).append(m + (ok,))
  return refused[:count] + accepted[:count]


def _show(text: bytes, limit=400) -> str:
  s = text.decode("utf-8", "replace")
  return s if len(s) <= limit else s[:limit // 2] + " ... " + s[-limit // 2:]


def check_language(lang, vocab, spm_encode, args):
  """The three checks for one language: its report."""
  rng, nprng = random.Random(args.seed), np.random.default_rng(args.seed)
  oracle = python_parses if lang == "python" else gofmt_accepts
  report = {}
  c0, t0 = time.process_time(), time.perf_counter()
  stepper = Stepper(lang, vocab, args.batch, args.structural_bias, args.wind_down)
  report["compile_s"], report["compile_cpu_s"] = (round(stepper.compile_s, 2),
                                                  round(stepper.compile_cpu_s, 2))
  index = TokenIndex(vocab)
  texts = functions(lang)
  report["functions_available"] = len(texts)
  texts = rng.sample(texts, min(args.functions, len(texts)))
  assert all(_judge_all(oracle, [t.encode() for t in texts]))
  rows, owner, kinds = [], [], []
  for k, text in enumerate(texts):
    canonical = list(spm_encode(text))
    if b"".join(vocab.token_bytes[t] or b"\0" for t in canonical) != text.encode():
      canonical = index.longest_tokenization(text.encode())
    rows.append(canonical), owner.append(k), kinds.append("canonical")
    for _ in range(args.random):
      rows.append(index.random_tokenization(text.encode(), rng))
      owner.append(k), kinds.append("random")
  accepted, first_bad = stepper.run(rows)
  refused = [{"kind": kinds[r], "text": texts[owner[r]],
              "refused_at_byte": (len(b"".join(vocab.token_bytes[t] for t in rows[r][:first_bad[r]]))
                                  if first_bad[r] >= 0 else "end"),
              "token": (repr(vocab.token_bytes[rows[r][first_bad[r]]])
                        if 0 <= first_bad[r] < len(rows[r]) else "eos")}
             for r in range(len(rows)) if not accepted[r]]
  report["functions"] = {
      "functions": len(texts), "tokenizations": len(rows),
      "tokens": sum(map(len, rows)), "refused_tokenizations": len(refused),
      "refused_functions": len({f["text"] for f in refused}),
      "examples": refused[:5], "cpu_s": round(time.process_time() - c0, 1),
      "wall_s": round(time.perf_counter() - t0, 1)}
  print(f"{lang} functions: {report['functions']}"[:600], flush=True)

  c0, t0 = time.process_time(), time.perf_counter()
  canon = [rows[r] for r in range(len(rows)) if kinds[r] == "canonical"]
  mutants = _mutants(canon, oracle, args.mutants, rng, vocab)
  acc, bad = stepper.run([m[1] for m in mutants])
  false_accepts = [m[0].decode("utf-8", "replace") for m, a in zip(mutants, acc)
                   if not m[3] and a]
  early = [{"text": _show(m[0]), "mutated_token": m[2], "refused_token": b_}
           for m, a, b_ in zip(mutants, acc, bad) if not m[3] and 0 <= b_ < m[2]]
  refused_valid = [(m[0], m[1], b_) for m, a, b_ in zip(mutants, acc, bad) if m[3] and not a]
  in_subset = _subset_filter(lang)
  refused_valid_in_subset = [
      {"text": t.decode("utf-8", "replace"), "refused_at_byte": len(
          b"".join(vocab.token_bytes[k] for k in ids[:b_])) if b_ >= 0 else "end"}
      for t, ids, b_ in refused_valid if in_subset(t)]
  refused_valid = [_show(t) for t, _, _ in refused_valid]
  broken = [(m, b_) for m, b_ in zip(mutants, bad) if not m[3]]
  report["mutants"] = {
      "mutants": len(mutants), "oracle_refuses": len(broken),
      "false_accepts": len(false_accepts), "refused_before_mutation": len(early),
      "refused_at_mutated_token": sum(b_ == m[2] for m, b_ in broken),
      "refused_later_token": sum(b_ > m[2] for m, b_ in broken),
      "refused_at_end": sum(b_ < 0 for m, b_ in broken),
      "oracle_accepts": len(mutants) - len(broken),
      "oracle_accepts_tables_refuse": len(refused_valid),
      "oracle_accepts_tables_refuse_in_subset": len(refused_valid_in_subset),
      "examples": {"false_accepts": false_accepts[:5], "early": early[:5],
                   "oracle_accepts_tables_refuse": refused_valid[:8],
                   "oracle_accepts_tables_refuse_in_subset": refused_valid_in_subset[:8]},
      "cpu_s": round(time.process_time() - c0, 1), "wall_s": round(time.perf_counter() - t0, 1)}
  print(f"{lang} mutants: {report['mutants']}"[:600], flush=True)

  c0, t0 = time.process_time(), time.perf_counter()
  finished, dead, unfinished = stepper.walks(lang, args.walks, args.steps, nprng)
  verdicts = _judge_all(oracle, finished)
  wrong = [t.decode("utf-8", "replace") for t, v in zip(finished, verdicts) if not v]
  lengths = [len(t) for t in finished]
  report["walks"] = {
      "walks": args.walks, "steps": args.steps, "finished": len(finished),
      "unfinished": len(unfinished), "dead_ends": len(dead), "oracle_refuses": len(wrong),
      "finished_bytes_median": int(np.median(lengths)) if lengths else 0,
      "finished_bytes_max": max(lengths, default=0),
      "examples": {"dead_ends": [_show(t) for t in dead[:5]], "oracle_refuses": wrong[:5],
                   "finished": [_show(t, 300) for t in finished[:3]],
                   "unfinished": [_show(t, 300) for t in unfinished[:3]]},
      "cpu_s": round(time.process_time() - c0, 1), "wall_s": round(time.perf_counter() - t0, 1)}
  print(f"{lang} walks: {report['walks']}"[:600], flush=True)
  report["passed"] = (not refused and not false_accepts and not early and not dead
                      and not wrong and not refused_valid_in_subset)
  return report


def _table(reports) -> str:
  lines = ["| lang | functions (tokenizations) refused | mutants oracle-refused: false"
           " accepts / early | walks finished / unfinished: dead ends, oracle refuses |"
           " CPU s |", "|---|---|---|---|---|"]
  for lang, r in reports.items():
    f, m, w = r["functions"], r["mutants"], r["walks"]
    lines.append(
        f"| {lang} | {f['refused_functions']}/{f['functions']} ({f['refused_tokenizations']}"
        f"/{f['tokenizations']}) | {m['oracle_refuses']}: {m['false_accepts']} /"
        f" {m['refused_before_mutation']} | {w['finished']} / {w['unfinished']}:"
        f" {w['dead_ends']}, {w['oracle_refuses']} |"
        f" {f['cpu_s'] + m['cpu_s'] + w['cpu_s']:.0f} |")
  return "\n".join(lines)


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--langs", default="python,go")
  parser.add_argument("--functions", type=int, default=320,
                      help="functions per language (Go has 45: all of them)")
  parser.add_argument("--random", type=int, default=2,
                      help="random tokenizations per function besides Gemma's own")
  parser.add_argument("--mutants", type=int, default=400)
  parser.add_argument("--walks", type=int, default=2048)
  parser.add_argument("--steps", type=int, default=160, help="walks: most tokens")
  parser.add_argument("--wind-down", type=int, default=40,
                      help="walks: the step from which they wind down (default 40)")
  parser.add_argument("--structural-bias", type=float, default=0.5,
                      help="walks: chance of drawing among allowed tokens with a byte"
                           " other than [A-Za-z0-9_] (default 0.5)")
  parser.add_argument("--batch", type=int, default=64)
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--out", default=os.path.join(HERE, "results", "python_acceptance.json"))
  args = parser.parse_args(argv)
  from constrained_decoding import models  # pylint: disable=g-import-not-at-top
  from constrained_decoding.vocab._spm_from_gguf import sentencepiece_from_gguf  # pylint: disable=g-import-not-at-top
  path = models.default_gguf_path()
  vocab = cd.Vocabulary.from_gguf(path)
  spm = sentencepiece_from_gguf(path)
  commit = subprocess.run(["git", "-C", REPO, "rev-parse", "--short", "HEAD"],
                          capture_output=True, text=True).stdout.strip()
  out = {"command": " ".join(["benchmarks/python_acceptance.py"] + (argv or sys.argv[1:])),
         "commit": commit, "vocab": "gemma3 (262,144)", "load_average_start": os.getloadavg(),
         "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "jax_backend": jax.default_backend(),
         "args": vars(args), "languages": {}}
  for lang in args.langs.split(","):
    if lang == "go" and shutil.which("gofmt") is None:
      out["languages"]["go"] = {"skipped": "gofmt is not on PATH"}
      print("go: skipped, gofmt is not on PATH")
      continue
    out["languages"][lang] = check_language(lang, vocab, spm.EncodeAsIds, args)
  out["load_average_end"] = os.getloadavg()
  done = {k: v for k, v in out["languages"].items() if "skipped" not in v}
  print()
  print(_table(done))
  os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
  with open(args.out, "w") as f:
    json.dump(out, f, indent=1)
  print("wrote", args.out)
  return 0 if all(v["passed"] for v in done.values()) else 1


if __name__ == "__main__":
  sys.exit(main())
