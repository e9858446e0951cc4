"""`python -m constrained_decoding ...` runs the command line."""

import sys

from constrained_decoding.cli import main

sys.exit(main())
