"""``python -m tokstream``: the same command line as the ``tokstream`` script."""

import sys

from tokstream.cli import main

sys.exit(main())
