"""The trainer image's Dockerfile, checked without a Docker engine: hadolint, pins, layout, the
base reference as BuildKit resolves it, and the CUDA set against torch's wheel metadata."""

import json
import re
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

import pytest
from docker_image.reference import Reference, ReferenceInvalidFormat
from dockerfile_parse import DockerfileParser
from packaging.requirements import Requirement

from infra.image_inputs import IMAGE_INPUTS
from infra.settings.stack import StackSettings
from infra.settings.values import load_schema
from infra.toolchain import CUDA, MIN_DRIVER, base_reference, cuda_of_base
from tests.support.stacks import stack_values

REPO = Path(__file__).resolve().parents[2]
DOCKERFILE = REPO / "docker" / "Dockerfile"
GPU_WHEEL_SCRIPT = REPO / "scripts" / "build_gpu_wheel.sh"
HADOLINT = Path(sys.executable).parent / "hadolint"


def test_hadolint_is_clean():
    result = subprocess.run(
        [str(HADOLINT), "--no-color", str(DOCKERFILE)], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_hadolint_finds_problems_in_a_bad_dockerfile(tmp_path):
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM ubuntu\nRUN apt-get install curl\n")
    result = subprocess.run([str(HADOLINT), "--no-color", str(bad)], capture_output=True, text=True)
    assert result.returncode != 0 and "DL3006" in result.stdout


def test_image_lock_matches_the_project_pins():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    pins = {d.split("==")[0]: d for d in project["dependencies"] if d.split("==")[0] != "torch"}
    lock = [
        line.strip()
        for line in (REPO / "docker" / "requirements.txt").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert sorted(lock) == sorted(pins.values())
    torch_pin = next(d for d in project["dependencies"] if d.startswith("torch=="))
    assert f"ARG TORCH_VERSION={torch_pin.split('==')[1]}" in DOCKERFILE.read_text()
    # The Horovod build links the same torch the image runs.
    assert f"TORCH_VERSION={torch_pin.split('==')[1]}\n" in GPU_WHEEL_SCRIPT.read_text()


def _stages() -> tuple[str, str]:
    """The builder stage's text and the runtime stage's text."""
    builder, runtime = re.split(r"^FROM \$\{BASE_IMAGE\}.*$", DOCKERFILE.read_text(), flags=re.M)[
        1:
    ]
    return builder, runtime


def _from_reference(build_args: dict[str, str]) -> str:
    """The FROM reference BuildKit resolves with these build args (global ARG defaults apply)."""
    return DockerfileParser(str(DOCKERFILE), build_args=build_args).baseimage


@pytest.mark.parametrize("stack", ["dev", "vision-prod"])
@pytest.mark.parametrize("digest", ["", "sha256:" + "ab" * 32])
def test_the_base_reference_the_stack_builds_from_is_a_valid_image_reference(stack, digest):
    values = {**stack_values(stack), "gpu-cluster:imageBaseDigest": digest}
    s = StackSettings.from_mapping(stack, values, load_schema())
    reference = _from_reference({"BASE_IMAGE": base_reference(s.image.base, s.image.base_digest)})
    parsed = Reference.parse_normalized_named(reference)  # distribution's grammar; raises if bad
    assert parsed["tag"] == s.image.base.rsplit(":", 1)[1]
    assert parsed["digest"] == (digest or None)


def test_the_dockerfile_default_base_is_the_schema_default_and_an_empty_digest_is_no_reference():
    assert _from_reference({}) == load_schema()["imageBase"]["default"]
    # What the old `FROM ${BASE_IMAGE}@${BASE_DIGEST}` gave with the default empty digest.
    with pytest.raises(ReferenceInvalidFormat):
        Reference.parse_normalized_named(load_schema()["imageBase"]["default"] + "@")


def test_horovod_comes_from_the_script_make_test_runs_and_the_runtime_stays_slim():
    builder, runtime = _stages()
    # The builder compiles Horovod with scripts/build_gpu_wheel.sh, the script `make test`
    # builds and checks the same wheel with (tests/docker/test_gpu_wheel.py), before it sees the
    # trainer's sources (a trainer change rebuilds no Horovod).
    wheel = builder.index("/build/scripts/build_gpu_wheel.sh /build/cache")
    assert wheel < builder.index("COPY trainer")
    # The runtime stage: no compiler, no CUDA toolkit, no MPI; the wheel comes from the builder.
    for heavy in ("build-essential", "cmake", "-dev ", "openmpi", "cuda-toolkit", "nvcc"):
        assert heavy not in runtime, heavy
    assert "COPY --from=builder /build/wheels/" in runtime
    # Requirements are installed before the trainer sources are copied (layer caching).
    assert runtime.index("COPY docker/requirements.txt") < runtime.index("COPY trainer")
    assert re.search(r"^USER 1000:1000$", runtime, re.M)
    assert "horovodrun --check-build" in runtime and "[X] NCCL" in runtime
    # The container runtime mounts libcuda only for the compute capability.
    assert "NVIDIA_DRIVER_CAPABILITIES=compute,utility" in runtime


def test_the_region_decoder_is_built_from_the_copied_sources_and_checked():
    builder, runtime = _stages()
    # Built in the builder from the sources it copied, with the build environment's python
    # (the script loads the module alone, so numpy suffices), against libjpeg-turbo's headers.
    assert builder.index("COPY trainer") < builder.index("build_jpeg_region.sh")
    assert re.search(r"apt-get install[^&]*\blibjpeg-dev\b", builder)
    # The runtime takes the library where the trainer loads it (sys.prefix/lib/trainer), has
    # libjpeg-turbo's runtime library, and the smoke test loads the decoder after USER.
    assert "COPY --from=builder /build/libjpeg_region.so /opt/venv/lib/trainer/" in runtime
    assert re.search(r"apt-get install[^&]*\blibjpeg62-turbo\b", runtime)
    assert runtime.index("ENV PYTHONPATH=/opt/trainer") < runtime.index("USER 1000:1000")
    assert runtime.index("USER 1000:1000") < runtime.index("r.available()")


def _torch_wheel_requirements(version: str) -> list[Requirement]:
    """torch's Linux x86_64 wheel metadata for CPython 3.11 as pip resolves it from the index:
    ``--isolated`` ignores local wheel folders that hold CPU builds."""
    with tempfile.TemporaryDirectory() as target:
        result = subprocess.run(
            [
                sys.executable, "-m", "pip", "--isolated", "install", "--dry-run", "--quiet",
                "--report", "-", "--no-deps", "--target", target, "--only-binary=:all:",
                "--platform", "manylinux_2_28_x86_64", "--python-version", "3.11",
                f"torch=={version}",
            ],
            capture_output=True, text=True, timeout=300,
        )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    (item,) = json.loads(result.stdout)["install"]
    return [Requirement(r) for r in item["metadata"]["requires_dist"]]


def test_base_image_torch_wheel_nccl_and_driver_floor_are_one_cuda_set():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    torch_pin = next(d for d in project["dependencies"] if d.startswith("torch=="))
    requirements = {r.name: r for r in _torch_wheel_requirements(torch_pin.split("==")[1])}
    # The wheel pins its CUDA toolkit exactly (==13.0.3): its major.minor is the image's CUDA.
    (toolkit,) = requirements["cuda-toolkit"].specifier
    assert toolkit.operator == "==" and toolkit.version.rsplit(".", 1)[0] == CUDA
    # Horovod links the NCCL of the same wheel set (nvidia-nccl-cu<major>).
    assert f"nvidia-nccl-cu{CUDA.split('.')[0]}" in requirements
    assert "nvidia.nccl" in GPU_WHEEL_SCRIPT.read_text()
    # Horovod is compiled with the toolkit torch's wheel pins: nvcc, headers and cudart alike.
    pinned = re.search(
        r'CUDA_TOOLKIT="cuda-toolkit\[[^]]*\]==([\d.]+)"', GPU_WHEEL_SCRIPT.read_text()
    )
    assert pinned and pinned.group(1) == toolkit.version
    # The base carries no CUDA of its own: torch's wheels bring it.
    assert cuda_of_base(load_schema()["imageBase"]["default"]) is None
    # R580 is the driver branch for CUDA 13.x (NVIDIA's data-center support matrix).
    assert CUDA.startswith("13.") and MIN_DRIVER.split(".")[0] == "580"


def test_dockerignore_admits_only_what_the_build_copies():
    allowed = [
        line[1:].rstrip("/")
        for line in (REPO / ".dockerignore").read_text().splitlines()
        if line.startswith("!")
    ]
    # What the build context gives (COPY --from copies between stages).
    copied = re.findall(r"^COPY (?!--from)(.+) \S+$", DOCKERFILE.read_text(), re.M)
    sources = {source for line in copied for source in line.split()}
    assert sources == set(allowed)
    # The content tag hashes exactly what the build can see, plus the Dockerfile itself.
    assert set(IMAGE_INPUTS) == {*allowed, "docker/Dockerfile"}
