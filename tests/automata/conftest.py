"""Fixtures shared by the automata tests."""

import pytest

import constrained_decoding as cd


@pytest.fixture(scope="module")
def compilers(vocab, tmp_path_factory):
  """(counted, plain): compilers of the requesting module's `vocab` with and without
  counted chains (`counted_chains=False` composes every repeat plainly: the oracle the
  chain tests compare against), one disk cache, memoize off."""
  cache = str(tmp_path_factory.mktemp("chains"))
  counted = cd.Compiler(vocab, cd.CompileOptions(cache_dir=cache, memoize=False))
  plain = cd.Compiler(vocab, cd.CompileOptions(cache_dir=cache, memoize=False,
                                               counted_chains=False))
  return counted, plain
