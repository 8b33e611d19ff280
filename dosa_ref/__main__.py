"""``python -m dosa_ref`` is the ``dosa`` command line."""

import sys

from .cli import main

sys.exit(main())
