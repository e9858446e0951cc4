"""`Compiler.compile_with_info` pauses the cyclic garbage collector while it compiles
and leaves its state as it found it, on success and on error."""

import gc

import pytest

import constrained_decoding as cd


def _byte_vocab():
  return cd.Vocabulary.from_token_bytes([bytes([b]) for b in range(256)] + [None],
                                        eos_ids=[256])


class _Watched:
  """A spec that records whether the collector ran while the compiler lowered it."""

  def __init__(self, pattern):
    self.inner = cd.Regex(pattern)
    self.seen = []

  def to_ir(self):
    self.seen.append(gc.isenabled())
    return self.inner.to_ir()

  def describe(self):
    return self.inner.describe()


@pytest.mark.parametrize("enabled", [True, False])
@pytest.mark.parametrize("pattern,error", [("(yes|no)", None),
                                           ("[^\\x00-\\U0010ffff]", cd.EmptyConstraintError)])
def test_collector_paused_during_compile_and_restored(enabled, pattern, error):
  compiler = cd.Compiler(_byte_vocab(), cd.CompileOptions(memoize=False, cache_dir=None))
  spec = _Watched(pattern)
  was = gc.isenabled()
  (gc.enable if enabled else gc.disable)()
  try:
    if error is None:
      tables, _ = compiler.compile_with_info(spec)
      assert tables.start is not None
    else:
      with pytest.raises(error):
        compiler.compile_with_info(spec)
    assert gc.isenabled() == enabled
  finally:
    (gc.enable if was else gc.disable)()
  assert spec.seen == [False]
