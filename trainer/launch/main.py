"""``python -m trainer.launch [options] -- COMMAND...``: the Batch multi-instance task on every
node, or an AzureML job's process on every node. Wiring only: the options (``options``), then
the node's place (``batch_env``, ``azureml_env``), the
meeting of the nodes (``rendezvous``, ``store``), the fabric's check before the workers start, for
every job kind (``preflight``), the workers (``workers``), Scheduled Events
(``eviction``) and the records (``records``). The engine (``--backend``) and the run folder
(``--run-dir``) are given here by the job (``infra/batch.py``); the worker command runs as
given. How the launcher runs on Batch, and why: docs/deploy.md.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from trainer.common.cli import fail
from trainer.launch import eviction
from trainer.launch.azureml_env import read_azureml_environment
from trainer.launch.batch_env import LaunchError, Node, read_batch_environment, torch_master_port
from trainer.launch.log_upload import LogUpload
from trainer.launch.node_sizes import fabric_for, worker_environment, workers_per_node
from trainer.launch.options import SCRIPT_UPLOAD_MINUTES, build_parser, code_dir_fault
from trainer.launch.preflight import MODES as PREFLIGHT_MODES
from trainer.launch.preflight import Preflight, run_preflight, wanted
from trainer.launch.recheck import check_node, wait_for_restart
from trainer.launch.records import INTERRUPTED_EXIT, Outcome, RunLog, RunRecords, check_writable
from trainer.launch.rendezvous import new_token, start_gloo_rendezvous
from trainer.launch.scheduled_events import Watcher
from trainer.launch.stop import STOP
from trainer.launch.store import (
    MASTER_WAIT_SECONDS,
    Stopped,
    Store,
    join_store,
    wait_for_other_nodes,
)
from trainer.launch.task_user import task_user_environment
from trainer.launch.token_blob import BlobToken
from trainer.launch.workers import TORCH_ENGINES, Workers, check_engine, supervise, worker_envs
from trainer.outputs.live_upload import LiveUploader


def _default_workers(vm_size: str | None) -> int:
    if vm_size:
        return workers_per_node(vm_size)
    try:
        import torch

        return max(1, torch.cuda.device_count())
    except ImportError:
        return 1


@dataclass(frozen=True)
class _Plan:
    """What this launch starts, checked before anything starts."""

    engine: str
    slots: int
    node: Node
    torch_port: int | None
    records: RunRecords | None
    preflight: Preflight | None = None  # None: no preflight on this launch
    # Where the master hands its token to the other nodes when they share no run folder (an
    # AzureML job); None: through the run folder (Batch), or a single node.
    blob_token: BlobToken | None = None


def _plan(args, env: dict[str, str]) -> _Plan:
    """The options and the node's environment (Batch's or AzureML's), checked; raises
    LaunchError or ValueError."""
    if args.vm_size:
        fabric_for(args.vm_size)  # validate before anything starts
    # Not `args.workers_per_node or ...`: that would turn an explicit 0 into the default.
    if args.workers_per_node is not None and args.workers_per_node < 1:
        raise LaunchError(
            f"--workers-per-node={args.workers_per_node}: must be at least 1 (one worker "
            "per GPU; leave it out to use the VM size's GPUs)"
        )
    slots = args.workers_per_node or _default_workers(args.vm_size)
    engine = check_engine(args.backend)
    node, blob_token = _node(args, env)
    torch_port = None
    if engine in TORCH_ENGINES:
        torch_port = torch_master_port(node.port, env)
    if args.run_dir is None and args.defer_exit_code:
        raise LaunchError("--defer-exit-code needs --run-dir")
    if args.run_dir is None and len(node.hosts) > 1 and blob_token is None:
        raise LaunchError(
            f"{len(node.hosts)} nodes in AZ_BATCH_HOST_LIST: the master hands its "
            "rendezvous token to the other nodes in the run folder, so the launcher "
            "needs --run-dir on the file system every node mounts"
        )
    if args.metrics_upload_url is not None and args.run_dir is None:
        raise LaunchError("--metrics-upload-url needs --run-dir (the folder it copies from)")
    if args.run_dir is not None:
        check_writable(args.run_dir)
    records = RunRecords(args.run_dir) if args.run_dir is not None else None
    preflight = _preflight(args, node, slots, env)
    return _Plan(engine, slots, node, torch_port, records, preflight, blob_token)


def _node(args, env: dict[str, str]) -> tuple[Node, BlobToken | None]:
    """This node's place in the job, and where an AzureML job's nodes hand the token on."""
    if args.platform != "azureml":
        if args.token_url is not None:
            raise LaunchError("--token-url is for --platform azureml (Batch's nodes use --run-dir)")
        return read_batch_environment(env, args.node_ip, args.port), None
    node = read_azureml_environment(env, args.node_ip, args.port)
    if len(node.hosts) > 1 and args.token_url is None and args.run_dir is None:
        raise LaunchError(
            f"WORLD_SIZE={len(node.hosts)} with no --token-url: an AzureML job's nodes share no "
            "folder, so the master hands its rendezvous token to the others in the job's Blob "
            "folder; give --token-url"
        )
    return node, BlobToken(args.token_url) if args.token_url is not None else None


def _preflight(args, node: Node, slots: int, env: dict[str, str]) -> Preflight | None:
    """This launch's preflight, whatever the job runs; None when it runs none. Its probes meet
    on torch's store port (free until the workers start)."""
    if args.preflight not in PREFLIGHT_MODES:  # DT_PREFLIGHT, the option's default
        raise LaunchError(
            f"DT_PREFLIGHT={args.preflight}: expected one of {', '.join(PREFLIGHT_MODES)}"
        )
    if not wanted(args.preflight, args.vm_size, len(node.hosts), slots):
        return None
    return Preflight(node, slots, torch_master_port(node.port, env), args.vm_size)


def _serve(plan: _Plan, log: RunLog) -> tuple[str | None, Callable[[], None] | None]:
    """On the master, a new token (only this launch's nodes and workers reach its store) and
    the rendezvous serving it; (None, None) on the other nodes."""
    node = plan.node
    if not node.is_master:
        return None, None
    token = new_token()
    try:
        return token, start_gloo_rendezvous(node.port, node.hosts, plan.slots, token, log.say)
    except OSError as err:
        fail(
            f"cannot serve the rendezvous on port {node.port}: {err.strerror}: set "
            "MASTER_PORT or --port to a free port (not the one in AZ_BATCH_MASTER_NODE)",
            1,
        )


def _meet(plan: _Plan, token: str | None, log: RunLog, env: dict[str, str]) -> tuple[Store, str]:
    """Every node joins the master's store and learns the attempt; the log goes to the run
    folder from then on. Raises LaunchError, Stopped or OSError."""
    node, records = plan.node, plan.records
    if token is not None and len(node.hosts) > 1:
        if plan.blob_token is not None:
            plan.blob_token.publish(token, log.say)
        elif records is not None:
            records.publish_token(token)
    handoff = plan.blob_token or records  # the job's Blob folder, else the run folder
    # The master knows its token; the others read it where it was handed (checked in _plan).
    token_of = handoff.read_token if token is None and handoff is not None else lambda: token
    store = join_store(node, token_of, MASTER_WAIT_SECONDS)
    if node.is_master:
        attempt = RunRecords.new_attempt()
        store.put("attempt", attempt)
    else:
        attempt = store.wait_for("attempt", MASTER_WAIT_SECONDS)
    if records is not None:
        log.open(records.log_path(attempt, node.name))
        if node.is_master:
            records.start(attempt, node.hosts, env)
    return store, attempt


def main(argv: list[str] | None = None) -> int:
    STOP.install()  # `python -m trainer.launch` did already, before its imports
    args = build_parser().parse_args(argv)
    # Folders named relative to the launch's working folder (an AzureML job's) as absolute
    # ones: the workers run in the code folder, and find the run folder from there.
    args.run_dir = args.run_dir.absolute() if args.run_dir is not None else None
    args.code_dir = args.code_dir.absolute() if args.code_dir is not None else None
    env = dict(os.environ)
    if args.report:
        try:
            if args.run_dir is None:
                raise LaunchError("--report needs --run-dir")
            return RunRecords(args.run_dir).report(env, sys.stdout)
        except LaunchError as err:
            fail(str(err), 1)
    if (fault := code_dir_fault(args.code_dir, env)) is not None:
        fail(fault, 1)
    try:
        plan = _plan(args, env)
    except (LaunchError, ValueError) as err:
        fail(str(err), 2)
    log = RunLog(plan.node.name, keep_early=plan.records is not None)
    token, stop_server = _serve(plan, log)
    try:
        store, attempt = _meet(plan, token, log, env)
    except LaunchError as err:
        fail(str(err), 1)
    except Stopped as stopped:
        # No attempt to record it under: say so in the task's output and end (the newest
        # checkpoint stays the run's; a retry or the next run resumes from it).
        log.say(f"{stopped} while the nodes met, before the workers started: not starting them")
        if stop_server is not None:
            stop_server()
        log.close()
        return 0 if args.defer_exit_code else INTERRUPTED_EXIT
    except OSError as err:
        fail(f"output_dir={args.run_dir}: cannot record the run ({err.strerror or err})", 1)
    task_dir = Path(env["AZ_BATCH_TASK_DIR"]) if env.get("AZ_BATCH_TASK_DIR") else None
    ending = _Ending(plan.node, store, plan.records, attempt, log, stop_server, task_dir)
    upload = _log_upload(plan, attempt, log)
    try:
        return _run(args, plan, env, store, ending)
    finally:
        if upload is not None:
            upload.close()


def _log_upload(plan: _Plan, attempt: str, log: RunLog) -> LogUpload | None:
    """On AzureML, this node's log copied to the job's Blob folder while it runs (the nodes
    share no folder, and `dt-jobs logs` reads them there)."""
    if plan.blob_token is None or plan.records is None:
        return None
    path = plan.records.log_path(attempt, plan.node.name)
    return LogUpload(path, plan.blob_token.folder, plan.node.name, log.say).start()


def _run(args, plan: _Plan, env: dict[str, str], store: Store, ending: _Ending) -> int:
    """Start this node's workers, watch them to the end, and end the launch."""
    node, log = plan.node, ending.log
    base = worker_environment(args.vm_size, task_user_environment(env))
    if args.run_dir is not None:
        # The run folder on the shared file system, for a job's own command: its checkpoints/
        # and tensorboard/ go there (docs/jobs.md, Your own script).
        base["DT_RUN_DIR"] = str(args.run_dir)
    cwd = None
    if args.code_dir is not None:
        # The team's code is the working directory (python train.py) and importable
        # (--model pkg.module:factory), its requirements over the image's packages.
        cwd = args.code_dir / "src"
        paths = [str(cwd), str(args.code_dir / "site"), base.get("PYTHONPATH", "")]
        base["PYTHONPATH"] = os.pathsep.join(path for path in paths if path)
    envs = worker_envs(plan.engine, node, plan.slots, base, plan.torch_port, token=store.token)
    checked = run_preflight(plan.preflight, base, log) if plan.preflight else None
    if checked is not None:
        if not checked.interrupted:  # the other nodes' workers, if any started, stop too
            with contextlib.suppress(OSError):
                store.put("failed", checked.reason)
        return ending.finish(checked, args.defer_exit_code, wait_for_others=False)
    if STOP.requested:
        # Nothing to checkpoint yet: the newest checkpoint stays the run's. The master does not
        # wait for the others (they were stopped too; none needs its store any more).
        outcome = Outcome(0, f"signal {STOP.signum} before the workers started", True)
        log.say(f"{outcome.reason}: not starting them")
        return ending.finish(outcome, args.defer_exit_code, wait_for_others=False)
    log.say(
        f"node {node.index + 1}/{len(node.hosts)}: starting {plan.slots} worker(s) (attempt "
        f"{ending.attempt})"
        + (
            ""
            if plan.engine == "horovod"
            else f", {plan.engine} on {node.master_ip}:{plan.torch_port}"
        )
    )
    uploader = _uploader(args, node, log)
    workers = Workers(list(args.command), envs, log, cwd=cwd)
    watcher = eviction.watch(env, store, node, log) if args.watch_scheduled_events else None
    outcome = supervise(node, workers, store, log, watcher)
    workers.join_output()
    if uploader is not None:
        uploader.close()  # the last copy, after the workers closed their files
    if watcher is not None:
        watcher.stop()
        if watcher.noticed:
            eviction.approve(watcher, log)
    hold = watcher if watcher is not None and watcher.noticed else None
    if outcome.code != 0 and not outcome.interrupted and hold is None:
        outcome = _checked(outcome, node, ending.task_dir, log)
    return ending.finish(outcome, args.defer_exit_code, hold=hold)


def _checked(outcome: Outcome, node: Node, task_dir: Path | None, log: RunLog) -> Outcome:
    """A failed try's outcome once this node's watcher has checked the node: one that failed
    keeps itself out of the pool (trainer.launch.recheck), which the outcome says."""
    reason = check_node(task_dir, log.say)
    if reason is None:
        return outcome
    kept_out = f"node {node.label} failed its checks and keeps itself out of the pool: {reason}"
    log.say(kept_out)
    return Outcome(outcome.code, f"{outcome.reason}; {kept_out}", kept_out=kept_out)


def _uploader(args, node: Node, log: RunLog) -> LiveUploader | None:
    """On the master, the live copy of a job's own command's metrics (``--metrics-upload-url``),
    as rank 0 of the trainer makes its own (trainer.outputs.live_upload); None elsewhere."""
    if args.metrics_upload_url is None or not node.is_master:
        return None
    log.say(
        f"live upload: {args.run_dir}/metrics.jsonl and tensorboard/ to "
        f"{args.metrics_upload_url.url} every {SCRIPT_UPLOAD_MINUTES:g} min"
    )
    return LiveUploader(args.run_dir, args.metrics_upload_url, SCRIPT_UPLOAD_MINUTES * 60).start()


@dataclass
class _Ending:
    """How a launch that met the other nodes ends: the master's rendezvous, the outcome
    recorded for the report, and the exit code."""

    node: Node
    store: Store
    records: RunRecords | None
    attempt: str
    log: RunLog
    stop_server: Callable[[], None] | None
    task_dir: Path | None = None  # AZ_BATCH_TASK_DIR: where the node check's files are

    def finish(
        self,
        outcome: Outcome,
        defer_exit_code: bool,
        wait_for_others: bool = True,
        hold: Watcher | None = None,
    ) -> int:
        if self.stop_server is not None:
            if outcome.code == 0 and wait_for_others:
                wait_for_other_nodes(self.node, self.store)
            self.stop_server()
        self.log.say(f"done: {outcome.reason} (exit {outcome.code})")
        if self.records is not None:
            try:
                self.records.finish(self.attempt, self.node.name, outcome)
            except OSError as err:
                self.log.close()
                print(f"error: cannot record the outcome: {err}", file=sys.stderr, flush=True)
                return outcome.code or 1
        if hold is not None:
            eviction.hold(hold, self.log)
        elif outcome.kept_out:
            wait_for_restart(self.task_dir, self.log.say)
        self.log.close()
        return 0 if defer_exit_code else outcome.code
