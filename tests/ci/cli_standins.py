"""Stand-ins for the `pulumi`, `az` and `curl` a user types in the docs' command blocks, for
tests that run those blocks here (tests/ci/test_doc_commands.py says what each one models).
``install(bin_dir)`` writes them as commands; each runs this file, which imports only the
standard library and PyYAML, so a call costs a Python start and no more. The stand-in pulumi's
backend (its stacks, the selected one, the recorded previews and updates) lives under $HOME."""

from __future__ import annotations

import base64
import json
import os
import re
import sys
import uuid
from pathlib import Path

import yaml

BACKEND = ".pulumi-standin"  # under $HOME


def _backend() -> Path:
    state = Path(os.environ["HOME"]) / BACKEND
    state.mkdir(exist_ok=True)
    return state


def _fail(message: str) -> int:
    print(f"error: {message}", file=sys.stderr)
    return 255  # the CLI exits -1 on an error


def _options(args: list[str], valued: set[str]) -> tuple[list[str], dict[str, str | bool]]:
    """``args`` split into positional words and options (``--x v``, ``--x=v``, ``--flag``)."""
    words: list[str] = []
    options: dict[str, str | bool] = {}
    rest = iter(args)
    for arg in rest:
        name, eq, value = arg.partition("=")
        if not arg.startswith("-"):
            words.append(arg)
        elif name in valued:
            options[name] = value if eq else next(rest)
        else:
            options[arg] = True
    return words, options


def _typed(value: str) -> object:
    # pulumi config set --help: with --path, "true"/"false" are booleans and integers numbers.
    if value in ("true", "false"):
        return value == "true"
    return int(value) if re.fullmatch(r"-?\d+", value) else value


def _set_path(config: dict, project: str, key: str, value: object) -> None:
    """Set ``a.b[0]`` or ``["a.b"].c`` inside ``config`` as `pulumi config set --path` does
    (the first step is the setting, qualified with the project unless it names a namespace)."""
    parts = re.findall(r'\["([^"]+)"\]|\[(\d+)\]|([^.\[\]]+)', key)
    steps: list[str | int] = [q or (int(i) if i else n) for q, i, n in parts]
    if ":" not in str(steps[0]):
        steps[0] = f"{project}:{steps[0]}"
    node: dict | list = config
    for step, following in zip(steps, [*steps[1:], None], strict=True):
        if following is None:
            child = value
        else:
            empty: dict | list = [] if isinstance(following, int) else {}
            child = node[step] if _has(node, step) else empty  # type: ignore[index]
        if isinstance(node, list):
            if not isinstance(step, int) or step > len(node):  # the hard reading: no gaps
                raise ValueError(f"{key}: index {step} is past the end of the list")
            node[step : step + 1] = [child]
        else:
            node[step] = child
        node = child  # type: ignore[assignment]


def _has(node: dict | list, step: str | int) -> bool:
    return step in node if isinstance(node, dict) else isinstance(step, int) and step < len(node)


def _stack(words: list[str], options: dict[str, str | bool], state: Path) -> int:
    """`pulumi stack init NAME [--secrets-provider P]` and `pulumi stack select NAME`."""
    known = state / "stacks"
    stacks = set(json.loads(known.read_text())) if known.exists() else set()
    if len(words) != 3 or words[1] not in ("init", "select"):
        return _fail(f"`pulumi {' '.join(words)}` is not modelled offline by this stand-in")
    name = words[2]
    if words[1] == "select" and name not in stacks:
        return _fail(f"no stack named '{name}' found")
    if words[1] == "init":
        if name in stacks:
            return _fail(f"stack '{name}' already exists")
        known.write_text(json.dumps(sorted({*stacks, name})))
        path = Path(f"Pulumi.{name}.yaml")
        stack = (yaml.safe_load(path.read_text()) if path.exists() else None) or {}
        if "--secrets-provider" in options or not path.exists():
            if "--secrets-provider" in options:
                stack["secretsprovider"] = options["--secrets-provider"]
            path.write_text(yaml.safe_dump(stack))  # an existing stack file keeps its config
    (state / "current").write_text(name)
    return 0


def _config_set(words: list[str], options: dict[str, str | bool], stack_name: str) -> int:
    """`pulumi config set [--path] [--secret|--plaintext] KEY VALUE` on the stack's file."""
    if len(words) != 4:
        return _fail("this stand-in takes `pulumi config set KEY VALUE` (no prompt)")
    project = yaml.safe_load(Path("Pulumi.yaml").read_text())["name"]
    key, value = words[2], words[3]
    stored: object = {"secure": "v1:" + base64.b64encode(value.encode()).decode()}
    if "--secret" not in options:
        stored = _typed(value) if "--path" in options and re.search(r"[.\[]", key) else value
    path = Path(f"Pulumi.{stack_name}.yaml")
    stack = yaml.safe_load(path.read_text()) or {}
    config = stack.setdefault("config", {})
    try:
        if "--path" in options:
            _set_path(config, project, key, stored)
        else:
            config[key if ":" in key else f"{project}:{key}"] = stored
    except ValueError as err:
        return _fail(str(err))
    path.write_text(yaml.safe_dump(stack))
    return 0


def pulumi(args: list[str]) -> int:
    """The CLI's stack and config commands on Pulumi.<stack>.yaml; `preview` and `up` are
    recorded once a stack is selected and `--policy-pack` names a pack."""
    words, options = _options(args, {"--secrets-provider", "--stack", "-s", "--policy-pack"})
    state = _backend()
    if words[:1] == ["stack"]:
        return _stack(words, options, state)
    current = state / "current"
    name = str(options.get("--stack") or options.get("-s") or "") or (
        current.read_text() if current.exists() else ""
    )
    if not name:
        return _fail("no stack selected; run `pulumi stack select` or `pulumi stack init`")
    if words[:2] == ["config", "set"]:
        return _config_set(words, options, name)
    if words not in (["preview"], ["up"]):
        return _fail(f"`pulumi {' '.join(args)}` is not modelled offline by this stand-in")
    pack = Path(str(options.get("--policy-pack", ".")))
    if "--policy-pack" in options and not (pack / "PulumiPolicy.yaml").is_file():
        return _fail(f"policy pack {pack}: no PulumiPolicy.yaml there")
    with (state / "recorded").open("a") as record:
        record.write(json.dumps([name, *args]) + "\n")
    return 0


def az(args: list[str]) -> int:
    words, options = _options(args, {"-g", "--group", "--query", "-o", "--output"})
    group = options.get("-g") or options.get("--group")
    if words == ["ad", "group", "show"] and group and options.get("--query") == "id":
        print(uuid.uuid5(uuid.NAMESPACE_DNS, str(group)))  # an object id, one per group
        return 0
    print(f"az stand-in: `az {' '.join(args)}` is not modelled offline", file=sys.stderr)
    return 1


def curl(args: list[str]) -> int:
    if args == ["-s", "https://ifconfig.me"]:
        print("203.0.113.7", end="")  # it prints the caller's public address, no newline
        return 0
    print(f"curl stand-in: `curl {' '.join(args)}` is not modelled offline", file=sys.stderr)
    return 1


STANDINS = {"pulumi": pulumi, "az": az, "curl": curl}


def install(bin_dir: Path) -> None:
    """Write ``pulumi``, ``az`` and ``curl`` into ``bin_dir`` (put it first on PATH)."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    for tool in STANDINS:
        script = f'#!/bin/sh\nexec "{sys.executable}" "{__file__}" {tool} "$@"\n'
        (bin_dir / tool).write_text(script)
        (bin_dir / tool).chmod(0o755)


def recorded(home: Path) -> list[list[str]]:
    """The `pulumi preview` and `pulumi up` calls so far: the stack, then the arguments."""
    path = home / BACKEND / "recorded"
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


if __name__ == "__main__":
    sys.exit(STANDINS[sys.argv[1]](sys.argv[2:]))
