"""What a job runs must be on its nodes (infra.runnable): the image holds trainer/ alone, so a
job's script, module or plug-in comes in its code folder. docs/jobs.md's first "Your own
script" example (a repository path, no code folder) could not run on a node and was accepted;
now dt-plan refuses it in one line, exit 2, before anything exists."""

from __future__ import annotations

import pytest

from infra.runnable import missing, what_runs
from infra.settings.checks import ConfigError
from infra.settings.jobs import job_settings
from tests.support.stacks import REPO, dt_plan_of_jobs

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
        (["bash", "-o", "pipefail", "run.sh"], ("script", "run.sh")),
        (["bash", "-c", "python train.py"], None),
        (["sh", "-ec", "make all"], None),
        (["python", "-c", "print(1)"], None),
        (["nvidia-smi"], None),
    ],
)
def test_what_a_command_starts(command, started):
    assert what_runs(command) == started


def test_the_image_holds_the_trainer_and_the_code_folder_the_rest():
    files = frozenset({"train.py", "team/__init__.py", "team/model.py", "lib/run.sh"})
    repo = frozenset({"trainer", "examples", "team"})
    assert not missing("module", "trainer.data", None, repo)
    assert missing("module", "team.model", None, repo)
    assert not missing("module", "team.model", files, repo)
    assert not missing("module", "team", files, repo) and missing(
        "module", "examples.x", files, repo
    )
    # Another package's module (torch's, or one requirements.txt installs) is taken as there.
    assert not missing("module", "torch.distributed.run", None, repo)
    assert missing("script", "train.py", None, repo)
    assert not missing("script", "./train.py", files, repo)
    assert not missing("script", "lib/run.sh", files, repo)
    assert not missing("script", "/opt/trainer/trainer/__main__.py", None, repo)
    assert not missing("script", "${AZ_BATCH_NODE_SHARED_DIR}/x.py", None, repo)


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
            {"command": "python -m examples.custom_model.model", "code": TORCHRUN},
            "its module examples.custom_model.model is neither in the image",
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
        {"command": "python -m torch.distributed.run --nproc-per-node 8 -m trainer"},
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


def test_a_trainer_jobs_plugin_from_the_repository_needs_the_code_folder_holding_it():
    from types import SimpleNamespace

    from infra.code_snapshot import snapshot
    from infra.settings.jobs import JobSettings, _check_runnable

    settings = {"model": "examples.custom_model.model:build", "data": "synthetic"}
    trainer = SimpleNamespace(config=SimpleNamespace(loss="", metric="", **settings))
    job = JobSettings("mine", trainer, 1)  # type: ignore[arg-type]
    with pytest.raises(ConfigError) as refused:
        _check_runnable(job)
    assert str(refused.value).startswith(
        "jobs.mine: trainerConfig's model=examples.custom_model.model:build: the module is "
        "neither in the image (which holds trainer/ alone) nor in a code folder"
    )
    # With examples/ as the code folder, its files are top-level on the node: the plug-in is
    # custom_model.model there, and examples.custom_model.model is still refused...
    with_examples = JobSettings("mine", trainer, 1, code=snapshot("examples", REPO))  # type: ignore[arg-type]
    with pytest.raises(ConfigError):
        _check_runnable(with_examples)
    # ...while the name it has on the node is taken.
    trainer.config.model = "custom_model.model:build"
    _check_runnable(with_examples)
