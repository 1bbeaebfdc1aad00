"""The emulator's pytest fixtures: what the dev stack declares (its offline plan), the emulated
VNet (network namespaces), the storage account (Azurite over HTTPS with token auth) and pools of
emulated nodes. A plugin: ``tests/infra/batch_nodes/conftest.py`` imports it, and
``bench.code_change`` loads it with ``-p tests.batch_emulator.fixtures``."""

from __future__ import annotations

import base64
import ipaddress
import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.batch_emulator import REPO
from tests.batch_emulator.cluster import Cluster
from tests.batch_emulator.declared import NfsExport, PoolSpec
from tests.batch_emulator.image import ImageConfig, read_dockerfile
from tests.batch_emulator.storage import ACCOUNT, ACCOUNT_KEY, Storage, blob, close_blob_agent
from tests.batch_emulator.vnet import VNet
from tests.conftest import write_image_folder
from tests.support.built_image import image_container, image_name
from tests.support.ports import free_port
from tests.support.process_tree import fail_if_any_left
from tests.support.tls import self_signed

AZURITE = REPO / ".venv/azurite/node_modules/.bin/azurite-blob"
# Three nodes: two for the task, one more for the node that fails its start task.
NODES = 3

# The dev stack as declared, and the same stack as a CPU acceptance stack (the CPU size the
# project supports for acceptance runs: no GPU, no InfiniBand, one worker per node), whose
# payloads a CPU-only emulation can run in full.
CPU_ACCEPTANCE = {
    "gpu-cluster:acceptanceProfile": "cpu",
    "gpu-cluster:vmSize": "Standard_D2ds_v5",
    "gpu-cluster:protectData": False,
}
# The stacks the tests run: the dev stack, as a CPU acceptance stack, and that on Spot nodes.
STACK_OVERRIDES = {
    "gpu": {},
    "cpu": CPU_ACCEPTANCE,
    "cpu-spot": {**CPU_ACCEPTANCE, "gpu-cluster:spot": True},
}
_PLAN_SCRIPT = """
import json, sys
from dt_commands.plan import REPO, evaluate, read_stack_file
keep = ("azure-native:batch:Pool", "azure-native:compute:VirtualMachine",
        "pulumi-python:dynamic:Resource", "pulumi-python:dynamic/acr:ImageBuild",
        "azure-native:storage:BlobContainer", "azure-native:containerregistry:Task")
out = {}
for label, overrides in json.loads(sys.argv[1]).items():
    values = {**read_stack_file(REPO / "Pulumi.dev.yaml"), **overrides}
    plan = evaluate("dev", values)
    out[label] = {
        "compute_subnet": plan.settings.network.compute_subnet_cidr,
        "resources": [{"typ": r.typ, "name": r.name, "inputs": r.inputs}
                      for r in plan.resources if r.typ in keep],
    }
json.dump(out, sys.stdout, default=str)
"""


@dataclass(frozen=True)
class Stack:
    """What a stack declares that the nodes see."""

    pool: PoolSpec
    job_props: dict[str, Any]
    nfs: NfsExport
    image: ImageConfig
    identities: dict[str, str]  # client id -> resource id of the pool's identity
    containers: tuple[str, ...]
    compute_subnet: str
    registry_images: tuple[str, ...]  # what the stack's build pushes to its registry


def _declared(plan: dict[str, Any], typ: str) -> list[dict[str, Any]]:
    return [r["inputs"] for r in plan["resources"] if r["typ"] == typ]


def _stack(plan: dict[str, Any]) -> Stack:
    from infra.cloud_init import MOUNT_POINT

    (pool_inputs,) = _declared(plan, "azure-native:batch:Pool")
    pool = PoolSpec.from_declared(pool_inputs)
    jobs = [j for j in _declared(plan, "pulumi-python:dynamic:Resource") if "trainer_args" in j]
    assert len(jobs) == 1, "the stack declares one TrainingJob"
    vms = [
        vm
        for vm in _declared(plan, "azure-native:compute:VirtualMachine")
        if (vm.get("osProfile") or {}).get("customData")
    ]
    assert vms, "the dev stack's NFS server (nfsMode vm) declares its cloud-init"
    user_data = base64.b64decode(vms[0]["osProfile"]["customData"]).decode()
    builds = _declared(plan, "pulumi-python:dynamic/acr:ImageBuild")
    build_args = (
        {k: str(v) for k, v in (builds[0].get("build_args") or {}).items()} if builds else {}
    )
    job = jobs[0]
    assert job["node_identity_id"] in pool.identity_ids, "the job uses the pool's identity"
    return Stack(
        pool=pool,
        job_props=job,
        nfs=NfsExport.from_cloud_init(user_data, MOUNT_POINT),
        image=read_dockerfile(REPO / "docker" / "Dockerfile", build_args),
        identities={job["node_identity_client_id"]: job["node_identity_id"]},
        containers=tuple(
            c["containerName"] for c in _declared(plan, "azure-native:storage:BlobContainer")
        ),
        compute_subnet=plan["compute_subnet"],
        registry_images=_pushed(plan, pool),
    )


def _pushed(plan: dict[str, Any], pool: PoolSpec) -> tuple[str, ...]:
    """Every image the stack's build task pushes (its step's imageNames, relative to the
    registry it runs in: the pool's)."""
    (server,) = pool.registries
    names = [n for task in _declared(plan, "azure-native:containerregistry:Task")
             for n in task["step"].get("imageNames") or ()]  # fmt: skip
    return tuple(f"{server}/{name}" for name in names)


@pytest.fixture(scope="session")
def stacks() -> dict[str, Stack]:
    """Both stacks' declarations (Pulumi mocks in a child process: the mocks are global state
    that other tests set up their own way)."""
    result = subprocess.run(
        [sys.executable, "-c", _PLAN_SCRIPT, json.dumps(STACK_OVERRIDES)],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    if result.returncode != 0:
        pytest.fail(f"the dev stack's plan failed: {result.stderr[-3000:]}")
    return {label: _stack(plan) for label, plan in json.loads(result.stdout).items()}


@pytest.fixture(scope="session")
def gpu_stack(stacks) -> Stack:
    return stacks["gpu"]


@pytest.fixture(scope="session")
def cpu_stack(stacks) -> Stack:
    return stacks["cpu"]


@pytest.fixture(scope="session")
def spot_cpu_stack(stacks) -> Stack:
    """The CPU acceptance stack with `spot: true`: every node of its pool is a Spot node."""
    return stacks["cpu-spot"]


@pytest.fixture(scope="session")
def image(gpu_stack) -> ImageConfig:
    return gpu_stack.image


@pytest.fixture(scope="session")
def built_image() -> Iterator[Path]:
    """The root file system of the trainer image `make image` built for this checkout, mounted
    for the session (tests/support/built_image.py): a cluster given it as ``image_root`` runs
    its containers in it, with the image's own Python and packages."""
    with image_container(image_name()) as container:
        yield container.root


@pytest.fixture(scope="session")
def pool_spec(gpu_stack) -> PoolSpec:
    return gpu_stack.pool


# --- the VNet and the storage account: one of each for the session, as every test's cluster is
# a new pool in the same subnet and account (make_cluster empties what a job could resume from).
@pytest.fixture(scope="session")
def vnet(gpu_stack) -> Iterator[VNet]:
    if os.geteuid() != 0:
        pytest.skip("the Batch emulator runs nodes in namespaces and as other users: needs root")
    subnet = ipaddress.ip_network(gpu_stack.compute_subnet)
    # The image is this checkout: the task user (not root) must reach it, also when the clone
    # sits in a private (0700) folder such as mktemp's. Open such folders for traversal only
    # (o+x, no listing) while the emulator runs, and restore them afterwards.
    closed = [d for d in (REPO, *REPO.parents) if not d.stat().st_mode & stat.S_IXOTH]
    for folder in closed:
        folder.chmod(folder.stat().st_mode | stat.S_IXOTH)
    net = VNet(nodes=NODES, subnet=str(subnet))
    try:
        yield net
    finally:
        net.close()
        for folder in closed:
            folder.chmod(folder.stat().st_mode & ~stat.S_IXOTH)


@pytest.fixture(scope="session")
def storage(vnet, gpu_stack) -> Iterator[Storage]:
    """Azurite as the stack's storage account: HTTPS on the VNet, bearer tokens accepted
    (``--oauth basic`` checks issuer, audience and lifetime), the stack's blob containers."""
    assert AZURITE.exists(), f"{AZURITE} is missing: run `make setup`"
    folder = Path(tempfile.mkdtemp(prefix="batch-storage-"))
    os.chmod(folder, 0o755)
    cert, key = self_signed(folder, vnet.storage_ip, "emulated-storage")
    port = 443 if vnet.isolated else free_port()
    process = subprocess.Popen(
        [*vnet.exec_prefix(vnet.switch if vnet.isolated else None), str(AZURITE),
         "--blobHost", vnet.storage_ip, "--blobPort", str(port), "--location",
         str(folder / "data"), "--silent", "--skipApiVersionCheck", "--loose",
         "--oauth", "basic", "--cert", str(cert), "--key", str(key)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    host = vnet.storage_ip if port == 443 else f"{vnet.storage_ip}:{port}"
    account = Storage(f"https://{host}/{ACCOUNT}/", cert, ACCOUNT, ACCOUNT_KEY)
    try:
        containers = list(gpu_stack.containers)
        deadline = time.monotonic() + 60
        while True:
            try:  # until Azurite listens; no SDK retries, which would wait 15 s
                blob(vnet, account, "create-containers", containers=containers, retry_total=0)
                break
            except RuntimeError:
                if process.poll() is not None or time.monotonic() > deadline:
                    raise
                time.sleep(0.3)
        yield account
    finally:
        close_blob_agent(account)
        process.kill()
        process.wait(timeout=30)
        shutil.rmtree(folder, ignore_errors=True)


# How long after a cluster's close() its killed processes may take to be gone (SIGKILL: well
# under a second).
NODES_EMPTY_SECONDS = 5.0


@pytest.fixture(scope="session")
def dataset_prefix(vnet, storage, tmp_path_factory) -> str:
    """A tiny image folder prepared into shards with ``dt-data prepare`` and
    uploaded to the storage account's ``datasets`` container with the project's upload."""
    root = tmp_path_factory.mktemp("dataset")
    source = write_image_folder(root / "images", classes=3, per_class=12, size=24)
    shards = root / "shards"
    subprocess.run(
        [sys.executable, "-m", "trainer.data", "prepare", str(source), str(shards),
         "--shard-mb", "0.02", "--processes", "1"],
        check=True, cwd=REPO, capture_output=True,
    )  # fmt: skip
    blob(
        vnet,
        storage,
        "trainer-upload",
        container="datasets",
        prefix="tiny-v1",
        folder=str(shards),
    )
    return "tiny-v1"


# --- pools ---
def new_cluster(vnet: VNet, storage: Storage, stack: Stack, **options: Any) -> tuple[Cluster, Path]:
    """A pool of ``stack``'s nodes, not booted yet, in a folder of its own (returned too)."""
    # Each cluster is a new stack with a new NFS share, but the storage account is shared by the
    # session's tests: without this, a job with the settings of an earlier test's job (the same
    # run folder) resumes from that job's mirrored checkpoint, as a stack whose NFS server was
    # replaced rightly does (trainer.checkpoints.mirror), and ends at once.
    blob(vnet, storage, "empty-container", container="checkpoints")
    base = Path(tempfile.mkdtemp(prefix="batch-nodes-"))
    os.chmod(base, 0o755)  # the Batch tree must be reachable by the task user
    options.setdefault("registry_images", stack.registry_images)
    cluster = Cluster(base, vnet, stack.pool, stack.image, stack.nfs, storage, stack.identities,
                      **options)  # fmt: skip
    return cluster, base


@pytest.fixture
def make_cluster(vnet, storage, request):
    """``make_cluster(stack, lifecycle=..., ib_down={node: port}, kernel_log={node: text},
    nodes=N)``: a pool of the stack's nodes that booted (their start tasks ran)."""
    made: list[tuple[Cluster, Path]] = []

    def make(stack: Stack, **options: Any) -> Cluster:
        ib_down: dict[int, str] = options.pop("ib_down", {})
        kernel_log: dict[int, str] = options.pop("kernel_log", {})
        cluster, base = new_cluster(vnet, storage, stack, **options)
        for index, port in ib_down.items():
            cluster.nodes[index].ib_ports[port] = ("1: DOWN", "InfiniBand")
        for index, text in kernel_log.items():
            cluster.nodes[index].kernel_log = text
        made.append((cluster, base))
        cluster.boot()
        return cluster

    yield make
    for cluster, base in made:
        cluster.close()
        call = getattr(request.node, "rep_call", None)
        if call is None or call.passed:
            shutil.rmtree(base, ignore_errors=True)
        else:
            print(f"emulated nodes kept for inspection: {base}")
    # The node namespaces are the session's: what a cluster leaves running there (a port held,
    # a unit looping) would break every later test, so the test that left it fails instead.
    fail_if_any_left(vnet.node_processes, NODES_EMPTY_SECONDS,
                     "on emulated nodes outlived their cluster")  # fmt: skip


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item, call):
    report = yield
    setattr(item, f"rep_{report.when}", report)
    return report
