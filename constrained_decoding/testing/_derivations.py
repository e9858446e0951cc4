"""Random derivations of a grammar over terminals, for tests of grammar constraints."""

import random


def random_derivation(grammar, rng: random.Random, depth: int = 6) -> list[str]:
  """A random terminal sequence of `grammar` (an `_lr.TerminalGrammar`: `productions`
  with `lhs` and `rhs`, and `start`): productions are chosen uniformly, and past
  `depth` levels the one with the shortest yield, so that every derivation ends."""
  by_lhs: dict[str, list] = {}
  for p in grammar.productions:
    by_lhs.setdefault(p.lhs, []).append(p.rhs)
  shortest: dict[str, int] = {}
  changed = True
  while changed:  # Shortest yield of each nonterminal, to a fixpoint.
    changed = False
    for lhs, alternatives in by_lhs.items():
      for rhs in alternatives:
        if all(s not in by_lhs or s in shortest for s in rhs):
          size = sum(shortest.get(s, 1) for s in rhs)
          if size < shortest.get(lhs, 1 << 30):
            shortest[lhs] = size
            changed = True

  def cost(rhs) -> int:
    return sum(shortest.get(s, 1 << 30) if s in by_lhs else 1 for s in rhs)

  out: list[str] = []

  def walk(symbol: str, level: int) -> None:
    if symbol not in by_lhs:
      out.append(symbol)
      return
    alternatives = by_lhs[symbol]
    rhs = rng.choice(alternatives) if level < depth else min(alternatives, key=cost)
    for s in rhs:
      walk(s, level + 1)

  walk(grammar.start, 0)
  return out
