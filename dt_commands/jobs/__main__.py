"""``python -m dt_commands.jobs``: the ``dt-jobs`` command."""

import sys

from dt_commands.jobs.main import main

if __name__ == "__main__":
    sys.exit(main())
