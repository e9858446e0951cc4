"""Grade-school math word problems, answered in the format of the paper's Appendix D.

  python -m constrained_decoding.evaluate --config=configs/gsm_format.py --config.limit=8

The default data are problems written for this repository in the style of GSM8K
(benchmarks/conformance/arithmetic.jsonl; GSM8K itself is not copied here). Point the
job at your own copy of GSM8K's test split, whose answers end in "#### <number>":

  --config.data_path=/path/to/gsm8k/test.jsonl

Two answer formats (the part after the colon picks one):
  configs/gsm_format.py        (or :json) one JSON line {"Solution": "...", "Final
                               Answer": "N"}, constrained by a JSON Schema
  configs/gsm_format.py:hash   the calculation, then "#### N", as GSM8K writes answers

The model is the packaged Gemma 3 270M base model, so the prompt is few-shot and
completion style; accuracy is compared as numbers ("1,234" equals "1234").
"""

import json
import os

from constrained_decoding.evaluation_job import default_config

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Written for this repository (the same as benchmarks/conformance/run.py).
_EXAMPLES = (
    ("Mia has 4 bags with 6 oranges in each bag. She eats 5 oranges. How many oranges "
     "are left?", "4 * 6 = 24, 24 - 5 = 19", "19"),
    ("Leo has 35 coins and finds 17 more. How many coins does Leo have now?",
     "35 + 17 = 52", "52"),
    ("A teacher splits 42 pens equally among 7 students. How many pens does each student "
     "get?", "42 / 7 = 6", "6"),
)
# The Solution is a short calculation: a narrow class keeps the tables small and the
# 270M model on task.
# The schema is a file of its own so that `constrained-decoding compile --json-schema
# configs/gsm_answer.schema.json --whitespace single -o FILE` saves the same tables.
with open(os.path.join(_REPO, "configs", "gsm_answer.schema.json"), encoding="utf-8") as _f:
  _SCHEMA = json.load(_f)


def _json_prefix() -> str:
  lines = ['Solve each math word problem. Reply with a JSON object on one line: '
           '{"Solution": "the calculation", "Final Answer": "N"}, where N is the final '
           'answer (an integer).', ""]
  for question, solution, answer in _EXAMPLES:
    reply = json.dumps({"Solution": solution, "Final Answer": answer})
    lines.append(f"Question: {question}\nAnswer:\n{reply}\n")
  return "\n".join(lines) + "\n"


def _hash_prefix() -> str:
  lines = ["Solve each math word problem. Write the calculation, then #### and the final "
           "answer (an integer).", ""]
  for question, solution, answer in _EXAMPLES:
    lines.append(f"Question: {question}\nAnswer:\n{solution}\n#### {answer}\n")
  return "\n".join(lines) + "\n"


def get_config(answer_format: str = "json"):
  config = default_config()
  config.data_path = os.path.join(_REPO, "benchmarks", "conformance", "arithmetic.jsonl")
  config.output_dir = "/tmp/constrained_decoding_eval/gsm_format"
  config.prompt_template = "Question: {question}\nAnswer:\n"
  config.answer_field = "answer"
  config.answer_marker = "####"  # GSM8K's reference answers end in "#### N"
  config.numeric_answers = True
  if answer_format == "json":
    config.prompt_prefix = _json_prefix()
    config.constraint.kind = "json_schema"
    config.constraint.value = json.dumps(_SCHEMA)
    config.constraint.json_schema_whitespace = "single"
    config.answer_key = "Final Answer"
    config.max_new_tokens = 48
  elif answer_format == "hash":
    config.prompt_prefix = _hash_prefix()
    config.constraint.kind = "regex"
    config.constraint.value = r"[0-9 +*/=,.()-]{1,64}\n#### -?[0-9]{1,6}"
    config.answer_pattern = r"####\s*(-?[0-9,]+)"
    config.max_new_tokens = 40
  else:
    raise ValueError(f"gsm_format answer format {answer_format!r}. Expected 'json' or "
                     f"'hash' (configs/gsm_format.py:hash).")
  config.batch_size = 8
  return config
