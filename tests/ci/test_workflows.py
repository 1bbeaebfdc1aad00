"""The GitHub workflows: actionlint clean, no long-lived secrets, and the changed-stack logic."""

import ast
import contextlib
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import hypothesis
import psutil
import pytest
import yaml
from _pytest.mark.expression import Expression  # what -m compiles its expression with

from dt_commands.stacks import all_stacks, changed_stacks, job_stacks
from tests.support.bounds import STUCK_SECONDS

REPO = Path(__file__).resolve().parents[2]
WORKFLOWS = sorted((REPO / ".github" / "workflows").glob("*.yml"))


def test_actionlint_is_clean():
    assert len(WORKFLOWS) == 3
    actionlint = Path(sys.executable).parent / "actionlint"
    result = subprocess.run(
        [str(actionlint), *map(str, WORKFLOWS)], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("workflow", WORKFLOWS, ids=lambda p: p.name)
def test_no_long_lived_secrets(workflow):
    text = workflow.read_text()
    # Only the per-run GITHUB_TOKEN; Azure is OIDC (client/tenant ids are not secrets).
    assert set(re.findall(r"secrets\.([A-Z_]+)", text)) <= {"GITHUB_TOKEN"}
    assert "PULUMI_CONFIG_PASSPHRASE" not in text and "AZURE_STORAGE_KEY" not in text


def test_tests_run_the_readme_command_as_root():
    steps = yaml.safe_load((REPO / ".github/workflows/test.yml").read_text())["jobs"]["test"]
    runs = [step["run"] for step in steps["steps"] if "run" in step]
    # The runner's user sets up; the tests run as root, where the seam tests can run, and see
    # CI (GitHub sets CI=true) so that a seam test skipped for want of root fails the run.
    assert runs[0] == "make setup gpu-wheel"
    sudo = shlex.split(runs[1])
    assert sudo[0] == "sudo" and sudo[-2:] == ["make", "test"]
    assert "CI" in sudo[1].removeprefix("--preserve-env=").split(",")


@pytest.mark.parametrize("ci", ["true", ""])
def test_in_ci_a_seam_test_skipped_for_want_of_root_fails_the_run(tmp_path, ci):
    (tmp_path / "test_seam.py").write_text(
        "import pytest\n\n"
        "def test_seam():\n"
        "    pytest.skip('the Batch emulator runs nodes in namespaces: needs root')\n\n"
        "def test_gpu():\n"
        "    pytest.skip('no CUDA device')\n"
    )
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "tests.support.seam_skips", "-c", os.devnull,
         "--rootdir", str(tmp_path), "-p", "no:cacheprovider", str(tmp_path)],
        cwd=REPO, capture_output=True, text=True, timeout=120,
        env={**os.environ, "CI": ci, "PYTHONPATH": str(REPO)},
    )  # fmt: skip
    assert result.returncode == (1 if ci else 0), result.stdout + result.stderr
    assert ("1 seam test(s) skipped for want of root" in result.stdout) == bool(ci)


# Prints each collected test's id and marker names: one collection, which the passes' -m
# expressions are then evaluated against, instead of a collection per pass.
MARKER_PLUGIN = """
def pytest_collection_finish(session):
    for item in session.items:
        marks = ",".join(sorted({m.name for m in item.iter_markers()}))
        print("collected", marks, item.nodeid, sep="\t")  # ids may hold spaces, not tabs
"""


def _collected_markers(plugin_dir: Path, *options: str) -> dict[str, set[str]]:
    """Every test id ``pytest *options tests`` collects (and keeps), with its markers' names."""
    (plugin_dir / "marker_dump.py").write_text(MARKER_PLUGIN)
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
         "-p", "marker_dump", *options, "tests"],
        cwd=REPO, capture_output=True, text=True, timeout=600,
        env={**os.environ, "PYTHONPATH": os.pathsep.join((str(REPO), str(plugin_dir)))},
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    found = {}
    for line in result.stdout.splitlines():
        if line.startswith("collected\t"):
            _, marks, nodeid = line.split("\t", 2)
            found[nodeid] = set(marks.split(",")) if marks else set()
    return found


RUN_TESTS = REPO / "scripts" / "run_tests.sh"


def _run_tests_arrays() -> dict[str, list[str]]:
    """The pytest arguments of make test's passes as scripts/run_tests.sh declares them
    (``name=(...)``), split as the shell splits them. make test's recipe runs that script, and
    the script runs every pass it declares."""
    makefile = (REPO / "Makefile").read_text()
    recipe = re.search(r"^test:.*\n((?:\t.*\n)+)", makefile, re.M).group(1)  # type: ignore[union-attr]
    assert recipe.strip() == "bash scripts/run_tests.sh", recipe
    script = RUN_TESTS.read_text()
    arrays = {
        name: shlex.split(inside) for name, inside in re.findall(r"^(\w+)=\((.*)\)$", script, re.M)
    }
    for name in arrays:
        assert f'"${{{name}[@]}}"' in script, f"scripts/run_tests.sh never runs {name}"
    return arrays


def _make_test_passes() -> dict[str, list[str]]:
    """make test's passes, each without its ``-n`` (workers change what runs where, not what
    runs)."""
    passes = _run_tests_arrays()
    for argv in passes.values():
        if "-n" in argv:
            del argv[argv.index("-n") : argv.index("-n") + 2]
    return passes


def test_make_test_runs_every_test_exactly_once(tmp_path):
    """make test's two passes (those marked ``processes`` one at a time, the tests that start no
    multi-process run on both cores beside them) run between them every test a plain run
    collects, each in one pass only: each pass's ``-m`` evaluated as pytest evaluates it on every
    test."""
    passes = _make_test_passes()
    assert sorted(passes) == ["one_process", "processes"], passes
    for argv in passes.values():
        assert len(argv) == 3 and argv[0] == "-m" and argv[2] == "tests", argv
    collected = _collected_markers(tmp_path)
    assert collected
    runs = {
        name: {
            nodeid
            for nodeid, marks in collected.items()
            if Expression.compile(expr).evaluate(lambda mark, /, marks=marks, **_: mark in marks)
        }
        for name, (_, expr, _) in passes.items()
    }
    assert all(runs.values()), f"a pass of make test runs no test: {runs}"
    assert not runs["processes"] & runs["one_process"], "tests run in both passes"
    assert sorted(runs["processes"] | runs["one_process"]) == sorted(collected)
    # The runs' pass as pytest collects it, importing only the modules that mark tests so
    # (tests/conftest.py), keeps every test marked so.
    assert sorted(_collected_markers(tmp_path, *passes["processes"][:2])) == sorted(
        runs["processes"]
    )


# A stand-in for .venv/bin/pytest: records how it was started, then exits with the status (or
# sleeps for the seconds) its pass is given in the environment.
STUB_PYTEST = """#!{python}
import json, os, signal, subprocess, sys, time
name = {{"-m": "processes", "-n": "one_process", "lint": "lint"}}[sys.argv[1]]
try:
    autogroup = open("/proc/self/autogroup").read().split()[-1]
except OSError:
    autogroup = None
record = {{"argv": sys.argv[1:], "nice": os.nice(0), "autogroup": autogroup,
          "session": os.getsid(0), "pid": os.getpid(), "at": time.monotonic()}}
if "STUB_SLEEP_" + name in os.environ:  # and a process of its own, as a test's Azurite
    record["child"] = subprocess.Popen(["sleep", os.environ["STUB_SLEEP_" + name]]).pid
path = os.path.join(os.environ["STUB_DIR"], name + ".json")
with open(path + ".tmp", "w") as f:  # whole once it exists: the test polls for it
    json.dump(record, f)
os.replace(path + ".tmp", path)
print(name, "says hello")
if "STUB_SLEEP_" + name in os.environ:
    signal.signal(signal.SIGINT, lambda *_: sys.exit(2))
    time.sleep(float(os.environ["STUB_SLEEP_" + name]))
sys.exit(int(os.environ.get("STUB_EXIT_" + name, "0")))
"""


def _stub_checkout(tmp_path: Path) -> Path:
    """scripts/run_tests.sh in a checkout of its own whose .venv/bin/pytest is STUB_PYTEST, and
    whose Makefile's lint runs it too (as ``pytest lint``: recorded as the lint)."""
    root = tmp_path / "checkout"
    (root / "scripts").mkdir(parents=True)
    (root / ".venv" / "bin").mkdir(parents=True)
    (root / "scripts" / "run_tests.sh").write_text(RUN_TESTS.read_text())
    (root / "Makefile").write_text("lint:\n\t.venv/bin/pytest lint\n")
    stub = root / ".venv" / "bin" / "pytest"
    stub.write_text(STUB_PYTEST.format(python=sys.executable))
    stub.chmod(0o755)
    return root


@pytest.mark.parametrize("failing", [None, "processes", "lint", "one_process"])
def test_make_test_runs_the_processes_at_normal_priority_and_the_rest_beside_at_the_lowest(
    tmp_path, failing
):
    """The multi-process runs time signals, exits and stalls: their pass has no workers and this
    shell's priority. Beside them, lint and then the other tests run in a session of their own
    at nice 19 with its autogroup at nice 19 (else their nice would only weigh against their own
    session's processes), so they only get the cores the runs leave idle. Their output follows
    the runs'; any of the three failing fails it, and a failed lint still lets the tests run."""
    root = _stub_checkout(tmp_path)
    env = {**os.environ, "STUB_DIR": str(tmp_path)}
    if failing:
        env[f"STUB_EXIT_{failing}"] = "1"
    done = subprocess.run(["bash", str(root / "scripts" / "run_tests.sh")], env=env,
                          capture_output=True, text=True, timeout=STUCK_SECONDS)  # fmt: skip
    assert (done.returncode != 0) == bool(failing), done.stdout + done.stderr
    out = done.stdout
    assert out.index("processes says hello") < out.index("lint says hello"), out
    assert out.index("lint says hello") < out.index("one_process says hello"), out
    runs = {
        name: json.loads((tmp_path / f"{name}.json").read_text())
        for name in (*_make_test_passes(), "lint")
    }
    assert runs["processes"]["argv"] == ["-m", "processes", "tests"]
    assert runs["one_process"]["argv"] == ["-n", "2", "-m", "not processes", "tests"]
    assert runs["lint"]["at"] < runs["one_process"]["at"]
    assert runs["processes"]["nice"] == os.nice(0)
    assert runs["processes"]["session"] == os.getsid(0)
    for beside in ("lint", "one_process"):
        assert runs[beside]["nice"] == 19
        assert runs[beside]["session"] not in (os.getsid(0), runs["processes"]["pid"])
        assert runs[beside]["session"] == runs["one_process"]["session"]
        if runs[beside]["autogroup"] is not None:  # a kernel with autogroups
            assert runs[beside]["autogroup"] == "19"


def test_hypothesis_examples_have_no_wall_clock_deadline():
    """The tests beside the multi-process runs wait for idle cores: tests/conftest.py's profile
    lifts Hypothesis's 200 ms per example, for the tests that do not set their own."""
    assert hypothesis.settings.default.deadline is None


def _processes(*pids: int) -> list[psutil.Process]:
    found = []
    for pid in pids:
        with contextlib.suppress(psutil.NoSuchProcess):
            found.append(psutil.Process(pid))
    return found


def _as_from_a_terminal() -> None:
    """SIGINT as a terminal's foreground job has it: at its default. A test run started in the
    background of a script (a CI runner's, ``nohup ... &``) inherits it ignored, and bash can
    neither trap nor reset a signal ignored on entry (bash(1), SIGNALS): Ctrl-C would then never
    reach the script's trap, and the check would hang for a reason of its caller's."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.parametrize("interrupted", ["lint", "one_process"])
def test_an_interrupted_make_test_stops_the_pass_beside_and_leaves_nothing(tmp_path, interrupted):
    """Ctrl-C in a terminal (SIGINT to the script's process group) stops the runs in the
    foreground and reaches the pass beside, in a session of its own, as SIGINT too, in its lint
    or in its tests: it ends (an interrupted lint starts no tests), and no process or log of it
    is left."""
    root = _stub_checkout(tmp_path)
    # The passes sleep until interrupted (far longer than any test waits), so the end the test
    # sees is the interrupt's.
    asleep = str(10 * STUCK_SECONDS)
    env = {**os.environ, "STUB_DIR": str(tmp_path), "STUB_SLEEP_processes": asleep,
           f"STUB_SLEEP_{interrupted}": asleep, "TMPDIR": str(tmp_path)}  # fmt: skip
    script = subprocess.Popen(["bash", str(root / "scripts" / "run_tests.sh")], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              start_new_session=True, preexec_fn=_as_from_a_terminal)  # fmt: skip
    started: list[psutil.Process] = []
    try:
        deadline = time.monotonic() + STUCK_SECONDS
        while not all((tmp_path / f"{name}.json").exists() for name in ("processes", interrupted)):
            assert time.monotonic() < deadline and script.poll() is None, "the passes never started"
            time.sleep(0.05)
        beside = json.loads((tmp_path / f"{interrupted}.json").read_text())
        started = _processes(beside["pid"], beside["child"])
        os.killpg(script.pid, signal.SIGINT)
        assert script.wait(timeout=STUCK_SECONDS) != 0
        _, alive = psutil.wait_procs(started, timeout=STUCK_SECONDS)
        assert not alive, alive
    finally:  # a failed check leaves no sleeping pass behind
        with contextlib.suppress(ProcessLookupError):
            os.killpg(script.pid, signal.SIGKILL)
        for process in started:
            with contextlib.suppress(psutil.NoSuchProcess):
                process.kill()
        script.wait()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith("tmp.")], "the log was left"
    if interrupted == "lint":
        assert not (tmp_path / "one_process.json").exists()


# What starts a real multi-process run in a test: the two-worker launchers, the simulated
# launch nodes, the node emulator's pools, the shared run of two Horovod workers, and the runs
# on emulated nodes that tests of several files read (tests/infra/batch_nodes/shared_runs.py).
STARTS_PROCESSES = {
    "tests.support.launchers": {"horovodrun", "torchrun"},
    "tests.trainer.launch.launch_nodes": {"start_nodes"},
    "tests.batch_emulator.cluster": {"Cluster"},
    "tests.batch_emulator.job_run": {"JobRun"},
    # Commands run inside the built image (buildah's chroot), each importing its CUDA torch.
    "tests.support.built_image": {"image_container"},
}
PROCESS_FIXTURES = {
    "make_cluster",
    "uninterrupted_signal_run",
    "shared_pools",
    "run_under_kill",
    "run_under_survive_shared_node",
    "run_under_survive_shared_task",
    "retried_elsewhere_then_kept_out",
    "built_image",
}


def starts_processes(source: str) -> bool:
    """Whether a test module imports or requests what starts a multi-process run."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.module in STARTS_PROCESSES:
            names = {a.name for a in node.names} & STARTS_PROCESSES[node.module]
        elif isinstance(node, ast.FunctionDef) and node.name.startswith("test"):
            names = {a.arg for a in node.args.args} & PROCESS_FIXTURES
        else:
            continue
        if names:
            return True
    return False


def test_every_module_that_starts_multi_process_runs_is_marked_processes():
    """Such a run uses both cores and its signals, exits and stalls need them: the module
    carries ``pytestmark = pytest.mark.processes``, so make test runs it in the one-at-a-time
    pass."""
    unmarked = [
        str(path.relative_to(REPO))
        for path in sorted((REPO / "tests").rglob("test_*.py"))
        if starts_processes(source := path.read_text()) and "pytest.mark.processes" not in source
    ]
    assert unmarked == []
    assert starts_processes("from tests.support.launchers import REPO, torchrun\n")
    assert not starts_processes("from tests.support.launchers import REPO\n")
    assert starts_processes("def test_x(tmp_path, uninterrupted_signal_run): pass\n")


def test_deploy_waits_for_environment_approval_and_applies_policies():
    deploy = yaml.safe_load((REPO / ".github/workflows/deploy.yml").read_text())
    up = deploy["jobs"]["up"]
    assert up["environment"] == "production"
    pulumi = next(s for s in up["steps"] if s.get("uses", "").startswith("pulumi/actions"))
    assert pulumi["with"]["command"] == "up"
    assert pulumi["with"]["policyPacks"] == "policy"


def test_the_deploy_outlasts_the_longest_image_build_it_allows():
    from infra.image_build import BUILD_TIMEOUT_SECONDS, QUEUE_GRACE_SECONDS

    deploy = yaml.safe_load((REPO / ".github/workflows/deploy.yml").read_text())
    up = deploy["jobs"]["up"]
    rest_of_a_first_deploy = 60 * 60  # NFS VM and its cloud-init, the pool, the job
    build = BUILD_TIMEOUT_SECONDS + QUEUE_GRACE_SECONDS
    assert up["timeout-minutes"] * 60 >= build + rest_of_a_first_deploy
    # GitHub issues the ID tokens infra/credentials.py trades, to the deploy's identity.
    assert deploy["permissions"]["id-token"] == "write"
    assert {"ARM_CLIENT_ID", "ARM_TENANT_ID"} <= set(up["env"])


def test_preview_comments_on_the_pull_request_with_policies():
    preview = yaml.safe_load((REPO / ".github/workflows/preview.yml").read_text())
    step = next(
        s
        for s in preview["jobs"]["preview"]["steps"]
        if s.get("uses", "").startswith("pulumi/actions")
    )
    assert step["with"]["command"] == "preview"
    assert step["with"]["comment-on-pr"] is True
    assert step["with"]["policyPacks"] == "policy"
    assert step["with"]["cloud-url"].startswith("azblob://")


def test_changed_stacks():
    stacks = ["dev", "vision-prod"]
    assert changed_stacks(["Pulumi.dev.yaml"], stacks) == ["dev"]
    assert changed_stacks(["infra/network.py", "README.md"], stacks) == stacks
    assert changed_stacks(["Pulumi.gone.yaml"], stacks) == []
    assert all_stacks(REPO) == ["dev", "vision-prod"]
    # An image input gives a new tag and replaces the job of every stack that submits one.
    assert changed_stacks(["trainer/training/steps.py"], stacks, ["vision-prod"]) == ["vision-prod"]
    assert changed_stacks(["docker/Dockerfile"], stacks, stacks) == stacks
    assert changed_stacks(["scripts/build_horovod.sh"], stacks, stacks) == stacks
    # Docs and the operator CLI are not in the image: no stack changes.
    assert changed_stacks(["README.md", "bench/scaling.py"], stacks, stacks) == []


def test_stacks_that_submit_jobs_come_from_their_stack_files(tmp_path):
    (tmp_path / "Pulumi.yaml").write_text(
        "config:\n  gpu-cluster:submitJob:\n    type: boolean\n    default: true\n"
    )
    (tmp_path / "Pulumi.a.yaml").write_text("config:\n  gpu-cluster:team: a\n")
    (tmp_path / "Pulumi.b.yaml").write_text("config:\n  gpu-cluster:submitJob: false\n")
    (tmp_path / "Pulumi.c.yaml").write_text(
        "config:\n  gpu-cluster:submitJob: false\n  gpu-cluster:jobs:\n    small: {nodes: 1}\n"
    )
    assert job_stacks(["a", "b", "c"], tmp_path) == ["a", "c"]
    assert job_stacks(all_stacks(REPO)) == ["dev", "vision-prod"]


def test_changed_runs_git_and_prints_the_stacks(tmp_path):
    """The command CI runs, on a real repository: an edit under trainer/ selects job stacks."""
    import shutil

    repo = tmp_path / "repo"
    shutil.copytree(
        REPO, repo, ignore=shutil.ignore_patterns(".venv", ".git", "runs", "__pycache__")
    )
    git = ["git", "-C", str(repo), "-c", "user.email=t@e", "-c", "user.name=t"]
    subprocess.run([*git, "init", "-q", "-b", "main"], check=True)
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-qm", "base"], check=True)
    steps = repo / "trainer" / "training" / "steps.py"
    steps.write_text(steps.read_text() + "#\n")
    subprocess.run([*git, "commit", "-qam", "change"], check=True)
    result = subprocess.run(
        [sys.executable, "-m", "dt_commands.stacks", "changed", "HEAD~1"],
        cwd=repo, capture_output=True, text=True, timeout=STUCK_SECONDS,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == ["dev", "vision-prod"]


def test_bad_stacks_commands_are_one_line_errors():
    for argv, message in (
        ([], "required: command"),
        (["changed"], "required: base"),
        (["changed", "no-such-commit"], "git diff no-such-commit...HEAD failed: fatal: "),
    ):
        result = subprocess.run(
            [sys.executable, "-m", "dt_commands.stacks", *argv],
            cwd=REPO, capture_output=True, text=True, timeout=STUCK_SECONDS,
        )  # fmt: skip
        assert result.returncode == 2 and message in result.stderr
        assert result.stderr.count("\n") == 1 and not result.stdout


def test_the_config_reference_matches_the_schema():
    from dt_commands.docs import REFERENCE, with_reference

    page = REFERENCE.read_text(encoding="utf-8")
    assert with_reference(page) == page, "run: python -m dt_commands.docs --write"
    assert "| `vmSize` | string |" in page


def test_the_preview_posts_the_jobs_summary_made_from_the_cli_json(tmp_path):
    """The summary step's script, run the way a runner runs it (bash -eo pipefail), with a stub
    ``pulumi`` that answers ``preview --json`` with a digest of one replaced job."""
    preview = yaml.safe_load((REPO / ".github/workflows/preview.yml").read_text())
    steps = preview["jobs"]["preview"]["steps"]
    index = next(i for i, s in enumerate(steps) if "dt_commands.preview_jobs" in s.get("run", ""))
    step, comment = steps[index], steps[index + 1]
    assert comment["uses"].startswith("marocchino/sticky-pull-request-comment@")
    assert comment["with"]["path"] == "jobs.md"
    old = {
        "type": "pulumi-python:dynamic:Resource",
        "inputs": {
            "name": "small",
            "stack": "dev",
            "trainer_args": ["--epochs", "1"],
            "dataset_prefix": "",
        },
    }
    new = {**old, "inputs": {**old["inputs"], "node_count": 2}}
    digest = {
        "steps": [
            {
                "op": "replace",
                "urn": "urn:x::small",
                "oldState": old,
                "newState": new,
                "replaceReasons": ["node_count"],
            }
        ]
    }
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (tmp_path / "digest.json").write_text(json.dumps(digest))
    (bin_dir / "pulumi").write_text(
        '#!/bin/sh\necho "$*" >> "$CALLS"\nif [ "$1" = preview ]; then cat "$DIGEST"; fi\n'
    )
    (bin_dir / "pulumi").chmod(0o755)
    work = tmp_path / "work"
    work.mkdir()
    (work / ".venv").symlink_to(REPO / ".venv")
    (work / "infra").symlink_to(REPO / "infra")
    (work / "dt_commands").symlink_to(REPO / "dt_commands")
    (work / "trainer").symlink_to(REPO / "trainer")
    env = {
        **os.environ,
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "CALLS": str(tmp_path / "calls"),
        "DIGEST": str(tmp_path / "digest.json"),
        "GITHUB_STEP_SUMMARY": str(tmp_path / "summary.md"),
        "STACK": "dev",
        "STATE_URL": "azblob://pulumi-state?storage_account=state",
    }
    script = tmp_path / "step.sh"
    script.write_text(step["run"])
    subprocess.run(
        ["bash", "--noprofile", "--norc", "-eo", "pipefail", str(script)],
        cwd=work,
        env=env,
        check=True,
    )
    assert (tmp_path / "calls").read_text().splitlines() == [
        "login azblob://pulumi-state?storage_account=state",
        "preview --json --stack organization/gpu-cluster/dev",
    ]
    summary = (work / "jobs.md").read_text()
    assert "| small | replaced | node count changed | resumes from the newest checkpoint" in summary
    assert (tmp_path / "summary.md").read_text() == summary

    # A preview that fails (a refused replacement) exits 1 after writing its digest with the
    # error; the step and the comment run anyway (the preview step before them failed too).
    assert step["if"] == "${{ !cancelled() }}" and comment["if"].startswith("${{ !cancelled() &&")
    refusal = "job small (dev-small-1) is active, and this change would replace it (node_count)"
    (tmp_path / "digest.json").write_text(
        json.dumps({"diagnostics": [{"message": refusal, "severity": "error"}]})
    )
    (bin_dir / "pulumi").write_text(
        '#!/bin/sh\nif [ "$1" = preview ]; then cat "$DIGEST"; exit 1; fi\n'
    )
    subprocess.run(
        ["bash", "--noprofile", "--norc", "-eo", "pipefail", str(script)],
        cwd=work,
        env=env,
        check=True,
    )
    assert "**The preview failed**" in (work / "jobs.md").read_text()
    assert refusal in (work / "jobs.md").read_text()
