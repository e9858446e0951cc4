"""Command line: `constrained-decoding generate ...`.

Completions go to stdout (only the generated text, one completion after another);
logs, progress and errors go to stderr, so the output can be piped.
"""

import argparse
import codecs
import importlib
import re
import sys
import time


def _log(message: str) -> None:
  print(f"constrained-decoding: {message}", file=sys.stderr, flush=True)


def _parser() -> argparse.ArgumentParser:
  parser = argparse.ArgumentParser(
      prog="constrained-decoding",
      description="Constrained generation with Gemma 3 (default: the packaged Gemma 3 270M).")
  sub = parser.add_subparsers(dest="command", required=True)
  gen = sub.add_parser("generate", help="generate text that follows a constraint")
  spec = gen.add_mutually_exclusive_group()
  spec.add_argument("--regex", help="the output must fully match this regex (Python syntax)")
  spec.add_argument("--choices", help="comma-separated list; the output is exactly one of them")
  spec.add_argument("--json-schema", metavar="FILE", help="the output is JSON valid under it")
  spec.add_argument("--grammar", metavar="FILE",
                    help="GBNF (or Lark, for a .lark file) grammar; see --max-depth")
  spec.add_argument("--dataclass", metavar="MODULE:NAME",
                    help="the output is a constructor call of this dataclass")
  gen.add_argument("--prompt", required=True, help="the prompt (completion style for base models)")
  gen.add_argument("--model", default=None, help="path of a Gemma 3 GGUF (default: packaged 270M)")
  gen.add_argument("--chat", action="store_true",
                   help="wrap the prompt in Gemma's chat template (instruction-tuned weights)")
  gen.add_argument("--max-new-tokens", type=int, default=64)
  gen.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
  gen.add_argument("--top-k", type=int, default=0)
  gen.add_argument("--top-p", type=float, default=1.0)
  gen.add_argument("--seed", type=int, default=0)
  gen.add_argument("--batch-size", type=int, default=1,
                   help="number of completions of the prompt, decoded as one batch")
  gen.add_argument("--no-stream", action="store_true",
                   help="print completions at the end instead of token by token")
  gen.add_argument("--max-depth", type=int, default=None,
                   help="nesting bound that makes a recursive --grammar regular")
  gen.add_argument("--unicode", action="store_true",
                   help="\\d \\w \\s are Unicode classes (default: ASCII, as re.ASCII)")
  return parser


def _choices_regex(choices: str) -> str:
  items = [c for c in choices.split(",")]
  if not all(items):
    raise ValueError(f"--choices {choices!r} has an empty choice. Expected 'a,b,c'.")
  return "|".join(re.escape(c) for c in items)


def _spec(args, cd):
  """The constraint spec named on the command line, or None."""
  if args.choices is not None:
    return cd.Regex(_choices_regex(args.choices))
  if args.regex is not None:
    return cd.Regex(args.regex, unicode=args.unicode)
  if args.json_schema is not None:
    with open(args.json_schema, encoding="utf-8") as f:
      return cd.JsonSchema(f.read())
  if args.grammar is not None:
    with open(args.grammar, encoding="utf-8") as f:
      syntax = "lark" if args.grammar.endswith(".lark") else "gbnf"
      return cd.Grammar(f.read(), syntax=syntax, max_depth=args.max_depth)
  if args.dataclass is not None:
    module_name, _, name = args.dataclass.partition(":")
    if not name:
      raise ValueError(f"--dataclass {args.dataclass!r} has no class name. Expected "
                       f"MODULE:NAME, e.g. mypackage.types:Answer.")
    try:
      cls = getattr(importlib.import_module(module_name), name)
    except (ImportError, AttributeError) as e:
      raise ValueError(f"--dataclass {args.dataclass!r} could not be imported: {e}.") from e
    return cd.Dataclass(cls)
  return None


def _generate(args) -> int:
  import constrained_decoding as cd  # pylint: disable=g-import-not-at-top

  if args.batch_size < 1:
    raise ValueError(f"--batch-size {args.batch_size} is below 1. Expected >= 1.")
  sampling = cd.SamplingConfig(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p)
  spec = _spec(args, cd)
  path = args.model or cd.models.default_gguf_path()
  tables = None
  if spec is not None:  # Before loading weights, so that a bad constraint fails fast.
    started = time.perf_counter()
    vocab = cd.Vocabulary.from_gguf(path)
    tables = cd.Compiler(vocab).compile(spec)
    _log(f"constraint compiled in {1e3 * (time.perf_counter() - started):.1f} ms: {tables!r}")
  started = time.perf_counter()
  model = cd.models.Gemma3.from_gguf(path)
  _log(f"model loaded in {time.perf_counter() - started:.1f} s")
  prompt = model.chat_prompt(args.prompt) if args.chat else args.prompt
  prompts = [prompt] * args.batch_size
  kwargs = dict(constraint=tables, max_new_tokens=args.max_new_tokens, sampling=sampling,
                seed=args.seed)
  started = time.perf_counter()
  if args.no_stream:
    for completion in cd.generate(model, prompts, **kwargs):
      sys.stdout.write(completion.text + "\n")
  else:
    decoders = [codecs.getincrementaldecoder("utf-8")("replace") for _ in prompts]
    texts = [[] for _ in prompts]
    for row, piece in cd.generate_stream(model, prompts, **kwargs):
      text = decoders[row].decode(piece)
      if row == 0:
        sys.stdout.write(text)
        sys.stdout.flush()
      texts[row].append(text)
    sys.stdout.write(decoders[0].decode(b"", final=True) + "\n")
    for row in range(1, len(prompts)):  # other rows, after the streamed first one
      sys.stdout.write("".join(texts[row]) + decoders[row].decode(b"", final=True) + "\n")
  sys.stdout.flush()
  _log(f"generated in {time.perf_counter() - started:.1f} s")
  return 0


def main(argv: list[str] | None = None) -> int:
  args = _parser().parse_args(argv)
  try:
    return _generate(args)
  except (ValueError, TypeError, OSError) as e:  # includes every ConstraintError
    _log(f"error: {type(e).__name__}: {e}")
    return 2


if __name__ == "__main__":
  sys.exit(main())
