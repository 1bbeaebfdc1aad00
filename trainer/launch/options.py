"""The launcher's command line (``python -m trainer.launch --help``): what the job tells it (the
engine, the run folder, the VM size), and the flags only a job's own command gets."""

from __future__ import annotations

import os
from pathlib import Path

from trainer.common.blob_folder import BlobFolder
from trainer.common.cli import OneLineParser, int_in
from trainer.launch.batch_env import DEFAULT_PORT
from trainer.launch.node_sizes import MAX_WORKERS_PER_NODE
from trainer.launch.preflight import MODES as PREFLIGHT_MODES
from trainer.settings.train_config import DEFAULTS

# How often the master copies a job's own command's metrics (the trainer's default period).
SCRIPT_UPLOAD_MINUTES = DEFAULTS.metrics_upload_minutes
PLATFORMS = ("batch", "azureml")


def build_parser() -> OneLineParser:
    parser = OneLineParser(
        prog="python -m trainer.launch",
        description="Start this node's workers (Horovod, or torch.distributed: ddp, fsdp; torch "
        "or horovod for a job's own command) for a Batch multi-instance task or an AzureML job.",
        allow_abbrev=False,
    )
    parser.add_argument(
        "--backend",
        default=DEFAULTS.backend,
        help=f"the workers' engine, as the worker command's own --backend (default: the "
        f"trainer's, {DEFAULTS.backend})",
    )
    parser.add_argument(
        "--run-dir",
        type=Path,
        help="the run folder on the file system every node mounts (the worker command's "
        "--output-dir): each attempt's logs and outcomes, and the rendezvous token",
    )
    _add_script_flags(parser)
    parser.add_argument(
        "--vm-size", help="pool VM size: workers per node and InfiniBand/NCCL settings"
    )
    parser.add_argument(
        "--workers-per-node",
        type=int_in(1, MAX_WORKERS_PER_NODE),
        help="default: the VM size's GPUs, else visible GPUs or 1",
    )
    _add_node_flags(parser)
    _add_preflight_flag(parser)
    parser.add_argument(
        "--port",
        type=int_in(1, 65535),
        help=f"rendezvous port on the master (default: MASTER_PORT, else {DEFAULT_PORT}); never "
        "the port in AZ_BATCH_MASTER_NODE, which Batch reserves. ddp and fsdp workers also use "
        "the next port (torch.distributed's store)",
    )
    parser.add_argument(
        "--watch-scheduled-events",
        action="store_true",
        help="poll the VM's Azure Scheduled Events (AZURE_IMDS_URL, default the metadata "
        "service): on a Spot eviction or maintenance notice the workers checkpoint at once",
    )
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument(
        "--defer-exit-code",
        action="store_true",
        help="exit 0 once the outcome is recorded in <run-dir>/logs (Batch's coordination "
        "command); --report exits with it",
    )
    mode.add_argument(
        "--report",
        action="store_true",
        help="start nothing: print every node's log of the current attempt and exit with its "
        "recorded outcome (Batch's application command)",
    )
    parser.add_argument("command", nargs="+", help="the worker command, after --")
    return parser


def _add_node_flags(parser: OneLineParser) -> None:
    """Where the node's place in the job comes from, and its address."""
    parser.add_argument(
        "--platform",
        choices=PLATFORMS,
        default="batch",
        help="where the job runs: batch (a multi-instance task: AZ_BATCH_* variables, the "
        "token through --run-dir), or azureml (a command job's PyTorch distribution with one "
        "process per node: MASTER_ADDR, WORLD_SIZE, NODE_RANK, the token through --token-url)",
    )
    parser.add_argument(
        "--token-url",
        type=BlobFolder.parse,
        help="--platform azureml with several nodes: the job's Blob folder (in the logs "
        "container) where the master hands this launch's rendezvous token to the other nodes",
    )
    parser.add_argument("--node-ip", help="this node's address (in AZ_BATCH_HOST_LIST on Batch)")


def _add_preflight_flag(parser: OneLineParser) -> None:
    parser.add_argument(
        "--preflight",
        choices=PREFLIGHT_MODES,
        default=os.environ.get("DT_PREFLIGHT") or "auto",
        help="before the workers start, time allreduces within each node and between pairs of "
        "nodes and fail naming a slow node's Batch id (docs/jobs.md, A node that fails); auto: "
        "on a GPU size; on: also on CPU nodes. Default: $DT_PREFLIGHT, else auto",
    )


def _add_script_flags(parser: OneLineParser) -> None:
    """The flags only a job's own command (not the trainer) gets."""
    parser.add_argument(
        "--code-dir",
        type=Path,
        help="a job's code snapshot made ready on this node (python -m "
        "trainer.launch.code_folder): the workers run in <code-dir>/src with it and "
        "<code-dir>/site (its requirements) first on PYTHONPATH",
    )
    parser.add_argument(
        "--metrics-upload-url",
        type=BlobFolder.parse,
        help="a job's own command (the trainer uploads its own): the master node copies "
        "<run-dir>/metrics.jsonl and <run-dir>/tensorboard/ to this Blob folder every "
        f"{SCRIPT_UPLOAD_MINUTES:g} min and when the workers end",
    )


def code_dir_fault(code_dir: Path | None, env: dict[str, str]) -> str | None:
    """Why ``--code-dir`` is not a code folder made ready on this node (a node's fault: the job
    preparation task did not make it), or None. Checked before anything starts."""
    if code_dir is None or (code_dir / "src").is_dir():
        return None
    prep = env.get("AZ_BATCH_JOB_PREP_WORKING_DIR")
    return (
        f"--code-dir={code_dir}: no such folder with src/ in it, which the job preparation "
        "task (python -m trainer.launch.code_folder) makes on each node before the job's task: "
        "read its stderr.txt on this node (dt-jobs status names a failed one); "
        + (
            f"AZ_BATCH_JOB_PREP_WORKING_DIR={prep}"
            if prep
            else "AZ_BATCH_JOB_PREP_WORKING_DIR is not set"
        )
    )
