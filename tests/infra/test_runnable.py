"""What a job runs must be on its nodes (infra.runnable): the image holds trainer/ alone, so a
job's script, module or plug-in comes in its code folder. docs/jobs.md's first "Your own
script" example (a repository path, no code folder) could not run on a node and was accepted;
now dt-plan refuses it in one line, exit 2, before anything exists."""

from __future__ import annotations

import pytest

from infra.config import ConfigError, job_settings
from infra.runnable import missing, what_runs
from tests.support.stacks import dt_plan_of_jobs

TORCHRUN = "examples/torchrun_ddp"


def _jobs(entry: dict) -> tuple:
    return job_settings({"jobs": {"mine": entry}, "node_count": 2}, {"jobs"})


@pytest.mark.parametrize(
    ("command", "started"),
    [
        (["python", "train.py", "--steps", "4"], ("script", "train.py")),
        (["python3", "-u", "-X", "dev", "train.py"], ("script", "train.py")),
        (["/usr/bin/python3.11", "-m", "team.train", "--x"], ("module", "team.train")),
        (["bash", "-e", "run.sh"], ("script", "run.sh")),
        (["python", "-c", "print(1)"], None),
        (["nvidia-smi"], None),
    ],
)
def test_what_a_command_starts(command, started):
    assert what_runs(command) == started


def test_the_image_holds_the_trainer_and_the_code_folder_the_rest():
    files = frozenset({"train.py", "team/__init__.py", "team/model.py", "lib/run.sh"})
    assert not missing("module", "trainer.data", None)
    assert missing("module", "team.model", None) and not missing("module", "team.model", files)
    assert not missing("module", "team", files) and missing("module", "other", files)
    assert missing("script", "train.py", None) and not missing("script", "./train.py", files)
    assert not missing("script", "lib/run.sh", files)
    assert not missing("script", "/opt/trainer/trainer/__main__.py", None)
    assert not missing("script", "${AZ_BATCH_NODE_SHARED_DIR}/x.py", None)


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        (
            {"command": f"python {TORCHRUN}/train.py --steps 40"},
            f"jobs.mine.command='python {TORCHRUN}/train.py --steps 40': its script "
            f"{TORCHRUN}/train.py is neither in the image (which holds trainer/ alone) nor in a "
            "code folder (the job has none); set jobs.mine.code",
        ),
        (
            {"command": f"python {TORCHRUN}/train.py", "code": TORCHRUN},
            f"its script {TORCHRUN}/train.py is neither in the image (which holds trainer/ "
            f"alone) nor in its code folder {TORCHRUN}",
        ),
        (
            {"command": "python -m custom_model.model", "code": TORCHRUN},
            "its module custom_model.model is neither in the image",
        ),
    ],
)
def test_a_job_that_names_what_its_nodes_lack_is_one_line(entry, message):
    with pytest.raises(ConfigError) as refused:
        _jobs(entry)
    assert message in str(refused.value) and "\n" not in str(refused.value)


@pytest.mark.parametrize(
    "entry",
    [
        {"command": "python train.py --steps 40", "code": TORCHRUN},
        {"command": "python -m custom_model.model", "code": "examples"},
        {"command": "python -m trainer --help"},
        {"trainerConfig": "trainer/presets/demo.yaml"},
    ],
)
def test_a_job_whose_nodes_hold_what_it_runs_is_accepted(entry):
    (job,) = _jobs(entry)
    assert job.name == "mine"


def test_docs_first_example_stops_dt_plan_in_one_line_exit_2(tmp_path):
    result = dt_plan_of_jobs(tmp_path, f"      command: python {TORCHRUN}/train.py --steps 40\n")
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith(f"error: jobs.mine.command='python {TORCHRUN}/train.py")
    assert result.stderr.count("\n") == 1 and result.stdout == ""
