"""The main job in one command: `make demo` (or `python -m constrained_decoding.demo`).

Loads the packaged Gemma 3 270M, asks a GPQA-style multiple-choice question in the JSON
answer format of the paper's Appendix D (as a few-shot completion prompt: the packaged
model is the base model, not instruction-tuned), and answers it twice, unconstrained and
constrained, side by side.
"""

import argparse
import json
import sys
import time

# The answer format of App. D; the solution is one line of text without quotes or
# backslashes (the JSON Schema front end will allow full JSON strings).
ANSWER_REGEX = r'\{"Final Answer": "[ABCD]", "Solution": "[^"\\\n]*"\}'

FEW_SHOT = '''Answer each multiple choice question with the JSON format below.

Question: Which gas do plants absorb from the atmosphere for photosynthesis?
A. Oxygen
B. Carbon dioxide
C. Nitrogen
D. Helium
Answer: {"Final Answer": "B", "Solution": "Photosynthesis fixes carbon dioxide into sugars."}

Question: What is the SI unit of electric resistance?
A. Volt
B. Ampere
C. Ohm
D. Watt
Answer: {"Final Answer": "C", "Solution": "Resistance is measured in ohms."}

Question: {question}
Answer: '''

QUESTION = '''Which particle mediates the electromagnetic force?
A. Gluon
B. W boson
C. Graviton
D. Photon'''


def _conforms(text: str) -> str:
  try:
    value = json.loads(text)
  except json.JSONDecodeError:
    return "not JSON"
  if not isinstance(value, dict) or value.get("Final Answer") not in ("A", "B", "C", "D"):
    return "JSON, wrong format"
  return f"valid, answer {value['Final Answer']}"


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--max-new-tokens", type=int, default=48)
  args = parser.parse_args(argv)
  import constrained_decoding as cd  # pylint: disable=g-import-not-at-top

  log = lambda m: print(m, file=sys.stderr, flush=True)
  started = time.perf_counter()
  model = cd.models.Gemma3.from_gguf()
  log(f"Loaded Gemma 3 270M in {time.perf_counter() - started:.1f} s.")
  started = time.perf_counter()
  tables = cd.Compiler(model.vocab).compile(cd.Regex(ANSWER_REGEX))
  log(f"Compiled the answer format in {1e3 * (time.perf_counter() - started):.0f} ms: "
      f"{tables!r}")
  prompt = FEW_SHOT.replace("{question}", QUESTION)
  print(prompt.rstrip().rsplit("\n\n", 1)[-1])
  print()
  for name, constraint in (("unconstrained", None), ("constrained", tables)):
    started = time.perf_counter()
    [out] = cd.generate(model, prompt, constraint=constraint,
                        max_new_tokens=args.max_new_tokens)
    seconds = time.perf_counter() - started
    print(f"--- {name} ({len(out.token_ids)} tokens, {seconds:.1f} s) ---")
    print(out.text.strip("\n") if out.text.strip() else repr(out.text))
    verdict = f"whole output: {_conforms(out.text.strip())}"
    if not out.finished:  # a base model rarely stops by itself: judge its first line too
      first_line = out.text.strip().split("\n")[0]
      verdict += f"; first line: {_conforms(first_line)}; did not stop"
    print(f"[{verdict}]")
    print()
  return 0


if __name__ == "__main__":
  sys.exit(main())
