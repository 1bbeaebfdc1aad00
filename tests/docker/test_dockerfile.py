"""The trainer image's Dockerfile, checked without a Docker engine: hadolint, pins, layout."""

import re
import subprocess
import sys
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DOCKERFILE = REPO / "docker" / "Dockerfile"
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


def test_base_is_pinned_by_digest_and_horovod_comes_from_the_shared_script():
    text = DOCKERFILE.read_text()
    assert "FROM ${BASE_IMAGE}@${BASE_DIGEST}" in text
    assert "build_horovod.sh python /tmp/wheels gpu" in text
    # Requirements are installed before the trainer sources are copied (layer caching).
    assert text.index("COPY docker/requirements.txt") < text.index("COPY trainer")
    assert re.search(r"^USER 1000:1000$", text, re.M)
    assert "horovodrun --check-build" in text and "[X] NCCL" in text


def test_dockerignore_admits_only_what_the_build_copies():
    allowed = [
        line[1:].rstrip("/")
        for line in (REPO / ".dockerignore").read_text().splitlines()
        if line.startswith("!")
    ]
    copied = re.findall(r"^COPY (.+) \S+$", DOCKERFILE.read_text(), re.M)
    sources = {source for line in copied for source in line.split()}
    assert sources == set(allowed)
