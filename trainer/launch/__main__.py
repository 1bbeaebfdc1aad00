"""``python -m trainer.launch``: see ``trainer.launch.main``."""

import sys

from trainer.launch.stop import STOP

STOP.install()  # before the slow imports: a terminate from now on is not lost (trainer.launch.stop)

from trainer.launch.main import main  # noqa: E402

sys.exit(main())
