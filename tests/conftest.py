"""Shared fixtures. Real vocabulary: the Gemma 3 tokenizer in the default model's GGUF."""

import importlib
import importlib.util
import inspect
import os
import shutil
import tempfile

# Test pmap/shard_map code on several host devices; must precede importing jax. XLA's
# CPU backend at LLVM optimization level 0: the suite is bound by compiling decode loops
# for tiny models (the dots still call the same library kernels), and compiles ~30% less
# CPU time this way (speculative + jump_forward tests 170 -> 126 s CPU; the real 270M
# model's tests 51 -> 44 s CPU, same wall time). Semantics do not change with the level
# (no fast math either way); subprocesses (CLI runs, the evaluation job) inherit it.
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8 "
                      "--xla_backend_optimization_level=0")

# One XLA program cache per test run, shared by the xdist workers and every subprocess
# (CLI runs, notebook kernels, the evaluation job): the first process to compile a
# program writes it, the others load it instead of compiling again (the default model's
# decode loop is compiled in many processes). Made by the first process (the xdist
# controller), inherited by the rest through the environment, removed at its exit; a
# fresh one each run, so timings do not depend on earlier runs.
_OWN_XLA_CACHE = "JAX_COMPILATION_CACHE_DIR" not in os.environ
if _OWN_XLA_CACHE:
  os.environ["JAX_COMPILATION_CACHE_DIR"] = tempfile.mkdtemp(prefix="cd-tests-xla-")
  os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.5")

import beartype  # noqa: E402
import jaxtyping  # noqa: E402

# Check jaxtyping shape annotations of the whole package while tracing (STYLE.md G15).
jaxtyping.install_import_hook("constrained_decoding", "beartype.beartype")

import pytest  # noqa: E402

import constrained_decoding as cd  # noqa: E402

# Host loops called millions of times in one test (the byte walker of register DFAs, the
# reference walker's inner steps, two shape properties they read per step) run without
# the hook's checks: jaxtyping's wrapper binds every call's arguments, which made these
# walks 4-10x slower (json_schema_recursive_test 47 s -> 12 s of CPU). Their callers stay
# checked, and so do the reference functions tests call: the re-exports in
# `constrained_decoding.testing` keep the checked wrappers (bound at import, before this),
# only the module's own calls (`_exact`'s enumeration, `reference_walk`) skip them.
_UNCHECKED = {
    "constrained_decoding.automata._registers": ("ByteWalker.step", "ByteWalker.moves",
                                                 "ByteWalker.accepting"),
    "constrained_decoding.tables": ("ConstraintTables.has_registers",
                                    "ConstraintTables.has_hashes"),
    "constrained_decoding.testing._reference": (
        "_step", "_matching_groups", "_extended", "_after_guard", "_guard_of", "_terminals",
        "reference_allowed", "reference_end_allowed", "reference_step_stack",
        "reference_stack_needs", "_edge_heights", "zero_registers"),
    # Once per token of a GGUF vocabulary (262,144 calls per Gemma 3 load).
    "constrained_decoding.vocab._vocabulary": ("_spm_piece_bytes",),
    # Grammar and JSON compiles the constraint tests run by the thousand: the PDA's
    # configuration interning, the NFA builder's adders (also in its `_ADDERS` table),
    # a rule's references, the cache pruning after each write.
    "constrained_decoding.automata._pda": ("_Configurations.intern",),
    "constrained_decoding.automata._nfa": (
        "_add_char_class", "_add_bytes", "_add_byte_class", "_add_concat",
        "_add_concat_with_loops", "_add_union", "_add_repeat", "_add_terminal",
        "_add_fragment", "_add_marker", "_add_graph", "_add_node", "Nfa.new_state"),
    "constrained_decoding._cache": ("prune_cache", "_is_current"),
    # Per character range / IR node of regex and JSON Schema compiles (counted per test
    # file with a counting wrapper on every checked function: 1.0M `_contains` calls in
    # lexer_test, 771k `_common_ranges` in json_schema_errors_test, 446k `normalize_ranges`
    # and `char_class` in json_schema_objects_test, 281k `children` in the recursive test).
    "constrained_decoding.constraints._regex_classes": ("_contains",),
    "constrained_decoding.constraints._intersect": ("_common_ranges", "_CharNfa.add"),
    "constrained_decoding.constraints._ir": ("normalize_ranges", "char_class", "children",
                                             "_no_children"),
    "constrained_decoding.constraints._grammar": ("references",),
    "constrained_decoding.constraints._grammar_depth": ("_node_depth",),
    # `ir.fold` functions, once per IR node of every JSON Schema lowering.
    "constrained_decoding.constraints._json_objects": ("_size", "_wide_and_narrow"),
    "constrained_decoding.automata._loops": ("Predecessors.__getitem__",),
}
# Functions whose *nested* functions are the hot loop (the hook wraps those too, at every
# call of the outer one): replaced by a copy of the module's function compiled without
# the hook, itself checked at its boundary. `accepted_sequences`' recursive `walk` runs
# once per prefix of a finite language (735,532 checked calls in slotted_chains_test).
_UNCHECKED_INSIDE = {"constrained_decoding.testing._exact": ("accepted_sequences",)}


def _uncheck(module_name: str, qualname: str) -> None:
  """Puts the undecorated function back in place of the hook's checked wrapper; raises if
  the name is gone or was not wrapped (then this list is stale)."""
  owner = importlib.import_module(module_name)
  *outer, name = qualname.split(".")
  for part in outer:
    owner = getattr(owner, part)
  checked = owner.__dict__.get(name)
  fn = checked.fget if isinstance(checked, property) else checked
  if not hasattr(fn, "__wrapped__"):
    raise AssertionError(f"{module_name}.{qualname} is gone or not wrapped by the jaxtyping "
                         "hook: update conftest's _UNCHECKED")
  plain = inspect.unwrap(fn)
  setattr(owner, name, property(plain, doc=checked.__doc__)
          if isinstance(checked, property) else plain)
  module = importlib.import_module(module_name)
  for table in [v for v in vars(module).values() if isinstance(v, dict)]:
    for key in [k for k, v in table.items() if v is checked]:  # Dispatch tables.
      table[key] = plain


def _uncheck_inside(module_name: str, name: str) -> None:
  """Puts in place of `module.name` the same function from a copy of the module loaded
  without the hook (its nested functions unchecked), wrapped in the hook's checks; raises
  if the name was not wrapped (then this list is stale)."""
  owner = importlib.import_module(module_name)
  if not hasattr(owner.__dict__[name], "__wrapped__"):
    raise AssertionError(f"{module_name}.{name} is not wrapped by the jaxtyping hook")
  spec = importlib.util.spec_from_file_location(f"{module_name}__unchecked", owner.__file__)
  plain = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(plain)  # A plain source loader: the hook's finder is not asked.
  setattr(owner, name, jaxtyping.jaxtyped(typechecker=beartype.beartype)(getattr(plain, name)))


for _module, _names in _UNCHECKED.items():
  for _name in _names:
    _uncheck(_module, _name)
for _module, _names in _UNCHECKED_INSIDE.items():
  for _name in _names:
    _uncheck_inside(_module, _name)


def pytest_unconfigure(config):
  if _OWN_XLA_CACHE and not hasattr(config, "workerinput"):  # The run's owner only.
    shutil.rmtree(os.environ["JAX_COMPILATION_CACHE_DIR"], ignore_errors=True)


@pytest.fixture(scope="session")
def gemma_vocab():
  from constrained_decoding.models import default_gguf_path  # pylint: disable=g-import-not-at-top

  return cd.Vocabulary.from_gguf(default_gguf_path())


@pytest.fixture(scope="session")
def gemma_compiler(gemma_vocab):
  return cd.Compiler(gemma_vocab)


@pytest.fixture(scope="session")
def byte_vocab():
  """The byte-level vocabulary: 256 one-byte tokens and an end-of-sequence token."""
  return cd.Vocabulary.from_token_bytes([bytes([b]) for b in range(256)] + [None],
                                        eos_ids=[256])


@pytest.fixture(scope="session")
def byte_compiler(byte_vocab, tmp_path_factory):
  return cd.Compiler(byte_vocab, cd.CompileOptions(cache_dir=str(tmp_path_factory.mktemp("c"))))


@pytest.fixture
def spy(monkeypatch):
  """`spy(module, name)` wraps `module.name` for the test and returns the list its
  calls' results are appended to."""

  def install(module, name: str) -> list:
    calls = []
    original = getattr(module, name)

    def wrapper(*args, **kwargs):
      calls.append(original(*args, **kwargs))
      return calls[-1]

    monkeypatch.setattr(module, name, wrapper)
    return calls

  return install
