"""``python -m trainer.launch``: see ``trainer.launch.supervisor``."""

import sys

from trainer.launch.supervisor import main

sys.exit(main())
