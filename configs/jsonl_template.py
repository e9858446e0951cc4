"""Template: evaluate your own JSONL file. Copy it, then edit the fields marked EDIT.

  python -m constrained_decoding.evaluate --config=configs/jsonl_template.py \
      --config.data_path=my_rows.jsonl --config.output_dir=/tmp/my_run

Each line of the data file is a JSON object. With the settings below a line looks like

  {"id": "q1", "prompt": "Is the sky blue? Answer yes or no: ", "answer": "yes"}

and every row follows the one constraint of `config.constraint`. To give each row its
own constraint, set `config.constraint.kind = "row"` and put one of these keys in every
line (each distinct constraint is compiled once):

  "regex": "..."          "choices": ["a", "b"] (or "a,b")
  "json_schema": {...}    "grammar": "GBNF text"
  "builtin_grammar": "python" (a `cd.Grammar.builtin` name; grammars with a lexer,
                          python, go and sql, mix only with each other)

To skip compiling (and pynini) on the machine that runs the job, compile once with
`constrained-decoding compile --regex ... -o tables.cdt` and set
`config.constraint.tables_path = "tables.cdt"`.

Every field, with its meaning: `default_config()` in constrained_decoding/evaluation_job.py.
"""

from constrained_decoding.evaluation_job import default_config


def get_config():
  config = default_config()
  config.data_path = "my_rows.jsonl"            # EDIT
  config.output_dir = "/tmp/constrained_decoding_eval/my_run"  # EDIT
  config.prompt_prefix = ""                     # EDIT: instruction, few-shot examples
  config.prompt_template = "{prompt}"           # EDIT: fields of a line, in braces
  config.constraint.kind = "regex"              # EDIT: regex, json_schema, grammar,
  config.constraint.value = r"yes|no"           #   builtin_grammar, choices, or "row"
  config.answer_field = "answer"                # "" when the lines have no answers
  config.answer_key = ""                        # e.g. "Final Answer" for JSON replies
  config.max_new_tokens = 32
  config.batch_size = 8
  return config
