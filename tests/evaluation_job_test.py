"""`python -m constrained_decoding.evaluate`: configs, sharding over 8 host devices,
resuming, saved tables, scoring, and `cd.evaluate` surviving the job module's import.

The model is a tiny random-weight Gemma 3 with the real vocabulary (its answers are
noise; what is checked is that runs agree), passed to `evaluation_job.run(model=)`.
"""

import importlib.util
import json
import os
import pathlib
import subprocess
import sys

import jax
import pytest

import constrained_decoding as cd
from constrained_decoding import evaluation_job
from constrained_decoding import models

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _config_file(name: str, *args):
  """`get_config(*args)` of configs/<name>.py, as the command's --config loads it."""
  spec = importlib.util.spec_from_file_location(name, os.path.join(_REPO, "configs", name))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config(*args)


@pytest.fixture(scope="module")
def tiny_model(gemma_vocab):
  from constrained_decoding.vocab._spm_from_gguf import sentencepiece_from_gguf  # pylint: disable=g-import-not-at-top

  tokenizer = sentencepiece_from_gguf(models.default_gguf_path())
  config = models.Gemma3Config.tiny(vocab_size=gemma_vocab.vocab_size)
  return models.Gemma3.random(config, tokenizer=tokenizer, vocab=gemma_vocab, bos_id=2, seed=3)


def _gsm(tmp_path, name: str, **overrides):
  config = _config_file("gsm_format.py")
  config.output_dir = str(tmp_path / name)
  config.limit = 12
  config.max_new_tokens = 16
  config.batch_size = 8
  for key, value in overrides.items():
    config[key] = value
  return config


def _results(config) -> str:
  with open(os.path.join(config.output_dir, evaluation_job.RESULTS), encoding="utf-8") as f:
    return f.read()


@pytest.fixture(scope="module")
def eight_device_run(tiny_model, tmp_path_factory):
  """The GSM config on all 8 host devices (conftest), greedy."""
  config = _gsm(tmp_path_factory.mktemp("job"), "eight")
  return config, evaluation_job.run(config, model=tiny_model)


def test_eight_devices_write_what_one_device_writes(eight_device_run, tiny_model, tmp_path):
  assert jax.local_device_count() == 8
  config, summary = eight_device_run
  one = _gsm(tmp_path, "one", num_devices=1)
  one_summary = evaluation_job.run(one, model=tiny_model)
  assert (summary["devices"], one_summary["devices"]) == (8, 1)
  eight_lines = _results(config)
  assert eight_lines == _results(one)
  rows = [json.loads(line) for line in eight_lines.splitlines()]
  assert [r["row"] for r in rows] == list(range(12))
  assert len({r["completion"] for r in rows}) > 1  # the rows differ: the comparison can fail
  for key in ("rows", "conformance", "accuracy", "finished", "mean_tokens"):
    assert summary[key] == one_summary[key]


def test_summary_counts_the_result_lines(eight_device_run):
  config, summary = eight_device_run
  rows = [json.loads(line) for line in _results(config).splitlines()]
  assert summary["rows"] == 12 and summary["answered"] == 12
  assert summary["conformance"] == sum(r["conforms"] for r in rows) / 12
  assert summary["accuracy"] == sum(r["correct"] for r in rows) / 12
  with open(os.path.join(config.output_dir, evaluation_job.SUMMARY), encoding="utf-8") as f:
    assert json.load(f) == summary
  # References come from the data file (GSM-style "answer" field).
  with open(config.data_path, encoding="utf-8") as f:
    answers = [json.loads(line)["answer"] for line in f][:12]
  assert [r["answer"] for r in rows] == answers


def test_interrupted_run_resumes_without_redoing_rows(eight_device_run, tiny_model, tmp_path,
                                                      monkeypatch):
  reference, _ = eight_device_run
  config = _gsm(tmp_path, "resumed")
  real = cd.sampling.evaluate
  decoded = []

  def interrupted(*args, on_batch, **kwargs):
    def first_batch_only(start, rows):
      on_batch(start, rows)
      raise KeyboardInterrupt
    return real(*args, on_batch=first_batch_only, **kwargs)

  monkeypatch.setattr(cd, "evaluate", interrupted)
  with pytest.raises(KeyboardInterrupt):
    evaluation_job.run(config, model=tiny_model)
  results = os.path.join(config.output_dir, evaluation_job.RESULTS)
  with open(results, "a", encoding="utf-8") as f:
    f.write('{"row": 8, "id": "arith-0')  # a line cut short by the interruption

  def counting(model, prompts, *args, **kwargs):
    decoded.append(list(kwargs["row_ids"]))
    return real(model, prompts, *args, **kwargs)

  monkeypatch.setattr(cd, "evaluate", counting)
  summary = evaluation_job.run(config, model=tiny_model)
  assert decoded == [list(range(8, 12))]
  assert summary["resumed_rows"] == 8
  assert _results(config) == _results(reference)
  # A third run decodes nothing and rewrites the same summary.
  assert evaluation_job.run(config, model=tiny_model)["rows"] == 12 and len(decoded) == 1


def test_resuming_with_another_config_is_refused(eight_device_run, tiny_model):
  config, _ = eight_device_run
  other = _gsm(pathlib.Path(config.output_dir), "x", max_new_tokens=17)
  other.output_dir = config.output_dir
  with pytest.raises(cd.EvaluationJobError, match="holds results of another config"):
    evaluation_job.run(other, model=tiny_model)
  same = _gsm(pathlib.Path(config.output_dir), "x", limit=4, batch_size=16)
  same.output_dir = config.output_dir  # limit and batching do not change outputs
  assert evaluation_job.run(same, model=tiny_model)["resumed_rows"] == 4


def test_saved_tables_replace_compiling(eight_device_run, tiny_model, gemma_vocab, tmp_path,
                                        monkeypatch):
  reference, _ = eight_device_run
  tables = cd.Compiler(gemma_vocab).compile(
      cd.JsonSchema(reference.constraint.value, whitespace="single"))
  tables.save(tmp_path / "gsm.cdt", vocab=gemma_vocab)
  config = _gsm(tmp_path, "saved")
  config.constraint.tables_path = str(tmp_path / "gsm.cdt")

  def no_compiler(*args, **kwargs):
    raise AssertionError("compiled although saved tables were given")

  monkeypatch.setattr(cd, "Compiler", no_compiler)
  evaluation_job.run(config, model=tiny_model)
  assert _results(config) == _results(reference)


def test_each_distinct_row_constraint_compiles_once(gemma_vocab, tmp_path, spy):
  data = tmp_path / "rows.jsonl"
  lines = [{"prompt": "a", "regex": "yes|no"}, {"prompt": "b", "choices": ["x", "y"]},
           {"prompt": "c", "regex": "yes|no"}, {"prompt": "d", "choices": "x,y"}]
  data.write_text("".join(json.dumps(line) + "\n" for line in lines))
  config = evaluation_job.default_config()
  config.update(data_path=str(data), output_dir=str(tmp_path / "out"))
  config.constraint.kind = "row"
  rows = evaluation_job.prepare_rows(config)
  assert [r.constraint for r in rows] == [("regex", "yes|no"), ("choices", "x,y")] * 2
  compiled = spy(cd.Compiler, "compile")
  tables = evaluation_job.compile_constraints(config, rows, gemma_vocab)
  assert len(compiled) == 2 and len(tables) == 2


def test_the_jsonl_template_runs_on_a_users_file(tiny_model, tmp_path):
  data = tmp_path / "mine.jsonl"
  lines = [{"id": "q1", "prompt": "Is the sky blue? ", "answer": "yes"},
           {"id": "q2", "prompt": "Is fire cold? ", "answer": "no"},
           {"id": "q3", "prompt": "Say something: "}]
  data.write_text("".join(json.dumps(line) + "\n" for line in lines))
  config = _config_file("jsonl_template.py")
  config.update(data_path=str(data), output_dir=str(tmp_path / "out"), max_new_tokens=4)
  summary = evaluation_job.run(config, model=tiny_model)
  rows = [json.loads(line) for line in _results(config).splitlines()]
  assert [r["id"] for r in rows] == ["q1", "q2", "q3"]
  for row, line in zip(rows, lines):
    assert row["completion"] in ("yes", "no")  # the template's constraint
    expected = None if "answer" not in line else row["completion"] == line["answer"]
    assert row["correct"] == expected
  assert summary["answered"] == 2 and summary["conformance"] == 1.0


@pytest.mark.parametrize("text, value, key, pattern, answer, numeric, expected", [
    ('{"Solution": "1 + 1 = 2", "Final Answer": "1,234"}', None, "Final Answer", "",
     "reasoning #### 1234", True, True),
    ('{"Final Answer": "B"}', {"Final Answer": "B"}, "Final Answer", "", "B", False, True),
    ('{"Final Answer": "B"}', None, "Final Answer", "", "C", False, False),
    ('{"Final Answer": "B"', None, "Final Answer", "", "B", False, False),  # cut short
    ("2 * 3 = 6\n#### 6", None, "", r"####\s*(-?[0-9,]+)", "6", True, True),
    ("2 * 3 = 6\n#### 6", None, "", r"####\s*(-?[0-9,]+)", "7", True, False),
    (" yes ", None, "", "", "yes", False, True),
])
def test_predictions_and_matching(text, value, key, pattern, answer, numeric, expected):
  reference = evaluation_job.reference_answer({"answer": answer}, "answer", "####")
  predicted = evaluation_job.predicted_answer(text, value, key=key, pattern=pattern)
  assert evaluation_job.answers_match(predicted, reference, numeric) == expected


@pytest.mark.parametrize("change, message", [
    (dict(constraint_kind="sql"), "constraint.kind is 'sql'"),
    (dict(constraint_value=""), "constraint.value is empty"),
    (dict(answer_pattern="####"), "has no group"),
    (dict(answer_pattern="(("), "is not a regex"),
    (dict(output_dir=""), "output_dir is empty"),
    (dict(limit=-1), "config.limit is -1"),
    (dict(data_path="/nonexistent.jsonl"), "cannot be read"),
    (dict(prompt_template="{missing}"), "has no field 'missing'"),
])
def test_config_errors_are_typed(change, message, tmp_path):
  config = _gsm(tmp_path, "bad")
  if "constraint_kind" in change:
    config.constraint.kind = change.pop("constraint_kind")
  if "constraint_value" in change:
    config.constraint.value = change.pop("constraint_value")
  config.update(change)
  with pytest.raises(cd.EvaluationJobError, match=message):
    evaluation_job.run(config, model=object())


# The package attribute `evaluate` must stay the function whichever way the job module
# is imported (the import system binds submodules as package attributes).
_IMPORTS_SCRIPT = """
import importlib
import constrained_decoding as cd
from constrained_decoding.sampling import evaluate as function
import constrained_decoding.evaluate
assert cd.evaluate is function, cd.evaluate
job = importlib.import_module("constrained_decoding.evaluate")
assert hasattr(job, "main") and cd.evaluate is function
from constrained_decoding import evaluate
assert evaluate is function
cd.evaluate = len  # an assignment that is not the job module still takes effect
assert cd.evaluate is len
del cd.evaluate
assert cd.evaluate is function
print("ok")
"""


def test_cd_evaluate_stays_the_function_after_importing_the_job():
  out = subprocess.run([sys.executable, "-c", _IMPORTS_SCRIPT], capture_output=True,
                       text=True, check=False)
  assert out.returncode == 0, out.stderr[-2000:]
  assert out.stdout.strip() == "ok"


# `python -m constrained_decoding.evaluate ARGS` (runpy is what -m calls) in a process
# where importing pynini fails: with saved tables, a worker needs no compiler.
_COMMAND_SCRIPT = """
import importlib.abc, runpy, sys

class _NoPynini(importlib.abc.MetaPathFinder):
  def find_spec(self, name, path=None, target=None):
    if name == "pynini" or name.startswith("pynini."):
      raise ImportError("pynini is not installed here")

sys.meta_path.insert(0, _NoPynini())
sys.argv = ["constrained_decoding.evaluate", *sys.argv[1:]]
try:
  runpy.run_module("constrained_decoding.evaluate", run_name="__main__", alter_sys=True)
finally:
  print("pynini imported:", "pynini" in sys.modules, file=sys.stderr)
"""


def test_the_command_with_overrides_saved_tables_and_no_pynini(tmp_path, gemma_vocab):
  config = _config_file("gsm_format.py")
  tables = cd.Compiler(gemma_vocab).compile(
      cd.JsonSchema(config.constraint.value, whitespace="single"))
  tables.save(tmp_path / "gsm.cdt", vocab=gemma_vocab)
  env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8")
  out = subprocess.run(
      [sys.executable, "-c", _COMMAND_SCRIPT, "--config=configs/gsm_format.py",
       "--config.limit=3", "--config.max_new_tokens=4", "--config.model=random-tiny",
       f"--config.output_dir={tmp_path / 'out'}",
       f"--config.constraint.tables_path={tmp_path / 'gsm.cdt'}"],
      capture_output=True, text=True, check=False, cwd=_REPO, env=env)
  assert out.returncode == 0, out.stderr[-3000:]
  assert "pynini imported: False" in out.stderr
  summary = json.loads(out.stdout.strip().splitlines()[-1])
  assert summary["rows"] == 3 and summary["devices"] == 8
  assert "conformance" in summary and summary["answered"] == 3
  assert "3/3 rows decoded" in out.stderr and "loaded tables" in out.stderr
  with open(tmp_path / "out" / "config.json", encoding="utf-8") as f:
    assert json.load(f)["config"]["max_new_tokens"] == 4
