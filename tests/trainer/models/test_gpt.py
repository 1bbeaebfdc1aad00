import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from trainer.models.gpt import GPT, build_gpt
from trainer.models.gpt_sizes import GPT_SIZES, GPTSize, flops_per_token, parameter_count

REPO = Path(__file__).resolve().parents[3]
GPT2_VOCAB = 50_257
BYTE_VOCAB = 257


def _count(model: torch.nn.Module) -> int:
    # parameters() yields a shared Parameter once, so a tie is counted once.
    return sum(p.numel() for p in model.parameters())


def test_parameter_count_matches_the_real_tiny_model():
    model = build_gpt("gpt-tiny", BYTE_VOCAB)
    assert _count(model) == parameter_count(GPT_SIZES["gpt-tiny"], BYTE_VOCAB)
    assert 100_000 <= _count(model) <= 500_000


@pytest.mark.parametrize("name", sorted(GPT_SIZES))
def test_parameter_count_matches_every_size_built_on_the_meta_device(name):
    model = build_gpt(name, GPT2_VOCAB, device="meta")
    assert all(p.is_meta for p in model.parameters())
    assert _count(model) == parameter_count(GPT_SIZES[name], GPT2_VOCAB)
    assert len(model.blocks) == GPT_SIZES[name].layers


@pytest.mark.parametrize(
    ("name", "nominal"),
    # With GPT-2's 50,257 tokens: gpt-small 124,439,808 (GPT-2 small's 124M), gpt-350m
    # 354,823,168 (GPT-2 medium), gpt-1.3b 1,315,723,264 (GPT-3 XL).
    [("gpt-small", 124e6), ("gpt-350m", 350e6), ("gpt-1.3b", 1.3e9)],
)
def test_named_sizes_are_within_5_percent_of_their_nominal_counts(name, nominal):
    count = parameter_count(GPT_SIZES[name], GPT2_VOCAB)
    assert abs(count - nominal) / nominal < 0.05
    assert flops_per_token(GPT_SIZES[name], GPT2_VOCAB) == 6 * count


def test_output_layer_is_the_token_embedding():
    model = build_gpt("gpt-tiny", BYTE_VOCAB)
    width = model.size.width
    vocab_sized = [n for n, p in model.named_parameters() if p.shape == (BYTE_VOCAB, width)]
    assert vocab_sized == ["token_embedding.weight"]
    tokens = torch.randint(6, BYTE_VOCAB, (1, 8))
    with torch.no_grad():
        before = model(tokens)
        model.token_embedding.weight[5] += 1.0  # no input is token 5: only its output changes
        changed = (model(tokens) - before).abs().amax(dim=(0, 1)) > 0
    assert changed.nonzero().flatten().tolist() == [5]


def test_residual_projections_start_smaller_by_sqrt_two_layers():
    torch.manual_seed(0)
    layers = 8
    model = GPT(GPTSize(layers=layers, heads=2, width=256, context=16), 100)
    first = model.blocks[0]
    assert first.attn.qkv.weight.std().item() == pytest.approx(0.02, rel=0.02)
    for projection in (first.attn.proj, first.mlp.proj):
        expected = 0.02 / math.sqrt(2 * layers)
        assert projection.weight.std().item() == pytest.approx(expected, rel=0.02)
        assert projection.bias is not None and not projection.bias.any()


def test_forward_shape_and_dtype():
    model = build_gpt("gpt-tiny", BYTE_VOCAB).eval()
    tokens = torch.randint(0, BYTE_VOCAB, (3, 17))
    with torch.no_grad():
        logits = model(tokens)
    assert logits.shape == (3, 17, BYTE_VOCAB) and logits.dtype == torch.float32


def test_a_sequence_longer_than_the_context_is_refused():
    model = build_gpt("gpt-tiny", BYTE_VOCAB)
    with pytest.raises(ValueError, match="longer than the context"):
        model(torch.zeros(1, GPT_SIZES["gpt-tiny"].context + 1, dtype=torch.long))


def test_attention_is_causal():
    torch.manual_seed(0)
    model = build_gpt("gpt-tiny", BYTE_VOCAB).eval()
    tokens = torch.randint(0, BYTE_VOCAB, (2, 32))
    changed = tokens.clone()
    changed[:, 20] = (changed[:, 20] + 1) % BYTE_VOCAB
    with torch.no_grad():
        before, after = model(tokens), model(changed)
    torch.testing.assert_close(before[:, :20], after[:, :20])
    assert not torch.allclose(before[:, 20:], after[:, 20:])


def test_loss_on_random_tokens_starts_near_ln_vocab():
    torch.manual_seed(0)
    model = build_gpt("gpt-tiny", BYTE_VOCAB)
    inputs = torch.randint(0, BYTE_VOCAB, (4, 64))
    targets = torch.randint(0, BYTE_VOCAB, (4, 64))
    loss = F.cross_entropy(model(inputs).flatten(0, 1), targets.flatten())
    assert loss.item() == pytest.approx(math.log(BYTE_VOCAB), abs=0.25)
    loss.backward()
    assert all(p.grad is not None for p in model.parameters())


def test_meta_model_materializes_with_to_empty_and_init_weights():
    model = build_gpt("gpt-tiny", BYTE_VOCAB, device="meta")
    model.to_empty(device="cpu")
    model.init_weights()
    assert isinstance(model, GPT)
    logits = model(torch.randint(0, BYTE_VOCAB, (1, 8)))
    assert torch.isfinite(logits).all()


def test_unknown_name_lists_the_sizes():
    with pytest.raises(ValueError, match="gpt-tiny, gpt-small"):
        build_gpt("gpt-huge", BYTE_VOCAB)


def test_sizes_import_without_torch():
    # trainer.settings.train_config imports the sizes; the deployer's side must not pull torch in
    # with it.
    code = (
        "import sys, trainer.models.gpt_sizes; assert 'torch' not in sys.modules, 'torch imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO)


def test_mfu_is_reported_against_the_known_dense_bf16_peaks_only():
    from trainer.watch.mfu import peak_tflops, throughput_metrics

    assert peak_tflops("NVIDIA H100 80GB HBM3") == 989.4
    assert peak_tflops("NVIDIA A100-SXM4-80GB") == 312.0
    assert peak_tflops("cpu") is None
    # 1,000 tokens/s of a model with 1e9 training FLOPs per token: 1 TFLOPS.
    assert throughput_metrics(1000.0, 10**9, None) == {"model_tflops": 1.0}
    assert throughput_metrics(1000.0, 10**9, 4.0) == {"model_tflops": 1.0, "mfu": 0.25}
