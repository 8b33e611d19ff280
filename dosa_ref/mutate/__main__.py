"""``python -m dosa_ref.mutate`` = ``dosa mutate``."""

import sys

from .runner import main

sys.exit(main(sys.argv[1:]))
