"""``python -m dt_commands.jobs.tensorboard_cli ARGS``: TensorBoard's own command line, also where
setuptools no longer ships ``pkg_resources``.

The pinned tensorboard 2.20.0 imports ``pkg_resources`` at start-up for two calls:
``iter_entry_points("tensorboard_plugins")`` (tensorboard/default.py) and ``parse_version``
(tensorboard/data/server_ingester.py). setuptools 82 removed the module, so ``tensorboard`` stops
with ``ModuleNotFoundError`` (tensorflow/tensorboard #7003 and #7107; fixed in 2.21, which needs
protobuf 6: see the tensorboard pin in pyproject.toml). Where the module is missing, a stand-in
answers both calls from ``importlib.metadata`` and ``packaging``; where it exists, it is used.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import sys
import types
from typing import Any


class _EntryPoint:
    """What TensorBoard uses of a ``pkg_resources.EntryPoint``: ``resolve()``."""

    def __init__(self, entry_point: importlib.metadata.EntryPoint) -> None:
        self._entry_point = entry_point

    def resolve(self) -> Any:
        return self._entry_point.load()


def _stand_in() -> types.ModuleType:
    from packaging.version import Version

    module = types.ModuleType("pkg_resources")
    module.iter_entry_points = lambda group, name=None: [  # type: ignore[attr-defined]
        _EntryPoint(e)
        for e in importlib.metadata.entry_points(group=group)
        if name is None or e.name == name
    ]
    module.parse_version = Version  # type: ignore[attr-defined]
    return module


def main(argv: list[str]) -> int:
    if importlib.util.find_spec("pkg_resources") is None:
        sys.modules["pkg_resources"] = _stand_in()
    from tensorboard.main import run_main

    sys.argv = ["tensorboard", *argv]
    run_main()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
