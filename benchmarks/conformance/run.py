"""Format conformance and accuracy, unconstrained vs constrained (the paper's Table 3).

The paper (Sec. 6.2, App. D) asks Gemma for a JSON answer {"Final Answer": "X",
"Solution": "..."} to GPQA questions and counts the replies that conform to that schema:
0.09 (2B) and 0.65 (7B) without constraints, 1.0 with them. Here the model is the
Gemma 3 270M *base* model, so the prompt is few-shot completion-style (an instruction
line, three solved examples in the same JSON format, then the question) instead of
zero-shot chat. Two datasets (see make_datasets.py):

  multiple_choice  "Final Answer" first (as in the paper), then a short "Solution".
  arithmetic       "Solution" first (a chain of calculations), then "Final Answer" (an
                   integer), so that the model computes before it answers.

Constrained runs use a regex for exactly that JSON line (until JSON Schema support
lands). Its free-text part is bounded and uses a narrow character class, because the
cost of compiling a bounded free-text field grows with (length cap) x (tokens wholly
inside the class); see `SOLUTION_CLASS` below and the compile times in the output.

Conformance is checked independently of our regex: `json.loads` of the reply plus key,
type and value checks.
  strict   the whole reply (whitespace aside) is one conforming JSON object.
  lenient  the reply starts with a conforming JSON object; trailing text is ignored (a
           base model continues the few-shot pattern with the next question unless
           something stops it, which is what a client using raw_decode would accept).
Accuracy counts replies whose lenient parse conforms and has the right final answer.

Decoding is greedy and batched. Both modes get the same token budget per dataset: by
default the longest token path of the constraint plus end of sequence, so a constrained
reply can always finish.

Run from the repository root:
  python benchmarks/conformance/run.py                       # full run, batch 8
  python benchmarks/conformance/run.py --limit 2 --batch-size 2 --max-new-tokens 16
"""

import argparse
import collections
import dataclasses
import json
import os
import platform
import sys
import time
from collections.abc import Callable

_HERE = os.path.dirname(os.path.abspath(__file__))
_REPO = os.path.dirname(os.path.dirname(_HERE))
if _REPO not in sys.path:
  sys.path.insert(0, _REPO)  # Run as a script from a checkout.

import numpy as np  # pylint: disable=g-import-not-at-top

import constrained_decoding as cd  # pylint: disable=g-import-not-at-top

DEFAULT_OUT = os.path.join(_REPO, "benchmarks", "results", "conformance.json")
MC_KEYS = ("Final Answer", "Solution")
ARITH_KEYS = ("Solution", "Final Answer")

# Free-text classes. Lower-case only for multiple choice: with upper case too, about 77k
# Gemma tokens fit the class instead of about 48k, which pushes the padded edge table from
# 65,536 to 262,144 columns (4x the device memory) and doubles compile time.
MC_SOLUTION_CLASS = r"[a-z0-9 ,.'-]"
ARITH_SOLUTION_CLASS = r"[0-9 +*/=,.()-]"

MC_INSTRUCTION = (
    'Answer each multiple-choice question with a JSON object on one line: '
    '{"Final Answer": "X", "Solution": "short explanation"}, where X is the letter of the '
    'correct option (A, B, C or D).')
MC_EXAMPLES = (
    ({"question": "Which planet is known as the Red Planet?",
      "options": {"A": "Venus", "B": "Mars", "C": "Jupiter", "D": "Saturn"}},
     {"Final Answer": "B", "Solution": "mars looks red because of iron oxide dust."}),
    ({"question": "What is the chemical symbol for iron?",
      "options": {"A": "Fe", "B": "Ir", "C": "In", "D": "F"}},
     {"Final Answer": "A", "Solution": "the symbol fe comes from the latin word ferrum."}),
    ({"question": "How many sides does a square have?",
      "options": {"A": "Three", "B": "Five", "C": "Six", "D": "Four"}},
     {"Final Answer": "D", "Solution": "a square has four equal sides."}),
)
ARITH_INSTRUCTION = (
    'Solve each math word problem. Reply with a JSON object on one line: '
    '{"Solution": "the calculation", "Final Answer": "N"}, where N is the final answer '
    '(an integer).')
ARITH_EXAMPLES = (
    ({"question": "Mia has 4 bags with 6 oranges in each bag. She eats 5 oranges. How many "
                  "oranges are left?"},
     {"Solution": "4 * 6 = 24, 24 - 5 = 19", "Final Answer": "19"}),
    ({"question": "Leo has 35 coins and finds 17 more. How many coins does Leo have now?"},
     {"Solution": "35 + 17 = 52", "Final Answer": "52"}),
    ({"question": "A teacher splits 42 pens equally among 7 students. How many pens does "
                  "each student get?"},
     {"Solution": "42 / 7 = 6", "Final Answer": "6"}),
)


@dataclasses.dataclass(frozen=True)
class Task:
  """One dataset: how to prompt, which regex constrains it, how to check a reply."""

  name: str
  path: str
  keys: tuple[str, ...]
  instruction: str
  examples: tuple
  pattern: str
  answer_ok: Callable[[str], bool]  # Is the "Final Answer" string well formed?


def mc_pattern(solution_chars: int) -> str:
  return (r'\{"Final Answer": "[ABCD]", "Solution": "' + MC_SOLUTION_CLASS
          + f'{{0,{solution_chars}}}' + r'"\}')


def arith_pattern(solution_chars: int) -> str:
  return (r'\{"Solution": "' + ARITH_SOLUTION_CLASS + f'{{0,{solution_chars}}}'
          + r'", "Final Answer": "-?\d{1,6}"\}')


def _is_letter(answer: str) -> bool:
  return answer in ("A", "B", "C", "D")


def _is_integer(answer: str) -> bool:
  digits = answer[1:] if answer.startswith("-") else answer
  return digits.isascii() and digits.isdigit()


def make_tasks(mc_chars: int, arith_chars: int) -> list[Task]:
  return [
      Task("multiple_choice", os.path.join(_HERE, "multiple_choice.jsonl"), MC_KEYS,
           MC_INSTRUCTION, MC_EXAMPLES, mc_pattern(mc_chars), _is_letter),
      Task("arithmetic", os.path.join(_HERE, "arithmetic.jsonl"), ARITH_KEYS,
           ARITH_INSTRUCTION, ARITH_EXAMPLES, arith_pattern(arith_chars), _is_integer),
  ]


# ------------------------------------------------------------------------------ prompts


def _question_block(record: dict) -> str:
  lines = [f"Question: {record['question']}"]
  lines += [f"{k}. {v}" for k, v in record.get("options", {}).items()]
  return "\n".join(lines) + "\nAnswer:\n"


def build_prompt(task: Task, record: dict) -> str:
  """Few-shot completion prompt: instruction, solved examples, then the question."""
  parts = [task.instruction, ""]
  for example, reply in task.examples:
    parts.append(_question_block(example) + json.dumps(reply) + "\n")
  parts.append(_question_block(record))
  return "\n".join(parts)


# --------------------------------------------------------------------------- validation


@dataclasses.dataclass(frozen=True)
class Verdict:
  """How one reply fares under the independent JSON check.

  `problem` names the first check a non-conforming reply fails: not_json,
  duplicate_keys, not_object, keys, types or answer_form ("" when it conforms).
  """

  strict: bool
  lenient: bool
  final_answer: str | None
  problem: str = ""


class _DuplicateKeyError(ValueError):
  pass


def _no_duplicates(pairs: list) -> dict:
  """`json` keeps the last of repeated keys silently; a schema check on the dict would
  then miss replies such as {"Final Answer": "8", "Final Answer": "8"}."""
  keys = [k for k, _ in pairs]
  if len(set(keys)) != len(keys):
    raise _DuplicateKeyError(keys)
  return dict(pairs)


_DECODER = json.JSONDecoder(object_pairs_hook=_no_duplicates)


def check_reply(task: Task, text: str) -> Verdict:
  """json-parses `text` and checks keys, value types and the final answer's form."""
  body = text.lstrip()
  try:
    obj, end = _DECODER.raw_decode(body)
  except _DuplicateKeyError:
    return Verdict(False, False, None, "duplicate_keys")
  except json.JSONDecodeError:
    return Verdict(False, False, None, "not_json")
  if not isinstance(obj, dict):
    problem = "not_object"
  elif set(obj) != set(task.keys):
    problem = "keys"
  elif not all(isinstance(obj[k], str) for k in task.keys):
    problem = "types"
  elif not task.answer_ok(obj["Final Answer"]):
    problem = "answer_form"
  else:
    return Verdict(strict=not body[end:].strip(), lenient=True,
                   final_answer=obj["Final Answer"])
  return Verdict(False, False, None, problem)


# ---------------------------------------------------------------------------- compiling


def longest_token_path(tables: cd.ConstraintTables) -> int | None:
  """Most tokens a reply can have before end of sequence (None if unbounded)."""
  targets = np.asarray(tables.edge_targets)
  edge_start = np.asarray(tables.edge_start)
  groups = np.asarray(tables.state_groups)
  terminals = np.asarray(tables.state_terminals)[:, :, 1]
  succ = []
  for s in range(groups.shape[0]):
    found = [targets[edge_start[g]:edge_start[g + 1]] for g in groups[s] if g >= 0]
    found.append(terminals[s])
    row = np.concatenate(found)
    succ.append(np.unique(row[row >= 0]))
  memo: dict[int, int] = {}
  on_stack: set[int] = set()

  def longest(s: int) -> int:
    if s in memo:
      return memo[s]
    if s in on_stack:
      raise RecursionError("cycle")
    on_stack.add(s)
    memo[s] = max((1 + longest(int(t)) for t in succ[s]), default=0)
    on_stack.discard(s)
    return memo[s]

  try:
    return longest(int(np.asarray(tables.start)[0]))
  except RecursionError:
    return None


def compile_task(compiler: cd.Compiler, task: Task) -> tuple[cd.ConstraintTables, dict]:
  """Compiles the task's regex (fresh, not memoized) and reports its cost."""
  t0 = time.perf_counter()
  tables, info = compiler.compile_with_info(cd.Regex(task.pattern))
  wall = time.perf_counter() - t0
  return tables, {
      "pattern": task.pattern,
      "seconds": round(wall, 4),
      "stage_seconds": {k: round(v, 4) for k, v in info.seconds.items()},
      "token_states": info.token_states,
      "token_edges": info.token_edges,
      "num_masks": info.num_masks,
      "table_bytes": info.nbytes["total"],
      "table_shape_SK": list(np.asarray(tables.edge_tokens).shape),
      "longest_token_path": longest_token_path(tables),
  }


# ---------------------------------------------------------------------------- decoding


def generate_all(model, prompts: list[str], tables, batch_size: int,
                 max_new_tokens: int) -> list[dict]:
  """Greedy replies in batches; the last batch is padded with its last prompt so
  every call has the same shape (one jit compilation per mode and dataset)."""
  out = []
  for start in range(0, len(prompts), batch_size):
    chunk = prompts[start:start + batch_size]
    padded = chunk + [chunk[-1]] * (batch_size - len(chunk))
    done = cd.generate(model, padded, constraint=tables, max_new_tokens=max_new_tokens,
                       sampling=cd.SamplingConfig(temperature=0.0))
    out.extend({"text": c.text, "tokens": len(c.token_ids), "finished": c.finished,
                "error": c.error} for c in done[:len(chunk)])
    print(f"    {start + len(chunk)}/{len(prompts)}", flush=True)
  return out


def score(task: Task, records: list[dict], replies: list[dict]) -> tuple[dict, list]:
  """Summary numbers and one row per reply (`replies`: text, tokens, finished, error)."""
  rows = []
  for record, reply in zip(records, replies):
    verdict = check_reply(task, reply["text"])
    rows.append({"id": record["id"], "text": reply["text"], "tokens": reply["tokens"],
                 "finished": reply["finished"], "error": reply["error"],
                 "strict": verdict.strict, "lenient": verdict.lenient,
                 "problem": verdict.problem, "predicted": verdict.final_answer,
                 "correct": verdict.final_answer == record["answer"]})
  n = len(rows)
  summary = {
      "n": n,
      "conform_strict": sum(r["strict"] for r in rows) / n,
      "conform_lenient": sum(r["lenient"] for r in rows) / n,
      "accuracy": sum(r["correct"] for r in rows) / n,
      "finished": sum(r["finished"] for r in rows) / n,
      "constraint_errors": sum(r["error"] for r in rows),
      "mean_tokens": float(np.mean([r["tokens"] for r in rows])),
      "problems": dict(collections.Counter(r["problem"] for r in rows if r["problem"])),
  }
  return summary, rows


def load_records(task: Task, limit: int) -> list[dict]:
  with open(task.path, encoding="utf-8") as f:
    records = [json.loads(line) for line in f if line.strip()]
  return records[:limit] if limit else records


def run_task(model, compiler, task: Task, args) -> dict:
  """Unconstrained then constrained greedy decoding of one dataset."""
  records = load_records(task, args.limit)
  tables, compile_info = compile_task(compiler, task)
  budget = args.max_new_tokens or (compile_info["longest_token_path"] or 128) + 1
  prompts = [build_prompt(task, r) for r in records]
  print(f"{task.name}: {len(records)} questions, max_new_tokens={budget}, compile "
        f"{compile_info['seconds']:.3f}s", flush=True)
  result = {"compile": compile_info, "max_new_tokens": budget,
            "prompt_tokens_mean": float(np.mean([len(model.encode(p)) for p in prompts])),
            "modes": {}}
  for mode, constraint in (("unconstrained", None), ("constrained", tables)):
    print(f"  {mode}", flush=True)
    t0 = time.perf_counter()
    replies = generate_all(model, prompts, constraint, args.batch_size, budget)
    summary, rows = score(task, records, replies)
    summary["seconds"] = round(time.perf_counter() - t0, 2)
    result["modes"][mode] = {"summary": summary, "replies": rows}
  return result


# ------------------------------------------------------------------------------ report


def markdown_table(results: dict) -> str:
  """Table 3 style: conformance (and accuracy) without and with the constraint."""
  lines = [
      "| dataset | n | conform strict (unc.) | conform strict (con.) | conform lenient "
      "(unc.) | conform lenient (con.) | accuracy (unc.) | accuracy (con.) | compile |",
      "|---|---|---|---|---|---|---|---|---|",
  ]
  for name, r in results.items():
    u, c = r["modes"]["unconstrained"]["summary"], r["modes"]["constrained"]["summary"]
    lines.append(
        f"| {name} | {u['n']} | {u['conform_strict']:.2f} | {c['conform_strict']:.2f} | "
        f"{u['conform_lenient']:.2f} | {c['conform_lenient']:.2f} | {u['accuracy']:.2f} | "
        f"{c['accuracy']:.2f} | {r['compile']['seconds'] * 1e3:.0f} ms |")
  return "\n".join(lines)


def rescore(path: str, tasks: list[Task]) -> dict:
  """Re-applies `check_reply` to the replies stored in an earlier report (no model run),
  e.g. after a change to the checks. Greedy replies are deterministic, so this equals
  a rerun with the same settings."""
  with open(path, encoding="utf-8") as f:
    report = json.load(f)
  for task in tasks:
    if task.name not in report["datasets"]:
      continue
    records = {r["id"]: r for r in load_records(task, 0)}
    for mode in report["datasets"][task.name]["modes"].values():
      rows = mode["replies"]
      summary, new_rows = score(task, [records[r["id"]] for r in rows], rows)
      summary["seconds"] = mode["summary"]["seconds"]
      mode.update(summary=summary, replies=new_rows)
  report["table_markdown"] = markdown_table(report["datasets"])
  report["rescored"] = "checks re-applied to the stored replies by --rescore"
  return report


def write_report(report: dict, path: str) -> None:
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  with open(path, "w", encoding="utf-8") as f:
    json.dump(report, f, indent=1, ensure_ascii=False)
  print(f"\nwrote {path}")


def environment() -> dict:
  import jax  # pylint: disable=g-import-not-at-top
  return {"python": platform.python_version(), "jax": jax.__version__,
          "backend": jax.default_backend(), "machine": platform.machine(),
          "cpus": os.cpu_count()}


def parse_args() -> argparse.Namespace:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--limit", type=int, default=0,
                      help="First N questions per dataset (0: all).")
  parser.add_argument("--batch-size", type=int, default=8)
  parser.add_argument("--max-new-tokens", type=int, default=0,
                      help="Token budget for both modes (0: longest constrained reply + 1).")
  parser.add_argument("--mc-solution-chars", type=int, default=48,
                      help="Length cap of the multiple-choice Solution string.")
  parser.add_argument("--arith-solution-chars", type=int, default=64,
                      help="Length cap of the arithmetic Solution string.")
  parser.add_argument("--datasets", default="multiple_choice,arithmetic")
  parser.add_argument("--out", default=DEFAULT_OUT)
  parser.add_argument("--rescore", default="",
                      help="Only re-check the replies stored in this earlier report.")
  return parser.parse_args()


def main() -> None:
  args = parse_args()
  wanted = args.datasets.split(",")
  tasks = [t for t in make_tasks(args.mc_solution_chars, args.arith_solution_chars)
           if t.name in wanted]
  if args.rescore:
    report = rescore(args.rescore, tasks)
    print(report["table_markdown"])
    write_report(report, args.out)
    return
  t0 = time.perf_counter()
  model = cd.models.Gemma3.from_gguf()
  load_seconds = time.perf_counter() - t0
  t0 = time.perf_counter()
  compiler = cd.Compiler(model.vocab)
  trie_seconds = time.perf_counter() - t0
  results = {t.name: run_task(model, compiler, t, args) for t in tasks}
  table = markdown_table(results)
  print("\n" + table)
  report = {
      "benchmark": "conformance",
      "model": "Gemma 3 270M (base, GGUF Q4_K_M dequantized)",
      "decoding": "greedy",
      "batch_size": args.batch_size,
      "limit": args.limit,
      "model_load_seconds": round(load_seconds, 2),
      "compiler_init_seconds": round(trie_seconds, 3),
      "environment": environment(),
      "table_markdown": table,
      "datasets": results,
  }
  write_report(report, args.out)


if __name__ == "__main__":
  main()
