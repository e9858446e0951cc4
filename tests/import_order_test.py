"""Every module of the lower host layers imports on its own, first, in a fresh interpreter.

The package's own import order hides circular imports between `automata` and
`constraints` (each imports the other's modules); a user or a tool that imports one
module first (`import constrained_decoding.automata._nfa`) would hit them. One
subprocess imports each `automata` and `vocab` module after clearing the package from
`sys.modules` (all of `constraints` too would double the time for modules that sit above).
"""

import subprocess
import sys

_SCRIPT = r"""
import importlib, pkgutil, sys
import constrained_decoding
names = sorted(m.name for m in pkgutil.walk_packages(constrained_decoding.__path__,
                                                    "constrained_decoding.")
               if m.name.split(".")[1] in ("automata", "vocab"))
assert len(names) > 25, names
failed = []
for name in names:
  for key in [k for k in sys.modules if k.startswith("constrained_decoding")]:
    del sys.modules[key]
  try:
    importlib.import_module(name)
  except Exception as e:  # Report all, not just the first.
    failed.append(f"{name}: {e!r}")
print("\n".join(failed))
"""


def test_each_host_module_imports_first():
  result = subprocess.run([sys.executable, "-c", _SCRIPT], capture_output=True, text=True,
                          timeout=300, check=False)
  assert result.returncode == 0, result.stderr
  assert result.stdout.strip() == "", "modules that fail when imported first:\n" + result.stdout
