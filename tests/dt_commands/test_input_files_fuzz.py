"""Files a user hands the CLIs, generated: text in other encodings (Latin-1, cp1252, UTF-16,
UTF-32), binary garbage, and JSON/YAML documents of the wrong shape. Every example ends with exit
0 or exit 2 and at most one line on stderr, never a traceback: the stack outputs of the job CLI
(``dt_commands.jobs --outputs-file``) and of ``dt_commands.plan --deployed``, the stack file of
``dt_commands.plan``, the trainer settings file a job points to (``infra.trainer_settings``),
the preview digest of ``dt_commands.preview_jobs``, and the node launcher's worker count and ports
(``trainer.launch``)."""

from __future__ import annotations

import functools
import json
import subprocess
import sys
from pathlib import Path
from unittest.mock import create_autospec

import pytest
from azure.batch import BatchClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dt_commands import plan, preview_jobs
from dt_commands.jobs import main as dt_jobs
from dt_commands.stack_outputs import JobsError
from tests.support.stacks import REPO
from trainer.launch import main as launcher
from trainer.launch.batch_env import LaunchError, rendezvous_port

# The launcher checks start processes; none may outlive its test.
pytestmark = pytest.mark.usefixtures("no_leftover_processes")

# Each example runs in milliseconds (no program evaluation: nothing here is a valid stack); these
# counts keep every test under 5 s on a busy 2-core machine.
FAST = settings(max_examples=100, suppress_health_check=list(HealthCheck))

ENCODINGS = ("latin-1", "cp1252", "utf-16", "utf-16-le", "utf-32")
# Characters every encoding above can write, at least one of them outside ASCII (so the bytes
# are never UTF-8 by accident, except for the UTF-16/32 ones json detects by itself).
NON_ASCII = st.characters(min_codepoint=0xA0, max_codepoint=0xFF)
ASCII = st.characters(min_codepoint=0x20, max_codepoint=0x7E)

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**40), max_value=2**40)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=10), children, max_size=3)
    ),
    max_leaves=8,
)


@st.composite
def foreign_text(draw, template: str) -> bytes:
    """``template`` with a non-ASCII word in it, written in another encoding."""
    word = draw(st.text(ASCII, max_size=8)) + draw(NON_ASCII) + draw(st.text(NON_ASCII, max_size=8))
    return template.replace("WORD", word).encode(draw(st.sampled_from(ENCODINGS)))


def shaped(keys: list[str]) -> st.SearchStrategy[object]:
    """Documents that put a wrong-typed value where a mapping or a field is expected."""
    return st.one_of(
        json_values,
        st.fixed_dictionaries({st_key: json_values for st_key in keys}),
        st.builds(lambda key, value: {key: value}, st.sampled_from(keys), json_values),
        st.builds(
            lambda key, name, value: {key: {name: value}},
            st.sampled_from(keys),
            st.text(min_size=1, max_size=6),
            json_values,
        ),
    )


OUTPUT_KEYS = ["jobs", "job_id", "node_count", "metrics_url", "job_log_url"]
outputs_files = st.one_of(
    st.binary(max_size=200),
    foreign_text('{"batch_account_endpoint": "e", "job_id": "WORD"}'),
    shaped(OUTPUT_KEYS).map(lambda doc: json.dumps(doc).encode()),
    st.builds(
        lambda doc: json.dumps({"batch_account_endpoint": "https://e", **doc}).encode(),
        st.fixed_dictionaries({}, optional={key: json_values for key in OUTPUT_KEYS}),
    ),
    st.sampled_from([b"", b"{", b"[" * 50_000, b"null", b"\xef\xbb\xbf{}", b"NaN"]),
)
YAML_OOPS = [
    b"",
    b"a: [",
    b"a: 2026-02-30\n",
    b"a: !!binary aGk=\n",
    b"a: !!set {x, y}\n",
    b"a: !!python/object/apply:os.system [true]\n",
    b"a: &x [*x]\n",
    b"\t- tab\n",
    b"config: ~\n",
    b"config: [1, 2]\n",
    b"config: {gpu-cluster:jobs: 7}\n",
]
stack_files = st.one_of(
    st.binary(max_size=200),
    foreign_text("config:\n  gpu-cluster:team: vision  # WORD\n"),
    foreign_text("config:\n  gpu-cluster:costCenter: WORD\n"),
    shaped(["config"]).map(lambda doc: json.dumps(doc).encode()),
    shaped(["gpu-cluster:jobs", "gpu-cluster:team", "gpu-cluster:registryAllowedIps"]).map(
        lambda doc: json.dumps({"config": doc}).encode()
    ),
    st.sampled_from(YAML_OOPS),
)
trainer_files = st.one_of(
    st.binary(max_size=200),
    foreign_text("model: resnet18  # WORD\n"),
    foreign_text("run_name: WORD\n"),
    shaped(["model", "backend", "lr", "batch_size"]).map(lambda doc: json.dumps(doc).encode()),
    st.sampled_from(YAML_OOPS),
)


@functools.cache
def _client():
    """One mocked Batch client for every example (autospec is slow to build)."""
    return create_autospec(BatchClient, instance=True)


def _exit_of(call) -> int:
    try:
        return call()
    except SystemExit as exit_:
        return exit_.code if isinstance(exit_.code, int) else 1


def _assert_one_line_or_none(code: int, err: str) -> None:
    assert code in (0, 2), (code, err)
    assert err.count("\n") <= 1 and "Traceback" not in err, err
    if code == 2:
        assert err.startswith("error: ") and err.endswith("\n"), err


def _write(tmp: Path, name: str, content: bytes) -> Path:
    path = tmp / name
    path.write_bytes(content)
    return path


@FAST
@given(content=outputs_files)
def test_job_cli_outputs_file(tmp_path_factory, capsys, content):
    """``status``: the outputs are read and checked before the (mocked) Batch client is asked."""
    path = _write(tmp_path_factory.mktemp("outputs"), "outputs.json", content)
    client = _client()
    argv = ["status", "--stack", "dev", "--outputs-file", str(path)]
    code = _exit_of(lambda: dt_jobs.main(argv, client_factory=lambda endpoint: client))
    captured = capsys.readouterr()
    _assert_one_line_or_none(code, captured.err)
    if code == 2:
        assert captured.err.startswith(f"error: outputs_file={path}: "), captured.err


@FAST
@given(content=outputs_files)
def test_plan_deployed_outputs_file(tmp_path_factory, content):
    path = _write(tmp_path_factory.mktemp("deployed"), "outputs.json", content)
    try:
        folders = plan.deployed_run_folders(path, "dev")
    except JobsError as err:
        assert str(err).startswith(f"--deployed={path}: ") and "\n" not in str(err), str(err)
        assert err.code == 2
    else:
        assert all(isinstance(v, str | None) for v in folders.values())


@FAST
@given(content=stack_files)
def test_plan_stack_file(tmp_path_factory, capsys, content):
    path = _write(tmp_path_factory.mktemp("stack"), "Pulumi.fuzz.yaml", content)
    code = _exit_of(lambda: plan.main(["--stack", "fuzz", "--stack-file", str(path)]))
    captured = capsys.readouterr()
    # Nothing generated here is a whole valid stack (no team), so nothing is evaluated.
    assert code == 2 and captured.out == ""
    _assert_one_line_or_none(code, captured.err)


@settings(FAST, max_examples=60)
@given(content=trainer_files)
def test_plan_trainer_settings_file(tmp_path_factory, capsys, content):
    """The trainer file a job points to is read while the stack's settings load; a readable
    one leaves the error to the stack's nodeCount=-1, so the program is never evaluated."""
    tmp = tmp_path_factory.mktemp("trainer")
    trainer = _write(tmp, "train.yaml", content)
    stack = tmp / "Pulumi.fuzz.yaml"
    stack.write_text(
        "config:\n  gpu-cluster:team: vision\n  gpu-cluster:nodeCount: -1\n"
        f"  gpu-cluster:trainerConfig: {json.dumps(str(trainer))}\n",
        encoding="utf-8",
    )
    code = _exit_of(lambda: plan.main(["--stack", "fuzz", "--stack-file", str(stack)]))
    captured = capsys.readouterr()
    assert code == 2 and captured.out == ""
    _assert_one_line_or_none(code, captured.err)
    assert captured.err.startswith(("error: trainerConfig=", "error: nodeCount=-1")), captured.err


STEP_KEYS = ["op", "urn", "oldState", "newState", "replaceReasons"]
JOB_STATE = {"type": "pulumi-python:dynamic:Resource", "inputs": {"trainer_args": []}}
preview_files = st.one_of(
    st.binary(max_size=200),
    foreign_text('{"steps": [{"urn": "WORD"}]}'),
    shaped(["steps"]).map(lambda doc: json.dumps(doc).encode()),
    st.lists(
        st.fixed_dictionaries(
            {"urn": st.text(max_size=6), "op": st.sampled_from(["create", "replace", "delete"])},
            optional={
                "oldState": st.just(JOB_STATE) | json_values,
                "newState": st.builds(
                    lambda extra: {**JOB_STATE, **extra},
                    st.dictionaries(st.sampled_from(["inputs", "outputs"]), json_values),
                ),
                "replaceReasons": json_values,
            },
        ),
        max_size=3,
    ).map(lambda steps: json.dumps({"steps": steps}).encode()),
    st.sampled_from([b"[" * 50_000]),
)


@FAST
@given(content=preview_files)
def test_preview_jobs_digest_file(tmp_path_factory, capsys, content):
    path = _write(tmp_path_factory.mktemp("preview"), "preview.json", content)
    code = _exit_of(lambda: preview_jobs.main(["--stack", "dev", str(path)]))
    captured = capsys.readouterr()
    _assert_one_line_or_none(code, captured.err)


@FAST
@given(text=st.text(max_size=8) | st.integers(-(10**6), 10**6).map(str))
def test_master_port_from_the_environment(text):
    try:
        port = rendezvous_port({"MASTER_PORT": text}, None)
    except LaunchError as err:
        assert str(err).startswith("MASTER_PORT=") and "\n" not in str(err)
    else:
        assert (1 <= port <= 65535 and str(port) == text.lstrip("0")) or (text == "" and port)


@FAST
@given(
    flag=st.sampled_from(["--port", "--workers-per-node"]),
    value=st.integers(max_value=0).map(str)
    | st.integers(min_value=65536).map(str)
    | st.text(ASCII, min_size=1, max_size=6).filter(lambda t: not t.strip().lstrip("-").isdigit()),
)
def test_launcher_refuses_bad_ports_and_worker_counts(monkeypatch, capsys, flag, value):
    if flag == "--workers-per-node" and value.isdigit():
        value = str(-int(value))  # every count from 1 up is valid: keep this one invalid
    env = {
        "AZ_BATCH_HOST_LIST": "127.0.0.1,127.0.0.2",
        "AZ_BATCH_MASTER_NODE": "127.0.0.1:6000",
        "AZ_BATCH_IS_CURRENT_NODE_MASTER": "false",
    }
    with monkeypatch.context() as patch:
        for key, item in env.items():
            patch.setenv(key, item)
        argv = [f"{flag}={value}", "--node-ip", "127.0.0.2", "--", "python", "-m", "trainer"]
        code = _exit_of(lambda: launcher.main(argv))
    captured = capsys.readouterr()
    assert code == 2, captured.err
    _assert_one_line_or_none(code, captured.err)


# ---------------------------------------------------------------- as a user runs them
@pytest.mark.parametrize(
    ("module", "argv", "content", "message"),
    [
        (
            "dt_commands.jobs",
            ["status", "--stack", "dev", "--outputs-file"],
            '{"job_id": "café"}'.encode("latin-1"),
            "not UTF-8 text (byte 0xe9 at offset 15)",
        ),
        (
            "dt_commands.plan",
            ["--stack", "fuzz", "--stack-file"],
            "config:\n  gpu-cluster:team: vision  # équipe\n".encode("cp1252"),
            "not UTF-8 text (byte 0xe9 at offset 38)",
        ),
    ],
)
def test_a_file_in_another_encoding_is_one_line_and_exit_2(
    tmp_path, module, argv, content, message
):
    path = _write(tmp_path, "input", content)
    result = subprocess.run(
        [sys.executable, "-m", module, *argv, str(path)],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.count("\n") == 1 and message in result.stderr, result.stderr
