import pytest
import torch

from trainer.models.build import build_model, count_parameters


@pytest.mark.parametrize(
    ("name", "expected"),
    # torchvision's counts for the same architectures with 1000 classes.
    [
        ("resnet18", 11_689_512),
        ("resnet34", 21_797_672),
        ("resnet50", 25_557_032),
        ("resnet101", 44_549_160),
    ],
)
def test_resnet_parameter_counts_match_torchvision(name, expected):
    assert count_parameters(build_model(name, 1000)) == expected


def test_resnet50_is_v1_5_stride_in_3x3():
    block = build_model("resnet50", 10).layer2[0]
    assert block.conv1.stride == (1, 1)
    assert block.conv2.stride == (2, 2)


@pytest.mark.parametrize("name", ["tiny", "resnet18", "resnet50"])
def test_forward_shape_at_small_resolution(name):
    model = build_model(name, 7).eval()
    with torch.no_grad():
        assert model(torch.randn(2, 3, 32, 32)).shape == (2, 7)


def test_residual_branches_start_as_identity():
    model = build_model("resnet18", 10)
    assert all(float(block.bn2.weight.detach().abs().sum()) == 0.0 for block in model.layer1)
