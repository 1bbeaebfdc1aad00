"""From a change to a team's code to the first training step of the changed job, in the Batch
node emulator, split into its parts (a benchmark: prints and saves, asserts nothing).

    .venv/bin/python -m bench.code_change [--rounds 3]    (root: the emulator's nodes need it)

Each round changes the code (the torchrun example with a requirements file naming a wheel of the
team's own), then: snapshot (``infra.code_snapshot``), upload (to the emulated storage account,
as ``pulumi up``'s CodeUpload does), scheduling (the job submitted, until the nodes' job
preparation starts), fetch and install (each node's preparation, as ``trainer.launch.code_folder``
reports them; the slower node counts), start (the preparation's end to the first step in the
run's metrics). Replacing the old job (its terminate and checkpoint) is Pulumi's and left out.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time

from bench.common import REPO, save
from trainer.common.cli import OneLineParser, fail, int_in

PARTS = ("snapshot", "upload", "scheduling", "fetch", "install", "start", "total")


def measure_round(make_cluster, vnet, storage, cpu_stack, folder) -> dict[str, float]:
    """One code change on a fresh pool (pytest fixtures of the emulator, ``folder`` a temp
    folder); the seconds of each part."""
    from infra.code_snapshot import snapshot
    from tests.batch_emulator.jobs import (
        booted,
        make_spec,
        metrics,
        run_folder,
        submit,
        team_repo,
        upload_snapshot,
    )
    from tests.batch_emulator.nfs_view import NFS_VIEW_LONG_SECONDS

    # The change: the torchrun example with a line of its own, so each round is a new hash.
    script = folder / "changed" / "train.py"
    script.parent.mkdir(parents=True)
    example = (REPO / "examples" / "torchrun_ddp" / "train.py").read_text()
    script.write_text(f"{example}\n# change {time.time_ns()}\n")
    repo = team_repo(folder, "team", {"train.py": script})
    # The emulator's long NFS delays (the tests mostly take short ones): the start part waits
    # on them (the rendezvous token), and the figures in docs/benchmarks.md were taken with them.
    cluster = booted(make_cluster, cpu_stack, lifecycle="kill", nfs_view=(0, NFS_VIEW_LONG_SECONDS))

    changed = time.monotonic()
    snap = snapshot("team", repo)
    snapped = time.monotonic()
    upload_seconds = upload_snapshot(vnet, storage, folder, snap)
    uploaded = time.monotonic()
    command = ("python", "train.py", "--steps", "100000")
    spec = make_spec(cpu_stack, storage, trainer={}, command=command, engine="torch",
                     code_sha256=snap.sha256)  # fmt: skip
    run = submit(cluster, spec)
    run_dir = run_folder(cluster, spec)
    deadline = time.monotonic() + 300
    while not metrics(run_dir):
        if run.finished.is_set() or time.monotonic() > deadline:
            raise RuntimeError(f"no first step: {cluster.events[-10:]}")
        time.sleep(0.1)
    first_step = time.monotonic()
    run.terminate("kill")
    run.wait(60)
    cluster.close()  # the next round's pool takes the same addresses

    def event_times(pattern: str) -> list[float]:
        return [float(e.split()[0]) for e in cluster.events if re.search(pattern, e)]

    prep_started = min(event_times(r"started prep-n\d+-try0"))
    prep_ended = max(event_times(r"job preparation try 0 exited 0"))
    said = "".join(run.prep_output(node) for node in run.nodes)
    fetch = max(float(s) for s in re.findall(r"fetch ([\d.]+) s", said))
    install = max(float(s) for s in re.findall(r"install ([\d.]+) s", said))
    return {
        "snapshot": snapped - changed,
        "upload": upload_seconds,  # the upload itself, not the helper's start
        "scheduling": prep_started - uploaded,
        "fetch": fetch,
        "install": install,
        "start": first_step - prep_ended,
        "total": first_step - changed,
    }


def test_code_change_to_first_step(make_cluster, vnet, storage, cpu_stack, tmp_path, request):
    """Run by ``main`` through pytest, for the emulator's fixtures."""
    rounds = [
        measure_round(make_cluster, vnet, storage, cpu_stack, tmp_path / f"round-{i}")
        for i in range(int(request.config.getoption("--rounds")))
    ]
    (tmp_path.parent / "code_change_rounds.json").write_text(json.dumps(rounds))
    print(json.dumps(rounds))


def pytest_addoption(parser) -> None:
    parser.addoption("--rounds", default="3")


def main() -> int:
    parser = OneLineParser(prog="python -m bench.code_change", description=__doc__)
    parser.add_argument("--rounds", type=int_in(1, 20), default=3, help="code changes to time")
    args = parser.parse_args()
    if os.geteuid() != 0:
        fail("bench.code_change runs the Batch node emulator, which needs root (namespaces)", 1)
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider",
         "-p", "tests.batch_emulator.fixtures", "-p", "bench.code_change",
         f"--rounds={args.rounds}", "-o", "addopts=",
         f"{__file__}::test_code_change_to_first_step"],
        cwd=REPO, capture_output=True, text=True,
    )  # fmt: skip
    found = [line for line in result.stdout.splitlines() if line.startswith("[{")]
    if result.returncode != 0 or not found:
        print(result.stdout[-3000:] + result.stderr[-2000:], file=sys.stderr)
        return result.returncode or 1
    rounds = json.loads(found[-1])
    print(f"{'part':<11}" + "".join(f"{f'round {i + 1}':>10}" for i in range(len(rounds))))
    for part in PARTS:
        print(f"{part:<11}" + "".join(f"{r[part]:>9.2f}s" for r in rounds))
    medians = {part: sorted(r[part] for r in rounds)[len(rounds) // 2] for part in PARTS}
    shares = ", ".join(f"{p} {medians[p] / medians['total']:.0%}" for p in PARTS[:-1])
    print(f"median total {medians['total']:.1f} s: {shares}")
    save("code_change", {"rounds": rounds, "median_seconds": medians})
    return 0


if __name__ == "__main__":
    sys.exit(main())
