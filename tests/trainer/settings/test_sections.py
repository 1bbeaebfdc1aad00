"""The trainer's settings by section: each section declares its fields with their help and
checks them itself; ``TrainConfig`` is every section, flat, in a fixed order."""

import dataclasses

import pytest

from trainer.common.errors import ConfigError
from trainer.settings.declare import help_of
from trainer.settings.sections.data import DataSettings
from trainer.settings.sections.engine import EngineSettings
from trainer.settings.sections.model import ModelSettings
from trainer.settings.sections.outputs import OutputSettings, UploadSettings
from trainer.settings.sections.schedule import ScheduleSettings
from trainer.settings.sections.watch import DiagnosisSettings, WatchSettings
from trainer.settings.train_config import FIELD_NAMES, TrainConfig

# In the order their fields come in TrainConfig (flags, run-folder hashes and YAML files follow it).
SECTIONS = (
    ModelSettings,
    DataSettings,
    ScheduleSettings,
    EngineSettings,
    OutputSettings,
    DiagnosisSettings,
    UploadSettings,
    WatchSettings,
)
# The released order of the flat settings: a run folder's name hashes the flags in this order.
RELEASED_ORDER = (
    "model model_args num_classes loss metric init_from init_strict context vocab_size data "
    "data_args data_dir image_size batch_size synthetic_size synthetic_pool loader_workers "
    "cache cache_scope shuffle_buffer on_bad_image epochs max_steps run_steps lr optimizer "
    "momentum weight_decay lars_trust_coefficient lr_scaling warmup_epochs lr_decay "
    "lr_step_epochs lr_step_factor lr_poly_power label_smoothing backend fp16_allreduce "
    "horovod_cycle_time_ms horovod_fusion_mb shard_within accumulation_steps "
    "noise_scale_every grad_clip_norm activation_checkpointing device cpu_affinity amp "
    "channels_last compile output_dir checkpoint_every checkpoint_async keep_checkpoints "
    "log_every seed profile_steps debug_rank debug_port preflight_min_busbw "
    "metrics_upload_url metrics_upload_minutes outputs_url checkpoint_mirror_url "
    "checkpoint_mirror_keep straggler_every straggler_margin gpu_telemetry_seconds "
    "step_timeout_minutes"
)


def test_the_flat_settings_are_the_sections_fields_in_the_released_order():
    from_sections = [f.name for section in SECTIONS for f in dataclasses.fields(section)]
    assert from_sections == list(FIELD_NAMES)
    assert " ".join(FIELD_NAMES) == RELEASED_ORDER


def test_every_field_carries_its_help_beside_it():
    missing = [f.name for f in dataclasses.fields(TrainConfig) if not help_of(f).strip()]
    assert missing == []


@pytest.mark.parametrize(
    ("section", "check", "changes", "expected"),
    [
        (ModelSettings, "check_model", {"num_classes": 1}, "num_classes=1"),
        (DataSettings, "check_data", {"data": "folder"}, "--data folder needs --data-dir"),
        (ScheduleSettings, "check_schedule", {"warmup_epochs": 100.0}, "warmup_epochs=100"),
        (EngineSettings, "check_engine", {"backend": "mpi"}, "backend='mpi'"),
        (OutputSettings, "check_outputs", {"seed": -1}, "seed=-1"),
        (DiagnosisSettings, "check_diagnosis", {"debug_port": 80}, "debug_port=80"),
        (UploadSettings, "check_uploads", {"checkpoint_mirror_keep": 0}, "checkpoint_mirror_keep"),
        (WatchSettings, "check_watch", {"gpu_telemetry_seconds": 0.01}, "gpu_telemetry_seconds"),
    ],
)
def test_each_section_checks_its_own_fields(section, check, changes, expected):
    getattr(section(), check)()  # its defaults pass on their own
    with pytest.raises(ConfigError, match=expected):
        getattr(section(**changes), check)()
    with pytest.raises(ConfigError, match=expected):
        TrainConfig(**changes)


def test_the_rules_across_sections_are_the_configs():
    ModelSettings(model="gpt-small").check_model()
    DataSettings(data="folder", data_dir="d").check_data()
    with pytest.raises(ConfigError, match="trains on --data tokens"):
        TrainConfig(model="gpt-small", data="folder", data_dir="d")
    # Named before the folder that data would need: the fix is another model or source.
    with pytest.raises(ConfigError, match="data=tokens: resnet50 classifies images"):
        TrainConfig(data="tokens")
