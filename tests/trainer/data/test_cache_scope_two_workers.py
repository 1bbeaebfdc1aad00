"""One cache per node: two DDP ranks on one host, measured by the shared memory they map.

Each rank (and one of its loader workers) reports the cache files it maps, read from
/proc/<pid>/maps, with inode and size (``tests/trainer/cache_report.py``). Summing distinct inodes
over the ranks gives the node's cache memory. The images have varied sizes, so the exact byte count
(computed here from their headers, as the cache does) is not a multiple of a constant.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import torch
from PIL import Image

from tests.conftest import tiny_config
from tests.support.launchers import torchrun
from trainer.data.cache import cached_shape
from trainer.data.folder import scan_image_folder
from trainer.data.node_memory import PREFIX, SHM_DIR
from trainer.data.sampler import PartSampler, RankSampler
from trainer.settings.train_config import DEFAULTS

# Real multi-process runs (make test runs them one at a time), none of whose processes may
# outlive its test (tests/support/process_tree.py).
pytestmark = [pytest.mark.processes, pytest.mark.usefixtures("no_leftover_processes")]

IMAGE_SIZE, BATCH, CLASSES, PER_CLASS = 16, 4, 3, 13  # 39 images a split: rank scope drops 1


def varied_folder(root: Path) -> Path:
    """train/ and val/ of ``CLASSES`` x ``PER_CLASS`` images, each of its own size."""
    generator = torch.Generator().manual_seed(1)
    for split in ("train", "val"):
        for label in range(CLASSES):
            folder = root / split / f"class{label}"
            folder.mkdir(parents=True)
            for i in range(PER_CLASS):
                height, width = (int(v) for v in torch.randint(12, 60, (2,), generator=generator))
                pixels = torch.randint(0, 256, (height, width, 3), generator=generator)
                image = Image.fromarray(pixels.to(torch.uint8).numpy())
                image.save(folder / f"img{i}{'.png' if i % 2 else '.jpg'}")
    return root


def decoded_bytes(path: str) -> int:
    """What a decoded cache holds for one image: its pixels at the cached (validation) size."""
    with Image.open(path) as image:
        height, width = cached_shape(*image.size, IMAGE_SIZE)
    return height * width * 3


def run_two_ranks(tmp_path: Path, repo: Path, scope: str) -> tuple[list[dict], Path]:
    data = varied_folder(tmp_path / "images")
    config = tiny_config(
        tmp_path / "out",
        backend="ddp",
        data="folder",
        data_dir=str(data),
        num_classes=CLASSES,
        image_size=IMAGE_SIZE,
        batch_size=BATCH,
        cache="decoded",
        cache_scope=scope,
        loader_workers=1,
        epochs=2,
    )
    script = str(repo / "tests" / "trainer" / "cache_report.py")
    command = torchrun(script, str(tmp_path / "reports"), json.dumps(config))
    result = subprocess.run(command, cwd=repo, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    reports = [json.loads((tmp_path / "reports" / f"rank-{r}.json").read_text()) for r in (0, 1)]
    return reports, data


def node_usage(reports: list[dict]) -> tuple[int, dict[int, dict]]:
    """Bytes of cache files mapped on the node (distinct inodes) and the files by inode."""
    files = {m["inode"]: m for r in reports for m in r["rank_maps"] + r["worker_maps"]}
    return sum(m["size"] for m in files.values()), files


def check_run(reports: list[dict]) -> None:
    """Training ran on both ranks to the same weights; every rank's loader worker maps the
    rank's own files (the same pages), not a copy; nothing is left in /dev/shm."""
    assert [r["size"] for r in reports] == [2, 2]
    assert reports[0]["step"] == reports[1]["step"] == 2 * (PER_CLASS * CLASSES // 2 // BATCH)
    assert reports[0]["params_sha256"] == reports[1]["params_sha256"]
    for report in reports:
        rank_inodes = {m["inode"] for m in report["rank_maps"]}
        worker_inodes = {m["inode"] for m in report["worker_maps"]}
        assert worker_inodes and worker_inodes <= rank_inodes
        for mapping in report["rank_maps"]:
            # tmpfs pages really allocated for the whole file: memory, not a sparse promise.
            assert mapping["size"] <= mapping["allocated"] < mapping["size"] + 2 * 4096
    pids = {str(r["pid"]) for r in reports}
    left = [p.name for p in SHM_DIR.glob(PREFIX + "-*") if p.name.split("-")[3] in pids]
    assert left == []


def test_node_scope_holds_one_copy_per_node(tmp_path, repo):
    reports, data = run_two_ranks(tmp_path, repo, "node")
    check_run(reports)
    one_copy = {
        split: sum(decoded_bytes(path) for path, _ in scan_image_folder(data / split)[1])
        for split in ("train", "val")
    }
    assert [r["computed"] for r in reports] == [one_copy, one_copy]
    used, files = node_usage(reports)
    # One file per split, mapped by both ranks and their workers: the node holds one copy.
    assert len(files) == 2
    assert {m["inode"] for m in reports[0]["rank_maps"]} == set(files)
    assert {m["inode"] for m in reports[1]["rank_maps"]} == set(files)
    assert used == one_copy["train"] + one_copy["val"]
    # One copy per rank, as before node scope, would have been twice as much.
    assert 2 * used == len(reports) * sum(one_copy.values())


def test_rank_scope_holds_one_copy_in_parts(tmp_path, repo):
    reports, data = run_two_ranks(tmp_path, repo, "rank")
    check_run(reports)
    samples = {split: scan_image_folder(data / split)[1] for split in ("train", "val")}
    one_copy = {s: sum(decoded_bytes(p) for p, _ in samples[s]) for s in samples}
    count = CLASSES * PER_CLASS
    # Each rank holds what its sampler reads every epoch, derived here from the samplers.
    for rank, report in enumerate(reports):
        train = PartSampler(count, 2, rank, BATCH, seed=DEFAULTS.seed).part()
        val = RankSampler(count, 2, rank, BATCH, shuffle=False).part()
        assert report["cached"] == {"train": train, "val": val}
        parts = {"train": train, "val": val}
        assert report["computed"] == {
            s: sum(decoded_bytes(samples[s][i][0]) for i in parts[s]) for s in samples
        }
    assert not set(reports[0]["cached"]["train"]) & set(reports[1]["cached"]["train"])
    used, files = node_usage(reports)
    assert len(files) == 4  # a train and a val file per rank, each mapped by its rank only
    assert used == sum(sum(r["computed"].values()) for r in reports)
    # Train: one copy but the one sample the 2-rank split drops; val: the samples read.
    train_used = sum(r["computed"]["train"] for r in reports)
    dropped = set(range(count)) - {i for r in reports for i in r["cached"]["train"]}
    assert len(dropped) == count % 2 == 1
    assert train_used == one_copy["train"] - sum(
        decoded_bytes(samples["train"][i][0]) for i in dropped
    )
    assert used <= sum(one_copy.values()) < 2 * used
