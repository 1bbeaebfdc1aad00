import pytest

from trainer.engines.base import Dist
from trainer.engines.local import LocalDist


def test_a_backend_missing_a_collective_cannot_be_created():
    class Forgetful(Dist):
        name = "forgetful"

        @property
        def gpu_collectives(self) -> bool:
            return False

    with pytest.raises(TypeError, match="allreduce_sum"):
        Forgetful()  # type: ignore[abstract]


def test_one_process_is_its_own_world():
    dist = LocalDist()
    assert (dist.rank, dist.size, dist.is_root) == (0, 1, True)
    assert dist.broadcast_object({"a": 1}) == {"a": 1} and dist.allgather_object(3) == [3]
