"""``python -m advcal.cli``: the ``advcal`` console script."""

import sys

from advcal.cli import main

sys.exit(main())
