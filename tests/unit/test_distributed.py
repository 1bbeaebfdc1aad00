import pytest

from trainer.config import DEFAULTS
from trainer.distributed import Dist, LocalDist, lr_scale_factor


def test_adasum_scales_by_local_nccl_gpus_only():
    assert lr_scale_factor(16, 8, adasum=False, nccl=True) == 16
    assert lr_scale_factor(16, 8, adasum=True, nccl=True) == 8
    assert lr_scale_factor(16, 8, adasum=True, nccl=False) == 1


def test_a_backend_missing_a_collective_cannot_be_created():
    class Forgetful(Dist):
        name = "forgetful"

        @property
        def gpu_collectives(self) -> bool:
            return False

    with pytest.raises(TypeError, match="allreduce_sum"):
        Forgetful()  # type: ignore[abstract]


def test_one_process_counts_itself_for_lr_scaling():
    dist = LocalDist()
    assert (dist.rank, dist.size, dist.is_root) == (0, 1, True)
    assert dist.lr_scale(DEFAULTS) == 1
    assert dist.broadcast_object({"a": 1}) == {"a": 1} and dist.allgather_object(3) == [3]
