"""The deploy guide's quick start, followed as written in a fresh clone: its lines up to the offline
plan run in bash, with a ``pulumi`` that writes the stack file as the CLI does and an ``az``
that answers the group lookup; the plan must pass."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
ORIGIN = "git@github.com:vision-org/distributed-training.git"

# `pulumi stack init NAME` and `pulumi config set [--path] KEY VALUE`, as the CLI writes them to
# Pulumi.<stack>.yaml (project-qualified keys; --path indexes a list).
PULUMI = """#!{python}
import pathlib, re, sys, yaml
args = [a for a in sys.argv[1:] if not a.startswith("--secrets-provider")]
current = pathlib.Path(".pulumi-current-stack")
if args[:2] == ["stack", "init"]:
    current.write_text(args[2])
    pathlib.Path(f"Pulumi.{{args[2]}}.yaml").write_text("config: {{}}\\n")
    sys.exit(0)
assert args[:2] == ["config", "set"], args
path = "--path" in args
key, value = [a for a in args[2:] if a != "--path"]
stack = pathlib.Path(f"Pulumi.{{current.read_text()}}.yaml")
config = yaml.safe_load(stack.read_text())["config"]
index = re.fullmatch(r"(\\w+)\\[(\\d+)\\]", key) if path else None
if index:
    items = config.setdefault(f"gpu-cluster:{{index[1]}}", [])
    items[int(index[2]):int(index[2]) + 1] = [value]
else:
    config[f"gpu-cluster:{{key}}"] = value
stack.write_text(yaml.safe_dump({{"config": config}}))
"""
AZ = """#!/bin/sh
echo 6b1f0c2e-9a7d-4e3b-8c5f-3f4a5b6c7d8e   # az ad group show ... --query id -o tsv
"""


def _quickstart_until_the_plan() -> list[str]:
    guide = (REPO / "docs" / "deploy.md").read_text()
    block = re.search(r"\*\*Quickstart\*\*\n\n```sh\n(.*?)```", guide, re.S)
    assert block, "the deploy guide's Quickstart block"
    lines = block.group(1).splitlines()
    plan = next(i for i, line in enumerate(lines) if line.startswith("dt-plan"))
    return [line for line in lines[: plan + 1] if not line.startswith("make setup")]


def test_the_quickstart_plans_in_a_fresh_clone_with_an_ssh_origin(tmp_path):
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(REPO), str(clone)], check=True, timeout=120)
    subprocess.run(["git", "-C", str(clone), "remote", "set-url", "origin", ORIGIN], check=True)
    bin_dir, home = tmp_path / "bin", tmp_path / "home"
    bin_dir.mkdir()
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "id_ed25519.pub").write_text(
        "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIG62nMODCwNhCUKOiHZX7l9EOfmSqIQbTlOlF5ahhZ1t me\n"
    )
    (bin_dir / "pulumi").write_text(PULUMI.format(python=sys.executable))
    (bin_dir / "az").write_text(AZ)
    for tool in ("pulumi", "az"):
        (bin_dir / tool).chmod(0o755)
    (clone / ".venv").symlink_to(REPO / ".venv")  # `make setup` made it
    script = "set -euo pipefail\n" + "\n".join(_quickstart_until_the_plan()) + "\n"
    result = subprocess.run(
        ["bash", "-c", script],
        cwd=clone,
        env={
            **os.environ,
            "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
            "HOME": str(home),
            "PYTHONPATH": str(clone),
        },
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    stack = yaml.safe_load((clone / "Pulumi.vision-dev.yaml").read_text())["config"]
    assert "gpu-cluster:imageSourceRepo" not in stack  # the quick start never sets it
    assert "vision-dev" in result.stdout
