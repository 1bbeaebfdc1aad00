"""Every command block of README.md and docs/*.md (a fence opened with sh, bash, shell or console)
is classified in BLOCKS: run here, as written, or not run, with the reason and the tests that
run it instead. A new block fails until it is classified.

A block that is run is typed in bash (`set -euo pipefail`) in a fresh clone of this repository's
commit with an ssh origin, `.venv` linked to the one `make setup` built (the clone's files are
dated before it, so the clone's `make setup` finds it up to date, as after a set-up), and a HOME
holding an ssh key. A block that goes on from another (the jobs page's `pulumi config set`
lines, on the quick start's stack) is typed after that block's lines, and then the reader's
next step (`dt-plan`). The run stops at the first line that needs Azure (NEEDS_AZURE); every
later line must need it too. Neither the Pulumi CLI nor Azure is here: the stand-ins of
tests/ci/cli_standins.py are first on PATH.
- `pulumi stack init NAME [--secrets-provider P]` creates the stack in a backend kept under
  HOME (an existing one is refused) and selects it; the stack file is created (or kept, with its
  config) and records the secrets provider; `pulumi stack select NAME` selects a known stack;
- `pulumi config set [--path] [--secret|--plaintext] [-s STACK] KEY VALUE` writes
  Pulumi.<stack>.yaml as the CLI does: project-qualified keys; with --path a map or list
  element, "true"/"false" as booleans and integers as numbers (a top-level entry stays a
  string); --secret as an opaque `secure:` value;
- `pulumi preview` and `pulumi up` are recorded, once a stack is selected and `--policy-pack`
  names a policy pack, and the run stops there: `dt-plan` before them is the offline plan;
- `az ad group show -g NAME --query id -o tsv` prints an object id; `curl -s
  https://ifconfig.me` prints a documentation address (203.0.113.7);
- any other `pulumi`, `az` or `curl` call fails the run: it is not modelled.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

from tests.ci import cli_standins

REPO = Path(__file__).resolve().parents[2]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
FENCE = re.compile(r"^[ \t]*```(?:sh|bash|shell|console)[ \t]*\n(.*?)^[ \t]*```", re.S | re.M)
ORIGIN = "git@github.com:vision-org/distributed-training.git"
SSH_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIG62nMODCwNhCUKOiHZX7l9EOfmSqIQbTlOlF5ahhZ1t me\n"
# Before the set-up's stamp: `make setup` in the clone then has nothing to do.
OLD = 946684800  # 2000-01-01

# Lines that need an Azure subscription, the Pulumi backend or a deployed stack; a run stops at
# the first. `pulumi preview` and `pulumi up` are typed (and recorded by the stand-in) first.
NEEDS_AZURE = re.compile(
    r"(pulumi (up|preview|destroy|refresh|cancel|import|stack output)\b"
    r"|dt-jobs (?!sweep --local)|make azure-check(?! ARGS=--dry-run)|az |ssh )"
)
RECORDED = re.compile(r"pulumi (preview|up)\b")
# A block's key: its page, its title (the nearest heading, or a bold line such as **Quickstart**,
# above it) and the start of its first command.
Key = tuple[str, str, str]


@dataclass(frozen=True)
class NotRun:
    """A block, or a line of one, that is not run here: why, and the tests that run it."""

    why: str
    covered_by: tuple[str, ...] = ()  # "tests/...py" or "tests/...py::test_name"
    same_as: Key | None = None  # a block with the same text, which covered_by runs


@dataclass(frozen=True)
class Run:
    """A block run here as written: after `continues` (another block's lines, its plans left
    out), with `before` typed first and `after` typed last (the reader's next step)."""

    before: tuple[str, ...] = ()
    continues: Key | None = None
    after: tuple[str, ...] = ()
    skip: dict[str, NotRun] = field(default_factory=dict)  # a line's start -> why not here
    check: Callable[[Path, str], None] | None = None  # (the clone, the output) after the run


def _stack_file(clone: Path, stack: str) -> dict:
    return yaml.safe_load((clone / f"Pulumi.{stack}.yaml").read_text())["config"]


def _planned_from_the_origin(clone: Path, output: str) -> None:
    # The quick start never sets imageSourceRepo: the ssh origin gives it (as its https URL).
    assert "gpu-cluster:imageSourceRepo" not in _stack_file(clone, "vision-dev")
    assert "vision-dev" in output


def _jobs_planned(*names: str) -> Callable[[Path, str], None]:
    def check(clone: Path, output: str) -> None:
        for name in names:
            assert f"  {name}: " in output, f"the plan does not list job {name}"

    return check


QUICKSTART: Key = ("docs/deploy.md", "Quickstart", "make setup")
OWN_SCRIPT: Key = ("docs/jobs.md", "Your own script", "pulumi config set --path 'jobs.mine.code'")
TRAINING = NotRun(
    "command lines on the reader's own files (my.yaml, /data/imagenet, corpus/) and a full "
    "ResNet-50; their engines, data kinds and the dry run are run by these tests",
    covered_by=(
        "tests/trainer/engines/test_two_workers.py",
        "tests/trainer/models/test_language_model.py",
        "tests/trainer/engines/test_fsdp.py",
        "tests/trainer/settings/test_cli.py",
    ),
)
CUSTOM_MODEL = NotRun(
    "two workers train the example package: that test runs trainer.md's block as written",
    covered_by=("tests/examples/test_custom_model.py",),
)
PLANNED = ("dt-plan --stack vision-dev",)
BLOCKS: dict[Key, Run | NotRun] = {
    ("README.md", "The two commands", "make demo"): NotRun(
        "`make demo` trains 40 steps with two Horovod workers (over a minute here) after the "
        "dev stack's plan (deploy.md's `dt-plan --stack dev`, run here); `make test` is the suite",
        covered_by=("tests/trainer/engines/test_two_workers.py", "tests/ci/test_workflows.py"),
    ),
    ("README.md", "Run your own model", "torchrun"): NotRun(
        CUSTOM_MODEL.why,
        CUSTOM_MODEL.covered_by,
        same_as=("docs/trainer.md", "Run your own model", "torchrun"),
    ),
    ("README.md", "Train your model", "horovodrun"): TRAINING,
    ("README.md", "Deploy", "make setup"): Run(check=_planned_from_the_origin),
    # Their dry runs; the other lines need Azure.
    ("README.md", "Prove it on your subscription", "make azure-check"): Run(),
    ("docs/acceptance.md", "Prove it on your subscription: `make azure-check`", "make"): Run(),
    ("docs/data.md", "Datasets: prepare, upload, stage (`dt-data`)", "dt-data prepare"): NotRun(
        "needs the reader's image folder, a storage account and a Batch node's mounts",
        covered_by=("tests/trainer/data/test_prepare.py", "tests/trainer/data/test_transfer.py"),
    ),
    (
        "docs/deploy.md",
        "Deploy: the Azure environment, the image, teams and stacks",
        "dt-plan",
    ): Run(
        before=(". .venv/bin/activate",),  # the README's set-up puts the dt-* commands on PATH
        skip={
            ".venv/bin/python -m bench.program_eval": NotRun(
                "a benchmark: about 50 s here, and it rewrites bench/results",
                covered_by=("tests/bench/test_bench.py",),
            )
        },
    ),
    QUICKSTART: Run(check=_planned_from_the_origin),
    ("docs/jobs.md", "Jobs as code", "pulumi config set"): Run(
        continues=QUICKSTART, after=PLANNED, check=_jobs_planned("resnet", "small")
    ),
    # Planned after the next block of the page: a code job needs storageAllowedIps, set there.
    OWN_SCRIPT: Run(continues=QUICKSTART),
    ("docs/jobs.md", "Your own script", "DT_RUN_DIR="): NotRun(
        "two workers train the example script: that test runs this line as written",
        covered_by=("tests/examples/test_torchrun_example.py",),
    ),
    ("docs/jobs.md", "Your code without an image rebuild", "pulumi config set"): Run(
        continues=OWN_SCRIPT, after=PLANNED, check=_jobs_planned("mine")
    ),
    ("docs/jobs.md", "Results", "dt-jobs fetch"): NotRun(
        "needs a deployed stack's finished job",
        covered_by=("tests/dt_commands/jobs/test_fetch.py",),
    ),
    ("docs/scaling.md", "How far should I scale?", "dt-jobs sweep --stack"): NotRun(
        "the first line needs the stack's pool, the second is a synopsis ([trainer flags])",
        covered_by=(
            "tests/dt_commands/jobs/test_sweep.py",
            "tests/dt_commands/jobs/test_sweep_local.py",
        ),
    ),
    ("docs/scaling.md", "How far should I scale?", "dt-jobs sweep --local"): NotRun(
        "trains on one and two workers (minutes here) and rewrites docs/scaling-sweep",
        covered_by=("tests/dt_commands/jobs/test_sweep_local.py",),
    ),
    ("docs/trainer.md", "The trainer: `dt-train`", "horovodrun"): TRAINING,
    ("docs/trainer.md", "The trainer: `dt-train`", "ssh -N -L"): NotRun(
        "needs a cluster node and a jump host",
        covered_by=(
            "tests/trainer/watch/test_debugger.py",
            "tests/trainer/watch/test_debugger_two_workers.py",
        ),
    ),
    ("docs/trainer.md", "Run your own model", "torchrun"): CUSTOM_MODEL,
}


@dataclass(frozen=True)
class DocBlock:
    page: str
    title: str
    line: int  # of the opening fence
    commands: tuple[str, ...]  # continued lines joined, blank and comment-only lines left out

    def where(self) -> str:
        return f"{self.page}:{self.line} ({self.title}): {self.commands[0]}"


def doc_blocks() -> list[DocBlock]:
    blocks = []
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        for match in FENCE.finditer(text):
            outside = FENCE.sub("", text[: match.start()])  # a `# comment` in a block is no title
            titles = re.findall(r"^(?:#+ (.+)|\*\*([^*\n]+)\*\*)$", outside, re.M)
            lines = match.group(1).replace("\\\n", " ").splitlines()
            commands = tuple(x for x in lines if x.strip() and not x.lstrip().startswith("#"))
            blocks.append(
                DocBlock(
                    str(page.relative_to(REPO)),
                    "".join(titles[-1]) if titles else "",
                    text.count("\n", 0, match.start()) + 1,
                    commands,
                )
            )
    return blocks


def classify(blocks: list[DocBlock]) -> dict[Key, list[DocBlock]]:
    """Each key of BLOCKS and the blocks it names (exactly one when all is well)."""
    named: dict[Key, list[DocBlock]] = {key: [] for key in BLOCKS}
    for found in blocks:
        for key in BLOCKS:
            page, title, start = key
            if (page, title) == (found.page, found.title) and found.commands[0].startswith(start):
                named[key].append(found)
    return named


def unclassified(blocks: list[DocBlock]) -> list[str]:
    named = classify(blocks)
    return [b.where() for b in blocks if not any(b in found for found in named.values())]


def block(key: Key) -> DocBlock:
    (found,) = classify(doc_blocks())[key]
    return found


def lines_run(key: Key) -> tuple[list[str], list[str]]:
    """The lines of a Run block typed here (to its first line that needs Azure, that line too
    when the stand-in records it; skipped lines left out) and the lines after them."""
    entry, lines = BLOCKS[key], list(block(key).commands)
    assert isinstance(entry, Run)
    stop = next((i for i, x in enumerate(lines) if NEEDS_AZURE.match(x)), len(lines))
    if stop < len(lines) and RECORDED.match(lines[stop]):
        stop += 1
    typed = [x for x in lines[:stop] if not any(x.startswith(s) for s in entry.skip)]
    return typed, lines[stop:]


def script(key: Key) -> list[str]:
    """Every line typed for ``key``: the block it continues (its plans left out), then its own."""
    entry = BLOCKS[key]
    assert isinstance(entry, Run)
    earlier = script(entry.continues) if entry.continues else []
    earlier = [x for x in earlier if not x.startswith("dt-plan") and not RECORDED.match(x)]
    return [*earlier, *entry.before, *lines_run(key)[0], *entry.after]


def fresh_clone(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """A clone of the checked-out commit (the blocks are read from this checkout's pages) with
    an ssh origin and `.venv` linked and set up, and the environment to type the blocks in."""
    stamp = REPO / ".venv" / ".setup-complete"
    assert stamp.is_file(), "run `make setup` first: the clone links this checkout's .venv"
    clone, home = tmp_path / "clone", tmp_path / "home"
    subprocess.run(["git", "clone", "-q", str(REPO), str(clone)], check=True, timeout=120)
    subprocess.run(["git", "-C", str(clone), "remote", "set-url", "origin", ORIGIN], check=True)
    for path in clone.rglob("*"):
        if ".git" not in path.relative_to(clone).parts:
            os.utime(path, (OLD, OLD), follow_symlinks=False)
    (clone / ".venv").symlink_to(REPO / ".venv")  # `make setup` made it
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "id_ed25519.pub").write_text(SSH_KEY)
    cli_standins.install(tmp_path / "bin")
    path = [p for p in os.environ["PATH"].split(os.pathsep) if not p.startswith(str(REPO))]
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONHOME")}
    env |= {"PATH": os.pathsep.join([str(tmp_path / "bin"), *path]), "HOME": str(home)}
    # The clone's code, not this checkout's, which the linked .venv installed.
    return clone, env | {"PYTHONPATH": str(clone)}


def typed_in_bash(lines: list[str]) -> str:
    """A bash script that stops at the first failing line and shows each line as it is typed."""
    shown = [f"printf '$ %s\\n' {shlex.quote(x)} >&2\n{x}" for x in lines]
    return "set -euo pipefail\n" + "\n".join(shown) + "\n"


RUN_KEYS = [key for key, entry in BLOCKS.items() if isinstance(entry, Run)]
# A comment at the end of a line, with no quote in it (so not inside a quoted word): bash
# ignores it, and so does the key of a shared run.
TRAILING_COMMENT = re.compile(r"[ \t]+#[^'\"`]*$")


@dataclass(frozen=True)
class TypedRun:
    """What typing a script in a fresh clone left: the clone, bash's exit status and output
    (stdout and stderr in the order a terminal shows them), and the stand-in's recordings."""

    clone: Path
    returncode: int
    output: str
    recorded: list


@pytest.fixture(scope="module")
def typed_runs(tmp_path_factory) -> Callable[[list[str]], TypedRun]:
    """Types a script in bash in a fresh clone, once per script for this module: blocks whose
    scripts differ only in their trailing comments share one run (README's and
    docs/acceptance.md's `make azure-check ARGS=--dry-run`, each with its own comment). Read
    by test_the_block_runs_as_written_in_a_fresh_clone; its checks only read the clone."""
    runs: dict[tuple[str, ...], TypedRun] = {}

    def run(lines: list[str]) -> TypedRun:
        key = tuple(TRAILING_COMMENT.sub("", x) for x in lines)
        if key not in runs:
            tmp_path = tmp_path_factory.mktemp("typed")
            clone, env = fresh_clone(tmp_path)
            result = subprocess.run(
                ["bash", "-c", typed_in_bash(lines)],
                cwd=clone,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,  # in the order a terminal shows them
                text=True,
                timeout=300,
            )
            recorded = cli_standins.recorded(tmp_path / "home")
            runs[key] = TypedRun(clone, result.returncode, result.stdout, recorded)
        return runs[key]

    return run


@pytest.mark.parametrize("key", RUN_KEYS, ids=lambda key: f"{key[0]}:{key[1]}")
def test_the_block_runs_as_written_in_a_fresh_clone(key, typed_runs):
    entry, where = BLOCKS[key], block(key).where()
    assert isinstance(entry, Run)
    typed, rest = lines_run(key)
    assert typed, f"{where}: nothing in it runs offline; classify it as NotRun"
    offline = [x for x in rest if not NEEDS_AZURE.match(x)]
    assert not offline, f"{where}: offline lines after one that needs Azure: {offline}"
    lines = script(key)
    result = typed_runs(lines)
    assert result.returncode == 0, f"{where}\n{result.output}"
    recorded = result.recorded
    assert len(recorded) == len([x for x in lines if RECORDED.match(x)]), recorded
    if entry.check:
        entry.check(result.clone, result.output)


def test_every_command_block_is_classified_once():
    missing = unclassified(doc_blocks())
    assert not missing, "classify in BLOCKS (run here, or why not):\n" + "\n".join(missing)
    named = classify(doc_blocks())
    assert {k: len(v) for k, v in named.items() if len(v) != 1} == {}, "stale or ambiguous keys"


def test_a_new_block_is_unclassified_until_blocks_names_it():
    new = DocBlock("docs/jobs.md", "Jobs as code", 1, ("pulumi stack rm vision-dev",))
    moved = DocBlock("docs/new.md", "Jobs as code", 1, ("pulumi config set --path x 1",))
    assert unclassified([*doc_blocks(), new, moved]) == [new.where(), moved.where()]


def test_a_block_not_run_here_names_tests_that_exist_and_its_twin_is_the_same():
    for key, entry in BLOCKS.items():
        reasons = [entry] if isinstance(entry, NotRun) else list(entry.skip.values())
        for reason in reasons:
            assert reason.why and reason.covered_by, key
            for test in reason.covered_by:
                path, _, name = test.partition("::")
                assert (REPO / path).exists(), f"{key}: {path} does not exist"
                assert not name or f"def {name}(" in (REPO / path).read_text(), test
            if reason.same_as:
                assert block(key).commands == block(reason.same_as).commands, key
        for start in entry.skip if isinstance(entry, Run) else ():
            assert any(x.startswith(start) for x in block(key).commands), (key, start)


def test_the_pulumi_stand_in_writes_the_stack_file_as_the_cli_does(tmp_path):
    (tmp_path / "Pulumi.yaml").write_text("name: gpu-cluster\n")
    cli_standins.install(tmp_path / "bin")
    env = os.environ | {"PATH": f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}"}

    def pulumi(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["pulumi", *args],
            cwd=tmp_path,
            env=env | {"HOME": str(tmp_path)},
            text=True,
            capture_output=True,
            timeout=60,
        )

    assert pulumi("config", "set", "team", "x").returncode == 255  # no stack selected
    assert pulumi("stack", "init", "t", "--secrets-provider", "passphrase").returncode == 0
    assert pulumi("stack", "init", "t").returncode == 255  # it exists
    assert pulumi("stack", "select", "other").returncode == 255
    for args in (
        ("nodeCount", "2"),  # a top-level entry stays a string
        ("--path", "jobs.small.nodes", "1"),
        ("--path", "jobs.small.submit", "false"),
        ("--path", "budgetEmails[0]", "a@example.com"),
        ("--path", "budgetEmails[1]", "b@example.com"),
        ("--path", '["cost.center"].code', "cc-1"),
        ("--secret", "token", "s3cret"),
    ):
        assert pulumi("config", "set", *args).returncode == 0, args
    assert pulumi("config", "set", "--path", "budgetEmails[5]", "c").returncode != 0
    assert pulumi("destroy").returncode != 0  # not modelled
    stack = yaml.safe_load((tmp_path / "Pulumi.t.yaml").read_text())
    assert stack["secretsprovider"] == "passphrase"
    token = stack["config"].pop("gpu-cluster:token")
    assert set(token) == {"secure"} and "s3cret" not in token["secure"]
    assert stack["config"] == {
        "gpu-cluster:nodeCount": "2",
        "gpu-cluster:jobs": {"small": {"nodes": 1, "submit": False}},
        "gpu-cluster:budgetEmails": ["a@example.com", "b@example.com"],
        "gpu-cluster:cost.center": {"code": "cc-1"},
    }
    assert pulumi("up", "--policy-pack", "nowhere").returncode == 255
    assert pulumi("preview", "--policy-pack", str(REPO / "policy")).returncode == 0
    assert [x[0] for x in cli_standins.recorded(tmp_path)] == ["t"]
