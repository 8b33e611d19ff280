"""``python -m dosa_cupy.bench``: the same command as ``dosa bench``."""

import sys

from .cli import main

sys.exit(main())
