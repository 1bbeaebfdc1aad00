"""``python -m dt_commands.acceptance``: ``make azure-check``."""

import sys

from dt_commands.acceptance.main import main

if __name__ == "__main__":
    sys.exit(main())
