import subprocess
import sys

from tests.infra.conftest import REPO


def plan(*args, cwd=REPO):
    return subprocess.run(
        [sys.executable, "-m", "infra.tools.plan", *args],
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
