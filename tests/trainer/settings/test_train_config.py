import pytest

from trainer.common.errors import ConfigError
from trainer.settings.train_config import DEFAULTS, FIELD_NAMES, TrainConfig


def test_defaults_are_valid_and_round_trip():
    assert TrainConfig.from_mapping(DEFAULTS.to_dict()) == DEFAULTS


def test_kebab_case_keys_and_string_values_are_coerced():
    cfg = TrainConfig.from_mapping(
        {"batch-size": "64", "lr": "0.2", "compile": "true", "lr-step-epochs": "10,20"}
    )
    assert (cfg.batch_size, cfg.lr, cfg.compile, cfg.lr_step_epochs) == (64, 0.2, True, (10, 20))


INVALID = [
    ({"model": "resnet9"}, "model='resnet9'", "resnet50"),
    ({"num_classes": 1}, "num_classes=1", "2.."),
    ({"data": "tfrecord"}, "data='tfrecord'", "synthetic"),
    ({"data": "folder"}, "data_dir=None", "--data-dir"),
    ({"data": "shards"}, "data_dir=None", "manifest.json"),
    ({"cache": "disk", "data": "folder", "data_dir": "d"}, "cache='disk'", "decoded"),
    ({"cache": "bytes"}, "cache=bytes", "synthetic data is already in memory"),
    (
        {"cache": "decoded", "cache_scope": "job", "data": "folder", "data_dir": "d"},
        "cache_scope='job'",
        "node, rank",
    ),
    ({"cache_scope": "gpu"}, "cache_scope='gpu'", "node, rank"),
    ({"shuffle_buffer": 0}, "shuffle_buffer=0", "1.."),
    ({"on_bad_image": "ignore"}, "on_bad_image='ignore'", "fail, skip"),
    ({"preflight_min_busbw": -1}, "preflight_min_busbw=-1", "[0, 100000]"),
    ({"image_size": 8}, "image_size=8", "16..1024"),
    ({"batch_size": 0}, "batch_size=0", "1..65536"),
    ({"batch_size": "x"}, "batch_size='x'", "an integer"),
    ({"batch_size": 2.5}, "batch_size=2.5", "int"),
    ({"epochs": True}, "epochs=True", "int"),
    ({"max_steps": 0}, "max_steps=0", "1.."),
    ({"run_steps": -1}, "run_steps=-1", "1.."),
    ({"lr": 0}, "lr=0", "(0, 1000]"),
    ({"lr": "fast"}, "lr='fast'", "a number"),
    ({"optimizer": "rmsprop"}, "optimizer='rmsprop'", "lars"),
    ({"momentum": 1.0}, "momentum=1", "[0, 1)"),
    ({"weight_decay": -0.1}, "weight_decay=-0.1", "[0, 1]"),
    ({"lr_scaling": "cubic"}, "lr_scaling='cubic'", "linear"),
    ({"warmup_epochs": 100}, "warmup_epochs=100", "[0, 90]"),
    ({"lr_decay": "exp"}, "lr_decay='exp'", "cosine"),
    ({"lr_step_epochs": "60,30"}, "lr_step_epochs=[60, 30]", "increasing"),
    ({"lr_step_epochs": "a,b"}, "lr_step_epochs='a,b'", "integers"),
    ({"label_smoothing": 1.0}, "label_smoothing=1", "[0, 1)"),
    ({"backend": "mpi"}, "backend='mpi'", "horovod"),
    ({"adasum": True}, "adasum: was removed", "needs an MPI build of Horovod"),
    ({"backend": "local", "fp16_allreduce": True}, "fp16_allreduce=true", "horovod or ddp"),
    ({"accumulation_steps": 0}, "accumulation_steps=0", "1..1024"),
    ({"model": "gpt-tiny", "data": "folder", "data_dir": "d"}, "data=folder", "--data tokens"),
    ({"data": "tokens", "data_dir": "d"}, "data=tokens: resnet50", "gpt-tiny"),
    ({"model": "gpt-tiny", "data": "tokens"}, "data_dir=None", "prepare-text"),
    ({"model": "gpt-tiny", "context": 129}, "context=129", "1..128"),
    ({"context": 64}, "context=64", "only language models"),
    ({"model": "gpt-tiny", "vocab_size": 1}, "vocab_size=1", "2..1000000"),
    (
        {"model": "gpt-tiny", "data": "tokens", "data_dir": "d", "cache": "bytes"},
        "cache=bytes",
        "--cache none",
    ),
    ({"noise_scale_every": -1}, "noise_scale_every=-1", "0.."),
    ({"noise_scale_every": 5, "backend": "fsdp"}, "backend=fsdp", "horovod or ddp"),
    ({"noise_scale_every": 5, "amp": "fp16"}, "amp=fp16", "bf16 or off"),
    ({"checkpoint_async": "later"}, "checkpoint_async='later'", "true or false"),
    ({"shard_within": "rack"}, "shard_within='rack'", "world, node"),
    ({"grad_clip_norm": -1}, "grad_clip_norm=-1", "[0, 1e+06]"),
    ({"activation_checkpointing": "sometimes"}, "activation_checkpointing='sometimes'", "true"),
    ({"horovod_cycle_time_ms": -1}, "horovod_cycle_time_ms=-1", "[0, 1000]"),
    ({"horovod_fusion_mb": 5000}, "horovod_fusion_mb=5000", "0..4096"),
    ({"device": "tpu"}, "device='tpu'", "cuda"),
    ({"amp": "fp8"}, "amp='fp8'", "bf16"),
    ({"channels_last": "maybe"}, "channels_last='maybe'", "auto"),
    ({"cpu_affinity": "always"}, "cpu_affinity='always'", "auto, on, off"),
    ({"compile": "perhaps"}, "compile='perhaps'", "true or false"),
    ({"output_dir": ""}, "output_dir=''", "folder"),
    ({"keep_checkpoints": 0}, "keep_checkpoints=0", "1..1000"),
    ({"log_every": 0}, "log_every=0", "1.."),
    ({"seed": -1}, "seed=-1", "0.."),
    ({"epochs": None}, "epochs=null", "required"),
    (
        {"metrics_upload_url": "http://acct.blob.core.windows.net/logs/j/live/"},
        "metrics_upload_url='http://acct.blob.core.windows.net/logs/j/live/'",
        "https://<account>.blob.core.windows.net/logs/<job-id>/live/",
    ),
    (
        {"metrics_upload_url": "https://acct.blob.core.windows.net/logs/j/?sv=2024&sig=x"},
        "metrics_upload_url=",
        "no SAS token",
    ),
    ({"metrics_upload_minutes": 0}, "metrics_upload_minutes=0", "[0.01, 1440]"),
    (
        {"outputs_url": "https://acct.blob.core.windows.net/Outputs/j/"},
        "outputs_url='https://acct.blob.core.windows.net/Outputs/j/'",
        "not a valid container name",
    ),
    ({"metrics_upload_minutes": "often"}, "metrics_upload_minutes='often'", "a number"),
    (
        {"checkpoint_mirror_url": "https://acct.blob.core.windows.net/ckpt/j/?sv=x"},
        "checkpoint_mirror_url='https://acct.blob.core.windows.net/ckpt/j/?sv=x'",
        "no SAS token",
    ),
    ({"checkpoint_mirror_keep": 0}, "checkpoint_mirror_keep=0", "1..1000"),
    ({"straggler_every": -1}, "straggler_every=-1", "must be in 0..1000000000"),
    ({"straggler_margin": 0}, "straggler_margin=0", "[0.05, 100]"),
    ({"straggler_margin": "lots"}, "straggler_margin='lots'", "a number"),
    ({"gpu_telemetry_seconds": 0.01}, "gpu_telemetry_seconds=0.01", "0 (off) or"),
    ({"gpu_telemetry_seconds": "often"}, "gpu_telemetry_seconds='often'", "a number"),
    ({"step_timeout_minutes": 0.01}, "step_timeout_minutes=0.01", "0 (derived from"),
    ({"step_timeout_minutes": -5}, "step_timeout_minutes=-5", "[0.05, 10080]"),
    ({"step_timeout_minutes": "soon"}, "step_timeout_minutes='soon'", "a number"),
    ({"profile_steps": "25-20"}, "profile_steps='25-20'", "0 < A <= B"),
    ({"debug_rank": -1}, "debug_rank=-1", "0.."),
    ({"debug_port": 80}, "debug_port=80", "1024..65535"),
    ({"batchsize": 32}, "unknown setting 'batchsize'", "batch_size"),
    # A team's plug-ins (trainer.training.plugins) and the weights a run starts from
    # (trainer.checkpoints.init_from).
    ({"model": "my model:build"}, "model='my model:build'", "pkg.module:function"),
    ({"data": "pkg.data:"}, "data='pkg.data:'", "pkg.module:function"),
    ({"loss": "losses.focal"}, "loss='losses.focal'", "pkg.module:function"),
    ({"metric": "m:1x"}, "metric='m:1x'", "pkg.module:function"),
    ({"model": "gpt-tiny", "loss": "a.b:c"}, "loss=a.b:c", "next-token cross-entropy"),
    ({"model_args": {"width": 3}}, "model_args={'width': 3}", "only a plug-in model"),
    ({"model_args": "[1, 2]"}, "model_args='[1, 2]'", "a mapping like"),
    ({"model_args": "{width: [1"}, "model_args='{width: [1'", "not valid YAML"),
    ({"data_args": {"size": 3}}, "data_args={'size': 3}", "only a plug-in data"),
    (
        {"data": "a.b:c", "cache": "bytes"},
        "cache=bytes",
        "a plug-in dataset keeps what it likes in memory itself",
    ),
    ({"init_from": "s3://bucket/w.pt"}, "init_from='s3://bucket/w.pt'", "https:// blob"),
    (
        {"init_from": "https://acct.blob.core.windows.net/weights"},
        "init_from='https://acct.blob.core.windows.net/weights'",
        "names a container, not a blob",
    ),
    ({"init_strict": "mostly"}, "init_strict='mostly'", "true or false"),
]


def test_plugins_and_their_arguments_from_flags_and_yaml():
    from_flags = TrainConfig.from_mapping(
        {"model": "pkg.models:build", "model-args": "{width: 32, act: gelu}", "data": "d.e:f"}
    )
    from_yaml = TrainConfig.from_mapping(
        {"model": "pkg.models:build", "model_args": {"width": 32, "act": "gelu"}, "data": "d.e:f"}
    )
    assert from_flags == from_yaml
    assert from_flags.model_args == {"width": 32, "act": "gelu"}
    assert from_flags.plugin_data and not from_flags.language_model
    assert TrainConfig.from_mapping(from_flags.to_dict()) == from_flags


@pytest.mark.parametrize(("values", "names", "fix"), INVALID)
def test_every_invalid_value_names_setting_value_and_fix(values, names, fix):
    with pytest.raises(ConfigError) as caught:
        TrainConfig.from_mapping(values)
    message = str(caught.value)
    assert names in message
    assert fix in message
    assert "\n" not in message


def test_every_setting_has_an_invalid_case_or_is_free_text():
    covered = {key.replace("-", "_") for values, _, _ in INVALID for key in values}
    free_text = {
        "data_dir",
        "synthetic_size",
        "synthetic_pool",
        "loader_workers",
        "compile",
        "lars_trust_coefficient",
        "lr_step_factor",
        "lr_poly_power",
        "checkpoint_every",
    }
    assert set(FIELD_NAMES) - covered <= free_text


def test_direct_construction_validates_too():
    with pytest.raises(ConfigError, match="batch_size=0"):
        DEFAULTS.replace(batch_size=0)


def test_live_upload_is_off_by_default_and_takes_fractional_minutes():
    assert (DEFAULTS.metrics_upload_url, DEFAULTS.metrics_upload_minutes) == ("", 5.0)
    cfg = TrainConfig.from_mapping(
        {
            "metrics-upload-url": "https://acct.blob.core.windows.net/logs/dev-1a2b/live/",
            "metrics-upload-minutes": "0.5",
        }
    )
    assert cfg.metrics_upload_minutes == 0.5


def test_a_config_with_plugin_arguments_stays_hashable():
    values = {"model": "pkg.models:build", "model_args": {"widths": [32, 64], "act": "gelu"}}
    same = {"model": "pkg.models:build", "model_args": {"act": "gelu", "widths": [32, 64]}}
    assert hash(TrainConfig.from_mapping(values)) == hash(TrainConfig.from_mapping(same))
    assert len({DEFAULTS, TrainConfig.from_mapping(values)}) == 2
