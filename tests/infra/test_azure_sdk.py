"""The Azure SDK's two doors (infra/azure_sdk.py, the deployer's; trainer/common/azure_sdk.py,
both sides'): every name they give is the SDK's own, type checkers see the same names the
program gets, and importing any module of the program, the commands or the trainer loads no
SDK (Pulumi's provider host and dry runs rely on that; ARCHITECTURE.md's rules keep every
other module from importing the SDK itself)."""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from infra import azure_sdk as deployer_sdk
from trainer.common import azure_sdk as shared_sdk

REPO = Path(__file__).resolve().parents[2]
DOORS = [deployer_sdk, shared_sdk]


def _typed_names(door: ModuleType) -> dict[str, tuple[str, str]]:
    """name -> (SDK module, its name there) of the door's ``if TYPE_CHECKING:`` imports."""
    tree = ast.parse(Path(door.__file__ or "").read_text(encoding="utf-8"))
    block = next(node for node in tree.body if isinstance(node, ast.If))
    return {
        alias.asname or alias.name: (node.module or "", alias.name)
        for node in block.body
        if isinstance(node, ast.ImportFrom)
        for alias in node.names
    }


def _homes(door: ModuleType) -> dict[str, tuple[str, str]]:
    found = {}
    for home, entries in door.HOMES.items():
        for entry in entries:
            name, _, alias = entry.partition(" as ")
            found[alias or name] = (home, name)
    return found


@pytest.mark.parametrize("door", DOORS, ids=lambda d: d.__name__)
def test_type_checkers_see_the_names_the_program_gets(door):
    assert _typed_names(door) == _homes(door)


@pytest.mark.parametrize("door", DOORS, ids=lambda d: d.__name__)
def test_every_name_is_the_sdks_own(door):
    for name, (home, sdk_name) in _homes(door).items():
        module = importlib.import_module(home)
        expected = getattr(module, sdk_name, None) or importlib.import_module(f"{home}.{sdk_name}")
        assert getattr(door, name) is expected, name


def test_a_name_neither_door_gives_is_an_attribute_error():
    with pytest.raises(AttributeError, match=r"infra\.azure_sdk.*ResourceNotFoundError"):
        deployer_sdk.ResourceNotFoundError  # noqa: B018  (both sides': trainer.common's door)
    with pytest.raises(AttributeError, match="BatchClient"):
        shared_sdk.BatchClient  # noqa: B018  (the deployer's alone)


def test_importing_the_program_the_commands_or_the_trainer_loads_no_sdk():
    code = (
        "import importlib, pkgutil, sys\n"
        "for package in ('infra', 'dt_commands', 'trainer'):\n"
        "    root = importlib.import_module(package)\n"
        "    for info in pkgutil.walk_packages(root.__path__, package + '.'):\n"
        "        if not info.name.endswith('__main__'):\n"
        "            importlib.import_module(info.name)\n"
        "print(sorted(m for m in sys.modules if m == 'azure' or m.startswith('azure.')))\n"
    )
    loaded = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300
    )
    assert loaded.returncode == 0, loaded.stderr[-2000:]
    assert loaded.stdout.strip() == "[]"
