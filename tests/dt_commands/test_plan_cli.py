import subprocess
import sys

import pytest

from tests.support.stacks import REPO


def plan(*args, cwd=REPO):
    return subprocess.run(
        [sys.executable, "-m", "dt_commands.plan", *args],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=cwd,
    )


def test_dev_plan_lists_resources_outputs_and_cost():
    result = plan("--stack", "dev")
    assert result.returncode == 0, result.stderr
    assert "+ azure-native:batch:Pool  platform-dev-pool" in result.stdout
    assert "(protected)" in result.stdout
    assert 'pool_id: "ib-gpu"' in result.stdout
    assert "OFFLINE ESTIMATE" in result.stdout
    assert "2 x Standard_ND96isr_H100_v5, 160 h" in result.stdout


def test_bad_stack_config_is_one_line_and_exit_2(tmp_path):
    stack_file = tmp_path / "Pulumi.bad.yaml"
    stack_file.write_text(
        "config:\n  gpu-cluster:team: vision\n  gpu-cluster:vmSize: Standard_NC24rs_v3\n"
    )
    result = plan("--stack", "bad", "--stack-file", str(stack_file))
    assert result.returncode == 2
    assert result.stderr.strip() == (
        "error: vmSize=Standard_NC24rs_v3: NCv3 (V100) was retired on 2025-09-30; use one of "
        "Standard_ND96isr_H100_v5, Standard_ND96isr_H200_v5, Standard_ND96asr_v4, "
        "Standard_ND96amsr_A100_v4"
    )
    assert result.stdout == ""


def test_missing_stack_file_is_a_clear_error():
    result = plan("--stack", "nosuchteam")
    assert result.returncode == 2
    assert "Pulumi.nosuchteam.yaml not found" in result.stderr


def test_acr_builder_outside_a_git_checkout_is_one_line_and_exit_2(monkeypatch):
    monkeypatch.setenv("GIT_DIR", "/nonexistent")  # git finds no repository
    result = plan("--stack", "dev")
    assert result.returncode == 2
    assert result.stderr == (
        "error: imageBuilder=acr: builds a git commit, but this folder is not a git checkout; "
        "run from a clone or use imageBuilder docker\n"
    )
    assert result.stdout == ""


def _main(capsys, *argv):
    from dt_commands.plan import main

    try:
        code = main(list(argv))
    except SystemExit as exit_:
        code = exit_.code
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (
            "config:\n  gpu-cluster:team: vision  # équipe\n".encode("latin-1"),
            "not UTF-8 text (byte 0xe9 at offset 38); save it as UTF-8",
        ),
        ("config:\n  gpu-cluster:team: vision\n".encode("utf-16"), "not UTF-8 text (byte 0xff"),
        (bytes(range(256)), "not UTF-8 text (byte 0x80 at offset 128)"),
        (b"config: [1, 2]\n", "`config:` must be a mapping"),
        (b"- a\n- b\n", "`config:` must be a mapping"),
        (b"config:\n", "`config:` must be a mapping"),
        (b"config: {a: [\n", "not valid YAML (line 2)"),
        (b"config: {gpu-cluster:team: 2026-02-30}\n", "not valid YAML (day is out of range"),
    ],
)
def test_a_stack_file_of_the_wrong_kind_is_one_line_naming_it(tmp_path, capsys, content, message):
    path = tmp_path / "Pulumi.bad.yaml"
    path.write_bytes(content)
    code, out, err = _main(capsys, "--stack", "bad", "--stack-file", str(path))
    assert (code, out) == (2, "")
    assert err.startswith("error: stack file ") and "Pulumi.bad.yaml" in err, err
    assert message in err and err.count("\n") == 1, err


def test_a_trainer_file_in_latin1_stops_the_plan_in_one_line(tmp_path, capsys):
    trainer = tmp_path / "train.yaml"
    trainer.write_bytes("model: resnet18  # café\n".encode("latin-1"))
    stack = tmp_path / "Pulumi.bad.yaml"
    stack.write_text(
        f"config:\n  gpu-cluster:team: vision\n  gpu-cluster:trainerConfig: {trainer}\n"
    )
    code, out, err = _main(capsys, "--stack", "bad", "--stack-file", str(stack))
    assert (code, out) == (2, "")
    assert err == (
        f"error: trainerConfig={trainer}: not UTF-8 text (byte 0xe9 at offset 22); save it as "
        "UTF-8 (for example iconv -f latin1 -t utf-8)\n"
    )


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"null", "the outputs must be a JSON object (of `pulumi stack output --json`), got null"),
        (b'{"jobs": [1]}', "output jobs must map job names to objects, got a list"),
        (b'{"jobs": {"a": {"job_id": "j", "job_checkpoint_path": 3}}}', "must be a string"),
        ('{"job_id": "é"}'.encode("cp1252"), "not UTF-8 text (byte 0xe9 at offset 12)"),
    ],
)
def test_a_deployed_outputs_file_of_the_wrong_kind_is_one_line_naming_it(
    tmp_path, content, message
):
    from dt_commands.plan import deployed_run_folders
    from dt_commands.stack_outputs import JobsError

    path = tmp_path / "deployed.json"
    path.write_bytes(content)
    with pytest.raises(JobsError) as refused:
        deployed_run_folders(path, "dev")
    assert str(refused.value).startswith(f"--deployed={path}: ") and refused.value.code == 2
    assert message in str(refused.value)


def test_a_spot_stack_plans_its_quota_and_its_cost_as_spot(tmp_path):
    """Spot nodes count against the account's low-priority core quota, and their rate is at
    most pay-as-you-go (Azure/Batch #196; azure-ai-docs PR #791; read 2026-11-28)."""
    stack_file = tmp_path / "Pulumi.spot.yaml"
    values = (REPO / "Pulumi.dev.yaml").read_text()
    stack_file.write_text(values + "  gpu-cluster:spot: true\n")
    result = plan("--stack", "spot", "--stack-file", str(stack_file))
    assert result.returncode == 0, result.stderr
    assert "  Spot (low-priority) cores, any family: 2 nodes x 96 vCPUs = 192" in result.stdout
    assert "--query '{spot: lowPriorityCoreQuota}'" in result.stdout
    assert "2 x Standard_ND96isr_H100_v5 Spot (at most; the rate varies), 160 h" in result.stdout
    assert "dedicated cores" not in result.stdout


def test_a_later_plan_in_the_same_process_leaves_an_earlier_plans_options_alone():
    """The runtime keeps each plan's stack transformation for the process; a later plan's
    resources of the same names (here a job that also waits for a workspace) are not the
    earlier plan's. Once recorded into it, depending on which test ran first."""
    from dt_commands.plan import evaluate
    from tests.support.stacks import stack_values

    first = evaluate("dev", stack_values("dev"))
    recorded = (dict(first.depends_on), dict(first.options), [r.protect for r in first.resources])
    later = evaluate("dev", {**stack_values("dev"), "gpu-cluster:azuremlWorkspace": True})
    assert later.depends_on["platform-dev-job"] != first.depends_on["platform-dev-job"]
    assert (first.depends_on, first.options, [r.protect for r in first.resources]) == recorded
