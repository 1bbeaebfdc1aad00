"""``infra.job.TrainingJobProvider`` under Pulumi's real dynamic-provider host.

As the engine's ``pulumi-resource-pulumi-python`` shim does, the test starts
``<venv>/bin/python -u -m pulumi.dynamic`` with the project root as working directory, reads
the gRPC port it prints, and drives it with the SDK's own stubs: Configure (acceptSecrets=False),
Check, Diff, Create, Read, Delete, the provider pickled into ``__provider`` the way
``pulumi.dynamic`` does it. Batch is a fake HTTPS server on 127.0.0.1 whose certificate the host
trusts through REQUESTS_CA_BUNDLE; the credential is the production ``DefaultAzureCredential``
narrowed to its Azure CLI step (AZURE_TOKEN_CREDENTIALS) with a stub ``az`` that prints a token
and counts its calls. A ``sitecustomize`` in the host refuses to import torch.
"""

from __future__ import annotations

import asyncio
import os
import queue
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf import struct_pb2
from pulumi.dynamic.dynamic import serialize_provider
from pulumi.runtime import rpc
from pulumi.runtime._serialization import _serialize
from pulumi.runtime.proto import provider_pb2, provider_pb2_grpc

from infra.azureml_job_guard import AzuremlJobGuardProvider, job_arm_id
from infra.batch import TASK_ID
from infra.image_build import ImageBuildProvider
from infra.job import TrainingJobProvider
from infra.job_spec import JobSpec
from infra.registry import TaskBypassProvider
from tests.infra.fake_arm import REGISTRY_ID, SUB, FakeRegistry, start_arm
from tests.support.fake_azureml_jobs import FakeAzuremlJobs
from tests.support.fake_batch import FakeBatch
from tests.support.fake_entra import FakeEntra, write_federated_az

REPO = Path(__file__).resolve().parents[2]
URN = "urn:pulumi:dev::gpu-cluster::pulumi-python:dynamic:Resource::dev-job"
TIMEOUT = 30

AZ_STUB = """#!/bin/sh
echo "$*" >> "$FAKE_AZ_CALLS"
echo '{"accessToken": "fake-token", "expiresOn": "2099-01-01 00:00:00.000000", \
"expires_on": 4070908800, "tokenType": "Bearer", "subscription": "s", "tenant": "t"}'
"""

NO_TORCH = """import os, sys


class _NoTorch:
    # The provider host must stay light: fail any import of torch loudly.
    def find_spec(self, name, path=None, target=None):
        if name == "torch" or name.startswith("torch."):
            raise ImportError("the dynamic provider host imported torch")
        return None


sys.meta_path.insert(0, _NoTorch())
open(os.environ["NO_TORCH_MARKER"], "w").close()
"""


def _provider(**state: Any) -> str:
    """The ``__provider`` value ``pulumi.dynamic.Resource`` would store for this provider."""
    provider = TrainingJobProvider()
    provider.__dict__.update(state)
    return _serialize(True, serialize_provider, provider)[0]


def _struct(props: dict[str, Any]) -> struct_pb2.Struct:
    # A loop of its own, as the host does: asyncio.run would unset the thread's current loop,
    # which later tests under Pulumi's mocks rely on.
    loop = asyncio.new_event_loop()
    try:
        return loop.run_until_complete(rpc.serialize_properties(props, {}))
    finally:
        loop.close()


def _dict(struct: struct_pb2.Struct) -> dict[str, Any]:
    return rpc.deserialize_properties(struct)


# The providers that call ARM build its URL from a module constant: this host's ARM is the fake.
ARM_HERE = """
if os.environ.get("FAKE_ARM"):
    import infra.image_build, infra.registry

    infra.image_build.ARM_ENDPOINT = infra.registry.ARM_ENDPOINT = os.environ["FAKE_ARM"]
"""


# The provider polls a job it terminates or deletes every infra.job.POLL_SECONDS (5 s) and reads
# a job Batch does not show yet again after NOT_FOUND_PAUSE_SECONDS (2 s): the fake moves a job
# on after a number of reads, not of seconds (terminating_reads, deleting_reads, hide), so this
# host reads again at once and a test waits for no clock.
FAST_POLLS = """
import infra.batch_calls, infra.job

infra.job.POLL_SECONDS = infra.batch_calls.NOT_FOUND_PAUSE_SECONDS = 0.05
"""


class Host:
    def __init__(
        self,
        folder: Path,
        fake: FakeBatch,
        entra: FakeEntra | None = None,
        arm: tuple[str, Path] | None = None,  # a fake ARM's URL and certificate
    ) -> None:
        bin_dir, site = folder / "bin", folder / "site"
        bin_dir.mkdir()
        site.mkdir()
        cas = [fake.ca_path]
        if entra is None:
            (bin_dir / "az").write_text(AZ_STUB)
            (bin_dir / "az").chmod(0o755)
            identity = {"AZURE_TOKEN_CREDENTIALS": "AzureCliCredential"}
        else:
            identity = _github_deploy(folder, bin_dir, entra)
            cas.append(entra.ca_path)
        if arm is not None:
            identity["FAKE_ARM"] = arm[0]
            cas.append(arm[1])
        ca_path = folder / "ca-bundle.pem"
        ca_path.write_text("".join(ca.read_text() for ca in cas))
        (site / "sitecustomize.py").write_text(NO_TORCH + ARM_HERE + FAST_POLLS)
        self.az_calls = folder / "az-calls"
        self.no_torch_marker = folder / "no-torch-active"
        self.stderr_path = folder / "host-stderr.txt"
        env = {
            **os.environ,
            "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
            "PYTHONPATH": os.pathsep.join((str(site), str(REPO))),
            **identity,
            "FAKE_AZ_CALLS": str(self.az_calls),
            "NO_TORCH_MARKER": str(self.no_torch_marker),
            "REQUESTS_CA_BUNDLE": str(ca_path),
            "SSL_CERT_FILE": str(ca_path),
            "NO_PROXY": "127.0.0.1,localhost",
            "no_proxy": "127.0.0.1,localhost",
            "PULUMI_PROJECT": "gpu-cluster",
        }
        self._stderr = open(self.stderr_path, "w")  # noqa: SIM115  # closed in close()
        self.process = subprocess.Popen(
            [sys.executable, "-u", "-m", "pulumi.dynamic"],
            cwd=REPO,
            env=env,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
        )
        port = self._first_line(TIMEOUT)
        self.channel = grpc.insecure_channel(f"127.0.0.1:{port}")
        self.stub = provider_pb2_grpc.ResourceProviderStub(self.channel)

    def _first_line(self, seconds: float) -> int:
        lines: queue.Queue[bytes] = queue.Queue()
        assert self.process.stdout is not None
        stdout = self.process.stdout
        threading.Thread(target=lambda: lines.put(stdout.readline()), daemon=True).start()
        try:
            line = lines.get(timeout=seconds)
        except queue.Empty:
            raise AssertionError(f"no port from the provider host: {self.stderr()}") from None
        assert line.strip().isdigit(), f"{line!r} {self.stderr()}"
        return int(line)

    def stderr(self) -> str:
        self._stderr.flush()
        return self.stderr_path.read_text()

    def close(self) -> None:
        self.channel.close()
        self.process.terminate()
        self.process.wait(10)
        self._stderr.close()


def _github_deploy(folder: Path, bin_dir: Path, entra: FakeEntra) -> dict[str, str]:
    """The environment of the deploy workflow's `pulumi up` step: GitHub's OIDC variables, the
    deploy's identity, and the `az` that ``azure/login`` left, holding the ID token it was given
    at the start of the job."""
    write_federated_az(bin_dir, sys.executable)
    assertion = folder / "az-assertion"
    assertion.write_text(entra.id_token())
    env = {k: v for k, v in entra.github_env().items() if not k.endswith(("CA_BUNDLE", "_FILE"))}
    return {**env, "AZ_ASSERTION_FILE": str(assertion)}


@pytest.fixture(scope="module")
def fake(tmp_path_factory):
    # The deployer (AZ_STUB's token) holds its documented prerequisite and the Job Submitter
    # the stack grants it, nothing more (docs/deploy.md, Who may do what).
    deployer = ("Owner", "Azure Batch Job Submitter")
    batch = FakeBatch(tmp_path_factory.mktemp("batch"), roles={"fake-token": deployer})
    yield batch
    batch.close()


@pytest.fixture(scope="module")
def host(tmp_path_factory, fake):
    started = Host(tmp_path_factory.mktemp("host"), fake)
    configured = started.stub.Configure(
        provider_pb2.ConfigureRequest(acceptSecrets=False, args=_struct({})), timeout=TIMEOUT
    )
    assert configured.acceptSecrets is False
    yield started
    started.close()


def _inputs(fake: FakeBatch, stack: str, **changes: Any) -> dict[str, Any]:
    values = {
        "stack": stack,
        "endpoint": fake.url,
        "account_id": "/subscriptions/s/resourceGroups/rg/providers/Microsoft.Batch/"
        "batchAccounts/b",
        "pool_id": "ib-gpu",
        "node_count": 2,
        "vm_size": "Standard_ND96isr_H100_v5",
        "image_ref": "acr.azurecr.io/trainer:abc@sha256:" + "a" * 64,
        "registry_server": "acr.azurecr.io",
        "node_identity_id": "/subscriptions/s/resourceGroups/rg/providers/x/identities/n",
        "node_identity_client_id": "11111111-2222-3333-4444-555555555555",
        "blob_endpoint": "https://data.blob.core.windows.net/",
        "trainer_args": ["--model", "resnet50", "--epochs", "90"],
        "dataset_prefix": "",
        "trainer_settings": [["model", "resnet50"], ["epochs", "90"]],
        **changes,
    }
    return {**values, "__provider": _provider()}


def _create(host: Host, props: dict[str, Any]) -> provider_pb2.CreateResponse:
    request = provider_pb2.CreateRequest(urn=URN, properties=_struct(props), timeout=TIMEOUT)
    return host.stub.Create(request, timeout=TIMEOUT)


def _calls(fake: FakeBatch, job_id: str) -> list[str]:
    return [c for c in fake.calls() if f"/jobs/{job_id}" in c]


def test_check_echoes_the_inputs_and_diff_ignores_provider_code(host, fake):
    news = _inputs(fake, "check")
    checked = host.stub.Check(
        provider_pb2.CheckRequest(urn=URN, olds=_struct({}), news=_struct(news)), timeout=TIMEOUT
    )
    assert not checked.failures and _dict(checked.inputs)["trainer_args"] == news["trainer_args"]

    job_id = JobSpec.from_props(news).job_id
    olds = {**news, "job_id": job_id, "state": "active"}
    new_code = {**news, "__provider": _provider(revision=2)}
    assert new_code["__provider"] != news["__provider"]
    same = host.stub.Diff(
        provider_pb2.DiffRequest(id=job_id, urn=URN, olds=_struct(olds), news=_struct(new_code)),
        timeout=TIMEOUT,
    )
    assert same.changes == provider_pb2.DiffResponse.DIFF_NONE and not same.replaces

    longer = {**news, "trainer_args": ["--model", "resnet50", "--epochs", "120"]}
    changed = host.stub.Diff(
        provider_pb2.DiffRequest(id=job_id, urn=URN, olds=_struct(olds), news=_struct(longer)),
        timeout=TIMEOUT,
    )
    assert changed.changes == provider_pb2.DiffResponse.DIFF_SOME
    assert list(changed.replaces) == ["trainer_args"] and changed.deleteBeforeReplace


def test_create_adds_the_job_with_noaction_then_the_task_then_terminatejob(host, fake):
    props = _inputs(fake, "create")
    job_id = JobSpec.from_props(props).job_id
    created = _create(host, props)
    assert created.id == job_id
    outputs = _dict(created.properties)
    assert outputs["state"] == "active" and outputs["job_id"] == job_id
    assert outputs["__provider"] == props["__provider"]
    assert fake.calls()[-4:] == [
        "POST /jobs",
        f"POST /jobs/{job_id}/tasks",
        f"PATCH /jobs/{job_id}",
        f"GET /jobs/{job_id}",
    ]
    job_add, task_add, update = fake.requests[-4:-1]
    assert job_add.body["id"] == job_id and job_add.body["onAllTasksComplete"] == "noaction"
    assert task_add.body["id"] == TASK_ID
    assert task_add.body["multiInstanceSettings"]["numberOfInstances"] == 2
    assert update.body == {"onAllTasksComplete": "terminatejob"}
    assert job_add.headers["authorization"] == "Bearer fake-token"


def test_read_of_old_state_refreshes_and_forgets_a_missing_job(host, fake):
    fake.add_job("old-job", "completed")
    old_state = {
        "endpoint": fake.url,
        "stack": "old",
        "job_id": "old-job",
        "state": "active",
        "retired_setting": True,  # an input a later version dropped; others are missing
        "__provider": _provider(),
    }
    read = host.stub.Read(
        provider_pb2.ReadRequest(id="old-job", urn=URN, properties=_struct(old_state)),
        timeout=TIMEOUT,
    )
    assert read.id == "old-job" and _dict(read.properties)["state"] == "completed"
    gone = host.stub.Read(
        provider_pb2.ReadRequest(id="no-such-job", urn=URN, properties=_struct(old_state)),
        timeout=TIMEOUT,
    )
    assert gone.id == ""


def _delete(host: Host, job_id: str, props: dict[str, Any]) -> None:
    request = provider_pb2.DeleteRequest(
        id=job_id, urn=URN, properties=_struct(props), timeout=TIMEOUT
    )
    host.stub.Delete(request, timeout=TIMEOUT)


def test_delete_terminates_a_running_job_then_deletes_it(host, fake):
    props = _inputs(fake, "running")
    job_id = _create(host, props).id
    _delete(host, job_id, {**props, "job_id": job_id})
    calls = _calls(fake, job_id)
    assert calls.index(f"POST /jobs/{job_id}/terminate") < calls.index(f"DELETE /jobs/{job_id}")
    assert job_id not in fake.jobs


def test_delete_of_a_finished_or_missing_job_succeeds(host, fake):
    fake.add_job("finished-job", "completed")
    old_state = {"endpoint": fake.url, "job_id": "finished-job", "__provider": _provider()}
    _delete(host, "finished-job", old_state)
    calls = _calls(fake, "finished-job")
    assert calls[:2] == ["GET /jobs/finished-job", "DELETE /jobs/finished-job"]
    assert set(calls[2:]) == {"GET /jobs/finished-job"}  # polled until gone (404), no terminate
    _delete(host, "missing-job", {**old_state, "job_id": "missing-job"})
    assert _calls(fake, "missing-job") == ["GET /jobs/missing-job"]


def test_a_403_after_a_fresh_role_assignment_is_retried_then_succeeds(host, fake):
    props = _inputs(fake, "forbidden")
    job_id = JobSpec.from_props(props).job_id
    fake.fail("POST", "/jobs", 403, "AuthorizationFailure")
    assert _create(host, props).id == job_id
    assert [c for c in fake.calls() if c == "POST /jobs"][-2:] == ["POST /jobs", "POST /jobs"]
    assert "refused to create job" in host.stderr()
    assert "(403 AuthorizationFailure)" in host.stderr()


def test_a_refresh_by_an_operator_without_a_batch_role_keeps_the_recorded_state(host, fake):
    # CI deployed the stack and holds the role; a colleague's preview refreshes every job.
    props = _inputs(fake, "colleague")
    job_id = _create(host, props).id
    recorded = {**props, "job_id": job_id, "state": "active", "task_state": "running"}
    before = len(fake.requests)
    fake.granted = {"the-ci-principal's-token"}
    try:
        read = host.stub.Read(
            provider_pb2.ReadRequest(id=job_id, urn=URN, properties=_struct(recorded)),
            timeout=TIMEOUT,
        )
    finally:
        fake.granted = None
    assert read.id == job_id and _dict(read.properties)["state"] == "active"
    assert fake.calls()[before:] == [f"GET /jobs/{job_id}"]  # asked once, no waiting
    warning = f"refused to read job {job_id} (403 AuthorizationFailure): kept job {job_id}'s"
    assert warning in host.stderr() and "Azure Batch Job Submitter" in host.stderr()


def test_one_credential_per_process_and_no_torch(host, fake):
    # Two calls of its own: with the tests spread over workers, this one may be the only test of
    # the module that runs in its worker's host.
    fake.add_job("credential-job", "active")
    state = {"endpoint": fake.url, "job_id": "credential-job", "__provider": _provider()}
    for _ in range(2):
        read = host.stub.Read(
            provider_pb2.ReadRequest(id="credential-job", urn=URN, properties=_struct(state)),
            timeout=TIMEOUT,
        )
        assert read.id == "credential-job"
    assert host.no_torch_marker.exists()  # the import guard was active in the host
    # Every call this host made (these two and those of any other test run in it) went through
    # one client, one credential, one token.
    assert len(host.az_calls.read_text().splitlines()) == 1, host.stderr()
    assert "Traceback" not in host.stderr()


def test_a_deploy_under_github_oidc_gets_batch_tokens_long_after_its_login(tmp_path):
    # GitHub's ID token lives five minutes; the az of `azure/login` cannot fetch another. The
    # image build and the rest of the stack come before the job's first Batch call.
    entra = FakeEntra(tmp_path / "entra")
    batch = FakeBatch(tmp_path / "batch", entra=entra)
    (tmp_path / "host").mkdir()
    host = Host(tmp_path / "host", batch, entra)
    try:
        host.stub.Configure(
            provider_pb2.ConfigureRequest(acceptSecrets=False, args=_struct({})), timeout=TIMEOUT
        )
        entra.advance(40 * 60)
        props = _inputs(batch, "github")
        job_id = _create(host, props).id
        assert job_id == JobSpec.from_props(props).job_id, host.stderr()
        # A refresh hours later (the access token has long expired) still authenticates.
        entra.advance(3 * 60 * 60)
        state = {**props, "job_id": job_id}
        read = host.stub.Read(
            provider_pb2.ReadRequest(id=job_id, urn=URN, properties=_struct(state)),
            timeout=TIMEOUT,
        )
        assert read.id == job_id
        assert not entra.refusals and not host.az_calls.exists()
        assert "Traceback" not in host.stderr()
    finally:
        host.close()
        batch.close()
        entra.close()


# ---- refusals reach the engine as one line --------------------------------------------------
# The host answers any exception a provider raises with `context.abort(UNKNOWN,
# traceback.format_exc())` (pulumi/dynamic/__main__.py, `_abort_with_traceback`), and the engine
# prints the status message as the resource's error (sdk/go/common/util/rpcutil/rpcerror). The
# user must see our one line, as the engine would print it: the gRPC error's details.


def _refusal(call: Callable[[], Any]) -> str:
    with pytest.raises(grpc.RpcError) as failed:
        call()
    assert failed.value.code() == grpc.StatusCode.UNKNOWN
    return failed.value.details()


def test_replacing_a_protected_running_job_is_refused_in_one_line(host, fake):
    news = _inputs(fake, "protected", protect_running=True, name="resnet")
    job_id = JobSpec.from_props(news).job_id
    fake.add_job(job_id, "active")
    olds = {**news, "job_id": job_id, "state": "active"}
    longer = {**news, "trainer_args": ["--model", "resnet50", "--epochs", "120"]}
    request = provider_pb2.DiffRequest(id=job_id, urn=URN, olds=_struct(olds), news=_struct(longer))
    details = _refusal(lambda: host.stub.Diff(request, timeout=TIMEOUT))
    assert details == (
        f"job resnet ({job_id}) is active, and this change would replace it (trainer_args): "
        "let it finish, cancel it (dt-jobs cancel --stack <stack> --job "
        "resnet), or add resnet to replaceJobs; a replacement with the same training settings "
        "resumes from its newest checkpoint"
    )
    assert "Traceback" not in host.stderr()


def test_a_new_image_waits_for_a_protected_running_job_and_replaces_it_once_it_ended(host, fake):
    news = _inputs(fake, "new-image", protect_running=True, name="resnet")
    job_id = JobSpec.from_props(news).job_id
    fake.add_job(job_id, "active")
    # The engine hands Diff the old outputs: the image the job started with.
    olds = {**news, "job_id": job_id, "state": "active"}
    rebuilt = {**news, "image_ref": "acr.azurecr.io/trainer:def@sha256:" + "b" * 64}
    request = provider_pb2.DiffRequest(
        id=job_id, urn=URN, olds=_struct(olds), news=_struct(rebuilt)
    )
    kept = host.stub.Diff(request, timeout=TIMEOUT)
    assert kept.changes == provider_pb2.DiffResponse.DIFF_NONE and not kept.replaces
    assert (
        f"job resnet ({job_id}) is active and keeps the image it started with "
        f"({news['image_ref']}); {rebuilt['image_ref']} replaces it with the first `pulumi up` "
        "after it ends, or now with resnet in replaceJobs"
    ) in host.stderr()
    # A preview of a rebuild knows the new image only after the build: it says so in words.
    previewed = {**news, "image_ref": rpc.UNKNOWN}
    request = provider_pb2.DiffRequest(
        id=job_id, urn=URN, olds=_struct(olds), news=_struct(previewed)
    )
    assert host.stub.Diff(request, timeout=TIMEOUT).changes == provider_pb2.DiffResponse.DIFF_NONE
    assert f"({news['image_ref']}); a new image (known after the build) replaces it" in (
        host.stderr()
    )
    assert "pulumi.output.Unknown" not in host.stderr()
    # Settings besides the image still stop the update while the job runs.
    both = {**rebuilt, "trainer_args": ["--model", "resnet50", "--epochs", "120"]}
    request = provider_pb2.DiffRequest(id=job_id, urn=URN, olds=_struct(olds), news=_struct(both))
    assert "(image_ref, trainer_args)" in _refusal(lambda: host.stub.Diff(request, timeout=TIMEOUT))
    # Once the job has ended, the next update brings the new image.
    fake.jobs[job_id]["state"] = "completed"
    request = provider_pb2.DiffRequest(
        id=job_id, urn=URN, olds=_struct(olds), news=_struct(rebuilt)
    )
    replaced = host.stub.Diff(request, timeout=TIMEOUT)
    assert list(replaced.replaces) == ["image_ref"] and replaced.deleteBeforeReplace


def test_a_failed_create_is_one_line_naming_the_job_and_the_call(host, fake):
    props = _inputs(fake, "refused-create")
    job_id = JobSpec.from_props(props).job_id
    fake.fail("POST", "/jobs", 400, "InvalidPropertyValue")
    details = _refusal(lambda: _create(host, props))
    assert details.startswith(f"create job {job_id} at {fake.url} failed: ")
    assert "InvalidPropertyValue" in details
    assert "\n" not in details and "Traceback" not in details


@pytest.fixture(scope="module")
def arm_host(tmp_path_factory, fake):
    """A host whose ARM is a fake registry that refuses every update and knows no build task."""
    registry = FakeRegistry()
    registry.refuse = (403, {"error": {"code": "AuthorizationFailed", "message": "no write"}})
    server, cert = start_arm(tmp_path_factory.mktemp("arm"), registry.handle)
    started = Host(
        tmp_path_factory.mktemp("arm-host"),
        fake,
        arm=(f"https://127.0.0.1:{server.server_port}", cert),
    )
    started.stub.Configure(
        provider_pb2.ConfigureRequest(acceptSecrets=False, args=_struct({})), timeout=TIMEOUT
    )
    yield started
    started.close()
    server.shutdown()
    server.server_close()


def _serialized(provider: Any) -> str:
    return _serialize(True, serialize_provider, provider)[0]


def test_a_registry_that_refuses_the_task_bypass_is_one_line(arm_host):
    props = {
        "registry_id": REGISTRY_ID,
        "registry_network": "[]",
        "allowed_for_tasks": None,
        "__provider": _serialized(TaskBypassProvider()),
    }
    request = provider_pb2.CreateRequest(urn=URN, properties=_struct(props), timeout=TIMEOUT)
    details = _refusal(lambda: arm_host.stub.Create(request, timeout=TIMEOUT))
    assert details.startswith(
        "could not set networkRuleBypassAllowedForTasks on registry teamacr: "
    )
    assert "AuthorizationFailed" in details and "az resource update --ids" in details
    assert "\n" not in details and "Traceback" not in arm_host.stderr()


def test_an_image_build_that_cannot_start_is_one_line(arm_host):
    props = {
        "subscription_id": SUB,
        "resource_group_name": "rg-team-dev",
        "registry_name": "teamacr",
        "task_id": f"{REGISTRY_ID}/tasks/build-trainer",
        "image": "trainer:0123456789abcdef",
        "build_args": {},
        "__provider": _serialized(ImageBuildProvider()),
    }
    request = provider_pb2.CreateRequest(urn=URN, properties=_struct(props), timeout=TIMEOUT)
    details = _refusal(lambda: arm_host.stub.Create(request, timeout=TIMEOUT))
    assert details.startswith("could not read build task build-trainer: HTTP 404")
    assert "\n" not in details and "Traceback" not in arm_host.stderr()


def test_a_create_batch_answers_late_and_twice_is_one_job_that_a_refresh_keeps(host, fake):
    """The job add's answer is lost after the commit (503: the SDK resends it and meets 409
    JobExists), then Batch does not show the job for two requests, nor to the refresh right
    after: one job, with its task, adopted and kept."""
    props = _inputs(fake, "eventual")
    job_id = JobSpec.from_props(props).job_id
    fake.commit_then_fail("POST", "/jobs")
    fake.invisible_after_create = 2
    try:
        created = _create(host, props)
    finally:
        fake.invisible_after_create = 0
    assert created.id == job_id and f"DELETE /jobs/{job_id}" not in fake.calls()
    assert [t["id"] for t in fake.tasks[job_id]] == [TASK_ID]
    assert fake.jobs[job_id]["onAllTasksComplete"] == "terminatejob"
    fake.hide(job_id, 2)
    read = host.stub.Read(
        provider_pb2.ReadRequest(id=job_id, urn=URN, properties=created.properties),
        timeout=TIMEOUT,
    )
    assert read.id == job_id and _dict(read.properties)["state"] == "active"


AML_WORKSPACE = (
    "/subscriptions/00000000-0000-0000-0000-00000000abcd/resourceGroups/rg-team-dev/providers/"
    "Microsoft.MachineLearningServices/workspaces/mlw-team-dev"
)


@pytest.fixture
def aml_host(tmp_path, fake):
    """A host whose ARM is the fake AzureML jobs API, where the host's token may read jobs."""
    jobs = FakeAzuremlJobs(tmp_path / "nodes", writers={"fake-token"})
    (tmp_path / "arm").mkdir()
    (tmp_path / "host").mkdir()
    server, cert = start_arm(tmp_path / "arm", jobs.handle)
    started = Host(tmp_path / "host", fake, arm=(f"https://127.0.0.1:{server.server_port}", cert))
    started.stub.Configure(
        provider_pb2.ConfigureRequest(acceptSecrets=False, args=_struct({})), timeout=TIMEOUT
    )
    yield jobs, started
    started.close()
    server.shutdown()
    server.server_close()


@pytest.mark.processes
@pytest.mark.usefixtures("no_leftover_processes")
def test_replacing_a_protected_running_azureml_job_is_refused_in_one_line(aml_host):
    jobs, host = aml_host
    auth = {"Authorization": "Bearer fake-token"}
    body = {"properties": {"jobType": "Command", "command": "sleep 120"}}
    assert jobs.handle("PUT", f"{AML_WORKSPACE}/jobs/dev-train-1", {}, auth, body)[0] == 201
    jobs.wait("dev-train-1", states=("Running",))
    old = {
        "job": job_arm_id(AML_WORKSPACE, "dev-train-1"),
        "label": "train",
        "protect_running": True,
        "__provider": _serialized(AzuremlJobGuardProvider()),
    }
    new = {**old, "job": job_arm_id(AML_WORKSPACE, "dev-train-2")}
    request = provider_pb2.DiffRequest(id=old["job"], urn=URN, olds=_struct(old), news=_struct(new))
    details = _refusal(lambda: host.stub.Diff(request, timeout=TIMEOUT))
    assert details.startswith("job train (dev-train-1) is Running on AzureML, and this change ")
    assert "add train to replaceJobs" in details
    assert "\n" not in details and "Traceback" not in host.stderr()
    jobs.handle("POST", f"{AML_WORKSPACE}/jobs/dev-train-1/cancel", {}, auth, None)
    assert jobs.wait("dev-train-1") == "Canceled"
