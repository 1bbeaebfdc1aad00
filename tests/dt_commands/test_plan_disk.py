"""The node's OS disk in the offline plan: the HPC image's part, the trainer image's estimate
and whether the disk holds both while the image is pulled."""

from __future__ import annotations

from dt_commands.plan import disk_lines
from infra import toolchain
from infra.settings.stack import StackSettings
from infra.settings.values import load_schema
from tests.support.stacks import stack_values


def _settings(**values) -> StackSettings:
    return StackSettings.from_mapping("dev", {**stack_values("dev"), **values}, load_schema())


def test_the_default_disk_holds_the_hpc_image_and_the_trainer_image_while_it_is_pulled():
    s = _settings()
    image = s.cluster.gpu.image
    peak = image.os_used_gb + toolchain.image_unpacked_gb() * (1 + toolchain.PULL_OVERHEAD)
    assert peak <= s.cluster.os_disk_size_gb and image.os_disk_gb < s.cluster.os_disk_size_gb
    first, *parts = disk_lines(s)
    assert first.startswith(f"Node OS disk (osDiskSizeGb): {s.cluster.os_disk_size_gb} GB; fits")
    assert f"about {toolchain.image_unpacked_gb():g} GB unpacked" in parts[1]
    # Every part of the estimate is named with how it was found.
    assert all(f"{label} {size:g}" in parts[1] for label, size in toolchain.IMAGE_PARTS_GB)
    assert all(
        label.endswith(("(measured)", "(estimated)")) for label, _ in toolchain.IMAGE_PARTS_GB
    )


def test_a_disk_that_cannot_take_the_pull_says_so(monkeypatch):
    # An image as large as one on a CUDA devel base (its toolkit alone is several GB).
    devel = (("a CUDA 13.0 devel base, torch and the toolchain (estimated)", 16.0),)
    monkeypatch.setattr(toolchain, "IMAGE_PARTS_GB", devel)
    (first, *_) = disk_lines(_settings(osDiskSizeGb=64))
    assert first == "Node OS disk (osDiskSizeGb): 64 GB; TOO SMALL: raise osDiskSizeGb"
    (first, *_) = disk_lines(_settings())
    assert "; fits, " in first
