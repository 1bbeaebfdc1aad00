"""The job's trainer settings cross as data: the flags come from the validated settings, read back
by the trainer as those settings; the job-set keys appear once; the trainer's and the launcher's
commands are rendered from the settings, never read back from flags; and every flag a stack
rendered before stays byte-identical (job ids and run folders hash them)."""

from __future__ import annotations

from pathlib import Path

import pytest

from infra.batch import launch_command, trainer_command
from infra.job_spec import JobSpec
from infra.trainer_command import DEFAULT_BACKEND, JOB_SET, JobTrainer, trainer_flags
from infra.trainer_settings import TrainerSettings, job_settings
from trainer.settings.flags import parse, to_flags

PRESETS = sorted((Path(__file__).resolve().parents[2] / "trainer" / "presets").glob("*.yaml"))


def _settings(tmp_path: Path, text: str) -> TrainerSettings:
    (tmp_path / "t.yaml").write_text(text, encoding="utf-8")
    return TrainerSettings.read("t.yaml", tmp_path)


def _spec(settings: JobTrainer, dataset_prefix: str = "") -> JobSpec:
    return JobSpec(
        stack="dev",
        endpoint="https://b.eastus.batch.azure.com",
        account_id="/subscriptions/s/batchAccounts/b",
        pool_id="ib-gpu",
        node_count=2,
        vm_size="Standard_ND96isr_H100_v5",
        image_ref="acr.example/trainer:1@sha256:" + "a" * 64,
        registry_server="acr.example",
        node_identity_id="/identities/n",
        node_identity_client_id="client",
        blob_endpoint="https://data.example/",
        trainer_args=trainer_flags(settings),
        dataset_prefix=dataset_prefix,
        trainer_settings=settings,
    )


def _before(settings: TrainerSettings, staged: bool) -> tuple[str, ...]:
    """The flags this project rendered before the settings crossed once: the file's raw values
    less output_dir (and data, data_dir when staged) and the default engine."""
    owned = ("output_dir", *(("data", "data_dir") if staged else ()))
    kept = {
        key: value
        for key, value in settings.values.items()
        if key not in owned and not (key == "backend" and value == DEFAULT_BACKEND)
    }
    return tuple(to_flags(kept))


@pytest.mark.parametrize("preset", PRESETS, ids=lambda path: path.name)
@pytest.mark.parametrize("staged", [False, True])
def test_every_presets_flags_are_byte_identical_to_what_stacks_rendered_before(preset, staged):
    settings = TrainerSettings.read(preset.name, preset.parent)
    prefix = "imagenet" if staged else ""
    assert trainer_flags(job_settings(settings, prefix)) == _before(settings, staged)


@pytest.mark.parametrize(
    ("text", "flags"),
    [
        # Spellings the trainer reads back as the validated value stay as the file wrote them.
        ("model: tiny\nlr: 1e-3\n", ("--model", "tiny", "--lr", "1e-3")),
        ("model: tiny\nlr: 1\n", ("--model", "tiny", "--lr", "1")),
        ("lr_step_epochs: [30, 60]\n", ("--lr-step-epochs", "30,60")),
        # A boolean the trainer reads as false was a true flag before (a non-empty string).
        ("model: tiny\nfp16_allreduce: 'off'\n", ("--model", "tiny", "--no-fp16-allreduce")),
        # CLI spelling of a key: the trainer accepts it, and so do the job's flags now.
        ("batch-size: 8\n", ("--batch-size", "8")),
    ],
)
def test_the_flags_are_the_validated_settings_in_the_files_spelling(tmp_path, text, flags):
    settings = _settings(tmp_path, text)
    assert trainer_flags(job_settings(settings)) == flags
    read_back = parse(list(flags)).config
    for key in settings.values:
        name = key.replace("-", "_")
        assert getattr(read_back, name) == getattr(settings.config, name)


def test_job_set_keys_of_the_file_are_left_out_and_the_command_names_each_setting_once(
    tmp_path,
):
    text = (
        "model: tiny\noutput_dir: /mine\nmetrics_upload_url: https://a.blob.core.windows.net/logs/x/\n"
        "outputs_url: https://a.blob.core.windows.net/outputs/y/\nbackend: ddp\n"
        "checkpoint_mirror_url: https://a.blob.core.windows.net/checkpoints/z/\n"
    )
    settings = _settings(tmp_path, text)
    own = job_settings(settings)
    assert trainer_flags(own) == ("--model", "tiny", "--backend", "ddp")
    assert set(JOB_SET) == {
        "output_dir", "metrics_upload_url", "outputs_url", "checkpoint_mirror_url"
    }  # fmt: skip
    spec = _spec(own)
    command = trainer_command(spec)
    named = [word for word in command if word.startswith("--")]
    assert len(named) == len(set(named)), named  # one mapping: no setting twice
    config = parse(command[3:]).config
    assert config.output_dir.endswith(f"/runs/dev/{spec.run_name}")
    assert (config.metrics_upload_url, config.outputs_url) == (spec.metrics_url, spec.outputs_url)
    # The checkpoints container, under the run folder's path: a rerun of the same settings
    # (another job id) resumes from the same mirror.
    assert config.checkpoint_mirror_url == (
        f"{spec.blob_endpoint.rstrip('/')}/checkpoints/dev/{spec.run_name}/"
    )
    assert config.backend == "ddp"


@pytest.mark.parametrize(("own", "engine"), [((), "horovod"), ((("backend", "fsdp"),), "fsdp")])
def test_the_launcher_is_told_the_trainers_engine_and_run_folder(own, engine):
    spec = _spec((("model", "tiny"), *own), dataset_prefix="imagenet")
    launch = launch_command(spec, "--report")
    split = launch.index("--")
    launcher, trainer = launch[:split], launch[split + 1 :]
    config = parse(trainer[3:]).config
    assert config.backend == engine and config.data == "shards"
    given = dict(zip(launcher[5::2], launcher[6::2], strict=False))
    assert given["--backend"] == engine and given["--run-dir"] == config.output_dir


def test_the_settings_as_data_are_not_the_jobs_identity_and_must_render_its_flags():
    """A job whose state predates its settings as data is the same job (its id and run folder
    hash only its flags); its commands are never read back from those flags."""
    own = (("model", "tiny"), ("backend", "ddp"), ("fp16_allreduce", False))
    spec = _spec(own)
    assert spec.trainer_args == ("--model", "tiny", "--backend", "ddp", "--no-fp16-allreduce")
    from dataclasses import replace

    older = replace(spec, trainer_settings=())
    assert (older.job_id, older.run_name) == (spec.job_id, spec.run_name)
    with pytest.raises(ValueError, match="run `pulumi up` with this version"):
        trainer_command(older)
    assert trainer_command(spec)[3:8] == list(spec.trainer_args)
