"""``python -m polytile.bench.coverage``: the command line, and the per-model child process
(``--one ...``) that ``run_isolated`` starts."""
import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
