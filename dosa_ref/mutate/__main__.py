"""``python -m dosa_ref.mutate`` = ``dosa mutate``."""

import sys

from ..cmdline import run_command
from .runner import main

# run_command: a library ValueError about an argument (--modules, --ids) is one line here too
sys.exit(run_command("dosa mutate", main, sys.argv[1:]))
