"""A background save copies the optimizer's tensors while the next step runs: the copy must
still hold exactly the state at the save step, and no way of stepping may change a parameter
before the copy is complete."""

from __future__ import annotations

import functools
import threading
import time
from concurrent.futures import Future
from typing import Any

import pytest
import torch

from tests.trainer.engines.test_gpu import require_gpu
from trainer.checkpoints.background import HostStaging, StepFence, snapshot_unguarded
from trainer.engines.base import Dist, cpu_copy
from trainer.engines.local import LocalDist
from trainer.models.build import build_model
from trainer.settings.train_config import TrainConfig
from trainer.training.optim import build_optimizer

CPU = torch.device("cpu")
HELD = 0.3  # seconds a deliberately slow copy holds the step back


def tiny_training(
    optimizer: str, device: torch.device = CPU
) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """The test CNN (two BatchNorm layers) and the trainer's optimizer for it."""
    torch.manual_seed(0)
    model = build_model("tiny", 10).to(device)
    cfg = TrainConfig(optimizer=optimizer, lr=0.05, weight_decay=1e-4)
    return model, build_optimizer(cfg, model)


def forward_backward(
    model: torch.nn.Module, seed: int, scaler: torch.amp.GradScaler | None = None
) -> None:
    generator = torch.Generator().manual_seed(seed)
    images = torch.randn(8, 3, 16, 16, generator=generator)
    labels = torch.randint(0, 10, (8,), generator=generator)
    device = next(model.parameters()).device
    model.zero_grad()
    loss = torch.nn.functional.cross_entropy(model(images.to(device)), labels.to(device))
    (loss if scaler is None else scaler.scale(loss)).backward()


def leaves(value: Any, path: tuple[Any, ...] = ()) -> dict[tuple[Any, ...], Any]:
    """Every value of a nested state dict by its path, containers' types included."""
    if isinstance(value, dict):
        found: dict[tuple[Any, ...], Any] = {path: dict}
        for k, v in value.items():
            found.update(leaves(v, (*path, k)))
        return found
    if isinstance(value, (list, tuple)):
        found = {path: type(value)}
        for i, v in enumerate(value):
            found.update(leaves(v, (*path, i)))
        return found
    return {path: value}


def assert_bit_equal(actual: Any, expected: Any) -> None:
    got, want = leaves(actual), leaves(expected)
    assert got.keys() == want.keys()
    for path, value in want.items():
        if not torch.is_tensor(value):
            assert got[path] == value, path
            continue
        other = got[path]
        assert other.dtype == value.dtype and other.shape == value.shape, path
        assert torch.equal(other.reshape(-1).view(torch.uint8), value.reshape(-1).view(torch.uint8))


def whole(state: dict[str, Any]) -> dict[str, Any]:
    """A sharded state's entries with every DTensor gathered into a whole tensor."""
    return {k: v.full_tensor() if hasattr(v, "full_tensor") else v for k, v in state.items()}


def slow_background_copy(monkeypatch: pytest.MonkeyPatch) -> threading.Event:
    """Holds HostStaging's background copy until the returned event is set (the real copy then
    runs), so the next step's forward and backward surely run while it is in flight."""
    release = threading.Event()
    real_copy = HostStaging._copy

    def held_copy(self: HostStaging, pairs: Any, stream: Any) -> None:
        if threading.current_thread() is not threading.main_thread():
            release.wait(timeout=30)
        real_copy(self, pairs, stream)

    monkeypatch.setattr(HostStaging, "_copy", held_copy)
    return release


def step_blocked_for(action: Any, release: Any) -> float:
    """Seconds ``action`` (a step) took when ``release`` runs HELD seconds after it starts."""
    timer = threading.Timer(HELD, release)
    started = time.monotonic()
    timer.start()
    try:
        action()
    finally:
        timer.join()
    return time.monotonic() - started


@pytest.mark.parametrize("device", ["cpu", "cuda"])
@pytest.mark.parametrize("optimizer", ["sgd", "adamw"])
def test_an_overlapped_copy_holds_exactly_the_state_of_the_save_step(
    optimizer, device, monkeypatch
):
    if device == "cuda":
        require_gpu()
    model, opt = tiny_training(optimizer, torch.device(device))
    fence = StepFence(opt)
    staging = HostStaging(fence, torch.device(device))
    for seed in range(2):  # momentum and moments exist from the first step on
        forward_backward(model, seed)
        opt.step()
    release = slow_background_copy(monkeypatch)
    targets: list[int] = []
    for save in range(2):
        live = {"model": model.state_dict(), "optimizer": opt.state_dict(), "step": save}
        expected = cpu_copy(live)  # the synchronous copy, taken at the save step
        release.clear()
        copy = staging.stage(live)
        # The next step: forward updates BatchNorm's running statistics and step() (held back
        # by the fence until the copy ends) the parameters, momentum and moments.
        forward_backward(model, 10 + save)
        assert not copy.done()
        assert step_blocked_for(opt.step, release.set) >= HELD
        staged = copy.result()
        assert_bit_equal(staged, expected)
        now = cpu_copy(model.state_dict())
        for changed in ("features.1.running_mean", "fc.weight"):
            assert not torch.equal(now[changed], expected["model"][changed])
        # The staging tensors are allocated at the first save and reused by the next.
        copies = [v for v in leaves(staged).values() if torch.is_tensor(v)]
        # On a GPU, into pinned host memory (device-to-host copies run asynchronously).
        assert all(not t.is_cuda and t.is_pinned() == (device == "cuda") for t in copies)
        ptrs = [t.data_ptr() for t in copies]
        assert targets in ([], ptrs)
        targets = ptrs
    staging.close()


@pytest.fixture(scope="module")
def horovod() -> Any:
    """Horovod in this process, one rank, started once (it cannot start again after a
    shutdown in the same process); its settings come from the environment, restored after."""
    from trainer.engines.horovod import HorovodDist

    with pytest.MonkeyPatch.context() as env:
        env.setenv("HOROVOD_CYCLE_TIME", "1")
        env.setenv("HOROVOD_FUSION_THRESHOLD", str(1 << 20))
        dist = HorovodDist()
        yield dist
        dist.shutdown()


@pytest.mark.parametrize(
    ("engine", "optimizer", "scaled", "clip_norm"),
    [
        ("local", "sgd", False, 0.0),
        ("local", "lars", False, 0.0),
        ("local", "adamw", True, 1.0),  # GradScaler unscales, the norm is clipped, then step
        ("horovod", "sgd", False, 0.0),  # DistributedOptimizer.step reduces, then steps
        ("horovod", "lars", True, 1.0),  # synchronize, unscale, clip, skip_synchronize, step
    ],
)
def test_every_way_of_stepping_waits_for_the_copy(engine, optimizer, scaled, clip_norm, request):
    model, opt = tiny_training(optimizer)
    dist: Dist = request.getfixturevalue("horovod") if engine == "horovod" else LocalDist()
    opt = dist.wrap_optimizer(opt, model, TrainConfig(optimizer=optimizer))
    fence = StepFence(opt)
    scaler = torch.amp.GradScaler("cpu", enabled=scaled)
    forward_backward(model, 0, scaler)
    before = [p.detach().clone() for p in model.parameters()]
    slow_copy: Future[None] = Future()
    fence.hold(slow_copy)
    unchanged_while_copying: list[bool] = []

    def copy_ends() -> None:
        params = zip(before, model.parameters(), strict=True)
        unchanged_while_copying.append(all(torch.equal(a, p) for a, p in params))
        slow_copy.set_result(None)

    step = functools.partial(dist.optimizer_step, opt, scaler, clip_norm)
    assert step_blocked_for(step, copy_ends) >= HELD
    assert unchanged_while_copying == [True]
    changed = [not torch.equal(a, p) for a, p in zip(before, model.parameters(), strict=True)]
    assert any(changed)


def test_a_save_waits_for_the_previous_copy_before_reusing_its_tensors():
    model, opt = tiny_training("sgd")
    fence = StepFence(opt)
    staging = HostStaging(fence, CPU)
    earlier: Future[None] = Future()
    fence.hold(earlier)
    waited = step_blocked_for(
        lambda: staging.stage({"model": model.state_dict()}).result(),
        lambda: earlier.set_result(None),
    )
    assert waited >= HELD
    staging.close()


def test_tensors_the_step_does_not_change_are_copied_at_once():
    model, opt = tiny_training("sgd")
    forward_backward(model, 0)
    opt.step()
    state = {"model": model.state_dict(), "optimizer": opt.state_dict()}
    snapshot = snapshot_unguarded(state, StepFence(opt).guarded())
    weight, running = "features.0.weight", "features.1.running_mean"
    assert snapshot["model"][weight].data_ptr() == model.features[0].weight.data_ptr()
    momentum = snapshot["optimizer"]["state"][0]["momentum_buffer"]
    assert (
        momentum.data_ptr()
        == opt.state[opt.param_groups[0]["params"][0]]["momentum_buffer"].data_ptr()
    )
    assert snapshot["model"][running].data_ptr() != model.features[1].running_mean.data_ptr()
    frozen = snapshot["model"][running].clone()
    forward_backward(model, 1)  # forward in training mode updates the running statistics
    assert torch.equal(snapshot["model"][running], frozen)
    assert not torch.equal(model.features[1].running_mean, frozen)


@pytest.fixture
def one_rank(tmp_path):
    """torch.distributed in this process, as a world of one rank over Gloo."""
    import torch.distributed as td

    td.init_process_group("gloo", init_method=f"file://{tmp_path}/rendezvous", rank=0, world_size=1)
    yield td.new_group(backend="gloo")
    td.destroy_process_group()


def test_a_sharded_save_overlapped_with_the_next_step_holds_the_state_of_the_save_step(
    one_rank, tmp_path
):
    from torch.distributed.checkpoint.state_dict import get_state_dict
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from trainer.checkpoints import sharded as sharded_checkpoint

    model, _ = tiny_training("sgd")
    fully_shard(model, mesh=init_device_mesh("cpu", (1,)))
    opt = build_optimizer(TrainConfig(optimizer="sgd", lr=0.05), model)
    fence = StepFence(opt)
    stager = sharded_checkpoint.background_stager(CPU)
    for seed in range(2):
        forward_backward(model, seed)
        opt.step()
    live_model, live_optimizer = get_state_dict(model, opt)
    tensors = {"model": live_model, "optimizer": live_optimizer}
    expected = cpu_copy(tensors)
    staged = snapshot_unguarded(tensors, fence.guarded())
    # Only what the step does not change was copied at once: the moments are left to DCP.
    momentum = staged["optimizer"]["state"]["fc.weight"]["momentum_buffer"]
    assert (
        momentum.to_local().data_ptr()
        == live_optimizer["state"]["fc.weight"]["momentum_buffer"].to_local().data_ptr()
    )
    path = tmp_path / "step-000000002.dcp"
    pending = sharded_checkpoint.start_writing(path, staged, (one_rank, stager))
    assert pending is not None
    fence.hold(pending[0])
    forward_backward(model, 2)  # BatchNorm's statistics change
    opt.step()  # waits for DCP's copy
    pending[1].result()
    stager.close()
    model_now, optimizer_now = get_state_dict(model, opt)
    written = {"model": model_now, "optimizer": optimizer_now}
    assert not torch.equal(
        whole(written["model"])["fc.weight"], whole(expected["model"])["fc.weight"]
    )
    sharded_checkpoint.read_shards(path, written)
    assert_bit_equal(whole(written["model"]), whole(expected["model"]))
    for name, entries in expected["optimizer"]["state"].items():
        assert_bit_equal(whole(written["optimizer"]["state"][name]), whole(entries))


def test_a_run_saving_in_the_background_writes_what_a_synchronous_run_writes(tmp_path):
    """End to end, in one process: checkpoints copied while the next step runs, then written
    and read back by trainer.checkpoints.single_file, equal a synchronous run's, bit for bit."""
    from tests.conftest import tiny_config
    from trainer.checkpoints import single_file
    from trainer.settings.train_config import DEFAULTS
    from trainer.training.run import train

    saved = {}
    for mode in ("sync", "background"):
        cfg = DEFAULTS.replace(
            **tiny_config(
                tmp_path / mode,
                backend="local",
                optimizer="sgd",
                max_steps=7,
                checkpoint_every=3,
                keep_checkpoints=10,
                checkpoint_async=mode == "background",
            )
        )
        train(cfg, LocalDist())
        folder = tmp_path / mode / "checkpoints"
        saved[mode] = {
            step: single_file.load(path) for step, path in single_file.list_checkpoints(folder)
        }
    assert sorted(saved["background"]) == [3, 6, 7]  # mid-run (overlapped), then the last
    for step, state in saved["sync"].items():
        background = saved["background"][step]
        for entry in ("model", "optimizer", "scaler", "rng", "step", "epoch_offset"):
            assert_bit_equal(background[entry], state[entry])
