"""Graduate-level multiple choice (A-D) answered as {"Final Answer": X, "Solution": ...}.

  python -m constrained_decoding.evaluate --config=configs/gpqa_format.py --config.limit=8

The paper (Sec. 6.2, App. D) asks for this JSON answer on GPQA. GPQA's terms forbid
publishing its questions, so the default data are questions written for this repository
in that format (benchmarks/conformance/multiple_choice.jsonl: question, options A-D,
answer letter). Your own copy, converted to the same fields, is one flag away:

  --config.data_path=/path/to/your_questions.jsonl

The answer is scored by its "Final Answer" field (`answer_key`), not as whole text.
"""

import json
import os

from constrained_decoding.evaluation_job import default_config

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Written for this repository (the same as benchmarks/conformance/run.py).
_EXAMPLES = (
    ("Which planet is known as the Red Planet?",
     {"A": "Venus", "B": "Mars", "C": "Jupiter", "D": "Saturn"},
     {"Final Answer": "B", "Solution": "mars looks red because of iron oxide dust."}),
    ("What is the chemical symbol for iron?",
     {"A": "Fe", "B": "Ir", "C": "In", "D": "F"},
     {"Final Answer": "A", "Solution": "the symbol fe comes from the latin word ferrum."}),
    ("How many sides does a square have?",
     {"A": "Three", "B": "Five", "C": "Six", "D": "Four"},
     {"Final Answer": "D", "Solution": "a square has four equal sides."}),
)
# A lower-case Solution class keeps the tables small (about 48k Gemma tokens fit it).
# The schema is a file of its own so that `constrained-decoding compile --json-schema
# configs/gpqa_answer.schema.json --whitespace single -o FILE` saves the same tables.
with open(os.path.join(_REPO, "configs", "gpqa_answer.schema.json"), encoding="utf-8") as _f:
  _SCHEMA = json.load(_f)


def _prefix() -> str:
  lines = ['Answer each multiple-choice question with a JSON object on one line: '
           '{"Final Answer": "X", "Solution": "short explanation"}, where X is the letter '
           'of the correct option (A, B, C or D).', ""]
  for question, options, reply in _EXAMPLES:
    choices = "".join(f"{k}. {v}\n" for k, v in options.items())
    lines.append(f"Question: {question}\n{choices}Answer:\n{json.dumps(reply)}\n")
  return "\n".join(lines) + "\n"


def get_config():
  config = default_config()
  config.data_path = os.path.join(_REPO, "benchmarks", "conformance", "multiple_choice.jsonl")
  config.output_dir = "/tmp/constrained_decoding_eval/gpqa_format"
  config.prompt_prefix = _prefix()
  config.prompt_template = "Question: {question}\n{options}Answer:\n"
  config.constraint.kind = "json_schema"
  config.constraint.value = json.dumps(_SCHEMA)
  config.constraint.json_schema_whitespace = "single"
  config.answer_field = "answer"
  config.answer_key = "Final Answer"
  config.max_new_tokens = 40
  config.batch_size = 8
  return config
