"""`python -m constrained_decoding.evaluate --config=configs/gsm_format.py`: an evaluation job.

Decodes every row of a JSONL file under its constraint, sharded over the local devices,
and writes `results.jsonl` and `summary.json` to `config.output_dir`; prints the summary
(conformance, accuracy) as one JSON line. Rerun the same command to resume an
interrupted run. Override any config field on the command line:

  python -m constrained_decoding.evaluate --config=configs/gsm_format.py \\
      --config.limit=8 --config.batch_size=8 --config.output_dir=/tmp/gsm

The job itself is `constrained_decoding.evaluation_job` (`run(config)`, `default_config()`;
import that, not this module:
`cd.evaluate` stays the function `sampling.evaluate` even after this module is
imported, see the package's `__init__`).
"""

import json
import sys

from absl import app
from absl import flags
from absl import logging
from ml_collections import config_flags

from constrained_decoding import evaluation_job

_CONFIG = config_flags.DEFINE_config_file(
    "config", None, "Job config: a Python file whose get_config() returns a ConfigDict "
    "(see configs/ and evaluation_job.default_config).", lock_config=True)


def main(argv: list[str]) -> int:
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments {argv[1:]}. Expected only flags.")
  if _CONFIG.value is None:
    raise app.UsageError("--config is required, e.g. --config=configs/gsm_format.py.")
  try:
    summary = evaluation_job.run(_CONFIG.value)
  except (ValueError, TypeError, OSError) as e:  # every typed error of the library
    logging.error("%s: %s", type(e).__name__, e)
    return 2
  print(json.dumps(summary), flush=True)
  return 0


if __name__ == "__main__":
  flags.FLAGS.set_default("logtostderr", True)
  sys.exit(app.run(main))
