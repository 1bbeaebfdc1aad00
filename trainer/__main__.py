"""``dt-train`` (``python -m trainer``): parse, validate, then train on the chosen backend."""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from trainer.common.cli import fail
from trainer.common.errors import ConfigError
from trainer.settings.flags import parse
from trainer.settings.train_config import TrainConfig

if TYPE_CHECKING:  # torch-importing modules, loaded only once a run starts
    from trainer.engines.base import Dist
    from trainer.training.plugins import Plugins
    from trainer.training.result import RunResult


def main(argv: list[str] | None = None) -> int:
    try:
        request = parse(argv)
    except ConfigError as err:
        fail(str(err), 2)
    # The helpers import torch only once the settings are valid: --help and a bad setting
    # answer at once instead of after torch's import (about 3 s on a small machine).
    plugins, parameters = _plugins(request.config)
    if request.dry_run:
        return _dry_run(request.config, parameters)
    result, dist = _train(request.config, plugins)
    if result.results is not None and request.config.outputs_url:
        _upload_results(result.results, request.config.outputs_url)
    if dist.is_root:
        _report(result, request.config, dist.size)
    if not dist.teardown_safe:
        from trainer.engines.base import exit_without_teardown

        exit_without_teardown(0)
    return 0


def _plugins(cfg: TrainConfig) -> tuple[Plugins, int | None]:
    """A team's plug-ins, imported and checked on one sample before any engine starts (and the
    parameters of the model that checked them); a bad one stops with one line, exit 2."""
    from trainer.training.plugins import load

    try:
        return load(cfg)
    except ConfigError as err:
        fail(str(err), 2)


def _dry_run(cfg: TrainConfig, parameters: int | None) -> int:
    """Build the model on the meta device or the CPU and count its parameters."""
    from trainer.data.text_prepare import BYTE_VOCAB
    from trainer.models.build import build_model, count_parameters

    if parameters is not None:  # the plug-ins' check built it
        print(
            f"config ok: {cfg.model} has {parameters:,} parameters; plug-ins checked on one "
            f"sample of data={cfg.data}"
        )
        return 0
    if cfg.language_model:
        # The vocabulary of --data tokens is in its manifest, read when training starts.
        vocab = cfg.vocab_size or BYTE_VOCAB
        outputs = f"a {vocab}-token vocabulary"
        params = count_parameters(build_model(cfg.model, vocab, device="meta"))
    else:
        outputs = f"{cfg.num_classes} classes"
        params = count_parameters(build_model(cfg.model, cfg.num_classes))
    print(f"config ok: {cfg.model} with {outputs} has {params:,} parameters")
    return 0


def _start_engine(cfg: TrainConfig) -> Dist:
    """This worker's engine, started, and its log lines named after its rank."""
    from trainer.engines.choose import init_dist

    try:
        dist = init_dist(cfg)
    except (RuntimeError, ValueError) as err:
        fail(f"backend={cfg.backend}: cannot start ({err})", 2)
    logging.basicConfig(
        level=logging.WARNING if dist.rank else logging.INFO,
        format=f"[rank {dist.rank}] %(levelname)s %(message)s",
    )
    return dist


def _train(cfg: TrainConfig, plugins: Plugins) -> tuple[RunResult, Dist]:
    """Start this worker's engine and train; every failure ends in one line (common.cli.fail)."""
    # Imported here so --dry-run never waits for torch.distributed.
    from trainer.checkpoints.checkpointer import CheckpointError
    from trainer.checkpoints.init_from import InitError
    from trainer.common.files import OutputError
    from trainer.data import DataError
    from trainer.engines.base import is_peer_failure
    from trainer.outputs.live_upload import uploading
    from trainer.training.run import train
    from trainer.watch.allreduce_check import PreflightError
    from trainer.watch.debugger import DebuggerError, wait_for_debugger
    from trainer.watch.signals import StopRequest, die_with_parent
    from trainer.watch.watchdog import enable_flight_recorder

    stop = StopRequest().install()
    die_with_parent()  # after the handler: a launcher killed with SIGKILL stops this run gently
    # The engine's record of its collectives, for the step watchdog (trainer.watch.watchdog).
    enable_flight_recorder(cfg.backend, os.environ)
    dist = _start_engine(cfg)
    # Rank 0's live copy of metrics and TensorBoard files in Blob storage: the last upload
    # runs when the block ends (after the run's files are closed and the workers shut down).
    with uploading(cfg, enabled=dist.is_root):
        try:
            wait_for_debugger(cfg, dist, stop)  # --debug-rank: nothing trains until it attaches
            return train(cfg, dist, stop, plugins), dist
        except (ConfigError, DataError) as err:
            fail(str(err), 2)
        except InitError as err:
            fail(str(err), err.exit_code)
        except (CheckpointError, PreflightError, OutputError, DebuggerError) as err:
            fail(str(err), 1)
        except OSError as err:
            if not _in_output_dir(err, cfg.output_dir):
                raise
            # The run folder on a share the task user cannot write (root-owned under root_squash),
            # or a file where a folder should be: the first write there names it.
            fail(
                f"output_dir={cfg.output_dir}: cannot create or write it as uid {os.getuid()} "
                f"({err.strerror}); make the folder writable for this user (on a Batch pool the "
                f"share's runs folder must be mode 1777)",
                1,
            )
        except Exception as err:
            if not is_peer_failure(err):
                raise
            fail(
                f"rank {dist.rank}: another worker stopped (its log says why); stopping too; "
                f"rerun to resume from the newest checkpoint in {cfg.output_dir}",
                1,
            )
        finally:
            dist.shutdown()


def _upload_results(results: Path, outputs_url: str) -> None:
    """Rank 0 only (the other ranks hold no results), once the workers are done."""
    from trainer.common.blob_folder import BlobFolder
    from trainer.outputs.results import ResultsError, upload

    try:
        upload(results, BlobFolder.parse(outputs_url))
    except ResultsError as err:
        fail(str(err), 1)
    print(f"results uploaded to {outputs_url}", flush=True)


def _report(result: RunResult, cfg: TrainConfig, workers: int) -> None:
    """Rank 0's last lines: where the run stopped, its rate, and what to read next."""
    from trainer.watch.noise_scale import advice

    if result.stopped_by == "already_complete":
        print(
            f"nothing to do: the checkpoint in {cfg.output_dir} is at step {result.step}, "
            f"the end of this run; use a new --output-dir or more --epochs/--max-steps"
        )
        return
    print(
        f"done: step {result.step} (started at {result.start_step}, stopped by "
        f"{result.stopped_by}), {workers} worker(s), "
        f"{result.samples_per_sec:.1f} {result.unit}/sec per worker, "
        f"{result.samples_per_sec_total:.1f} {result.unit}/sec total; outputs in "
        f"{cfg.output_dir}: metrics.jsonl, tensorboard/, checkpoints/"
        + (", results/" if result.results is not None else ""),
        flush=True,
    )
    if result.noise_scale is not None:
        print(advice(result.noise_scale, result.global_batch), flush=True)
    for straggler in result.stragglers:
        print(
            f"straggler: rank {straggler['rank']} on {straggler['host']}: {straggler['metric']} "
            f"over the other ranks' by up to {straggler['worst_excess_of_step']:.0%} of a step, "
            f"in {straggler['windows']} of {straggler['of_windows']} windows of "
            f"{cfg.straggler_every} steps",
            flush=True,
        )
    if result.skipped_images:
        print(
            f"skipped {result.skipped_images} image(s) that did not decode "
            "(--on-bad-image skip; the warnings above name them)",
            flush=True,
        )


def _in_output_dir(err: OSError, output_dir: str) -> bool:
    if not err.filename:
        return False
    failed, root = Path(os.fsdecode(err.filename)).absolute(), Path(output_dir).absolute()
    return failed == root or root in failed.parents or failed in root.parents


if __name__ == "__main__":
    sys.exit(main())
