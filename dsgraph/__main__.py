"""``python -m dsgraph``: the same command line as the ``dsgraph`` console script."""

import sys

from dsgraph.report.cli import main

if __name__ == "__main__":
    sys.exit(main())
