"""How the stack wires the TrainingJob resource, under Pulumi's mocks."""

import json

from dt_commands.plan import evaluate
from infra.trainer_command import job_trainer
from tests.support.stacks import one, stack_values
from trainer.settings.flags import to_flags


def test_job_takes_the_image_digest_and_the_pool_and_waits_for_the_cluster(dev_plan):
    job = one(dev_plan, "pulumi-python:dynamic:Resource")
    pool = one(dev_plan, "azure-native:batch:Pool")
    account = one(dev_plan, "azure-native:batch:BatchAccount")
    nodes = one(dev_plan, "azure-native:managedidentity:UserAssignedIdentity", "-nodes")
    s = dev_plan.settings
    assert job.inputs["image_ref"] == dev_plan.outputs["image_ref"]  # data dependency on image
    assert job.inputs["pool_id"] == pool.inputs["poolName"] == "ib-gpu"
    assert job.inputs["endpoint"] == f"https://{dev_plan.outputs['batch_account_endpoint']}"
    assert job.inputs["account_id"].endswith(f"/batch/{account.inputs['accountName']}")
    assert (
        job.inputs["node_count"] == s.cluster.node_count
        and job.inputs["vm_size"] == s.cluster.vm_size
    )
    assert job.inputs["node_identity_client_id"] == f"client-{nodes.name}"
    trainer = s.jobs[0].trainer
    own = job_trainer(trainer.values, trainer.config, staged=bool(s.jobs[0].dataset_prefix))
    # The settings cross Pulumi's engine as data (pairs of text or a switch's bool, in the
    # file's order) and render the flags the job's id hashes.
    assert job.inputs["trainer_settings"] == [list(pair) for pair in own] != []
    assert job.inputs["trainer_args"] == to_flags(dict(own))
    assert job.inputs["dataset_prefix"] == ""
    assert job.inputs["blob_endpoint"].endswith(".blob.core.windows.net/")
    assert dev_plan.depends_on[job.name] == ["platform-dev"]  # the GpuCluster component
    assert dev_plan.outputs["job_id"].startswith("dev-")
    assert dev_plan.outputs["job_state"] == "active"
    assert dev_plan.outputs["job_log_url"].endswith(f"/logs/{dev_plan.outputs['job_id']}/")


def test_submit_job_false_stands_up_the_environment_only():
    plan = evaluate("dev", {**stack_values("dev"), "gpu-cluster:submitJob": False})
    assert not any(r.typ == "pulumi-python:dynamic:Resource" for r in plan.resources)
    assert "job_id" not in plan.outputs and "image_ref" in plan.outputs


def test_dataset_prefix_switches_the_job_to_staged_shards():
    plan = evaluate("dev", {**stack_values("dev"), "gpu-cluster:datasetPrefix": "imagenet"})
    job = one(plan, "pulumi-python:dynamic:Resource")
    assert job.inputs["dataset_prefix"] == "imagenet"
    assert "--data" not in job.inputs["trainer_args"]  # the job sets data and data_dir
    assert json.dumps(job.inputs["trainer_args"]).count("--backend") == 0
