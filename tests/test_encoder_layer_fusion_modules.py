"""Layer attention and SurfaceFusion modules (Liu et al., ICLR 2021) against hand-computed values."""

import math

import pytest
import torch

from fusion_fairseq.modules import LayerAttention, SurfaceAttention, SurfaceFusion, hard_fusion, soft_fusion


def test_fine_weights_sum_to_one_over_encoder_layers_for_every_dimension():
    attention = LayerAttention(num_decoder_layers=3, num_encoder_layers=4, embed_dim=6, kind="fine")
    with torch.no_grad():
        attention.logits.normal_()
    attention.eval()
    weights = attention.weights()
    assert weights.shape == (3, 5, 6)
    assert torch.allclose(weights.sum(dim=1), torch.ones(3, 6), atol=1e-6)


def test_coarse_memory_is_the_scalar_weighted_sum_of_layers():
    attention = LayerAttention(num_decoder_layers=2, num_encoder_layers=1, embed_dim=2, kind="coarse").eval()
    with torch.no_grad():
        attention.logits.copy_(torch.tensor([[[0.0], [0.0]], [[0.0], [math.log(3.0)]]]))
    x0, x1 = torch.tensor([[[1.0, 2.0]]]), torch.tensor([[[5.0, 6.0]]])  # (src_len=1, batch=1, D=2)
    memories = attention([x0, x1])
    assert memories[0, 0, 0].tolist() == pytest.approx([3.0, 4.0])  # 1/2, 1/2
    assert memories[1, 0, 0].tolist() == pytest.approx([0.25 * 1 + 0.75 * 5, 0.25 * 2 + 0.75 * 6])  # 1/4, 3/4


def test_fine_memory_weights_each_dimension_separately():
    attention = LayerAttention(num_decoder_layers=1, num_encoder_layers=1, embed_dim=2, kind="fine").eval()
    with torch.no_grad():
        attention.logits.copy_(torch.tensor([[[math.log(3.0), 0.0], [0.0, math.log(3.0)]]]))
    x0, x1 = torch.tensor([[[4.0, 4.0]]]), torch.tensor([[[8.0, 8.0]]])
    # dim 0: weights (3/4, 1/4) -> 5; dim 1: weights (1/4, 3/4) -> 7
    assert attention([x0, x1])[0, 0, 0].tolist() == pytest.approx([5.0, 7.0])


@pytest.mark.parametrize("kind", ["coarse", "fine"])
def test_masking_a_layer_renormalises_the_others_exactly(kind):
    attention = LayerAttention(num_decoder_layers=2, num_encoder_layers=3, embed_dim=4, kind=kind).eval()
    with torch.no_grad():
        attention.logits.normal_()
    unmasked = attention.weights()
    attention.mask_layer(1)
    masked = attention.weights()
    expected = unmasked / (1.0 - unmasked[:, 1:2])
    expected[:, 1] = 0.0
    assert torch.allclose(masked, expected, atol=1e-6)
    attention.mask_layer(None)
    assert torch.equal(attention.weights(), unmasked)


def test_masking_a_layer_that_does_not_exist_is_an_error():
    attention = LayerAttention(num_decoder_layers=2, num_encoder_layers=3, embed_dim=4)
    with pytest.raises(ValueError, match=r"LayerAttention cannot mask input 4: its inputs are encoder layers 0 \(embedding\) to 3"):
        attention.mask_layer(4)
    with pytest.raises(ValueError, match="LayerAttention cannot mask input -1"):
        attention.mask_layer(-1)


def test_dropconnect_drops_logits_before_the_softmax_so_weights_still_sum_to_one():
    torch.manual_seed(0)
    attention = LayerAttention(num_decoder_layers=4, num_encoder_layers=5, embed_dim=64, kind="fine", dropconnect=0.3)
    with torch.no_grad():
        attention.logits.normal_()
    clean = attention.eval().weights()
    torch.manual_seed(1)
    dropped = attention.train().weights()
    assert torch.allclose(dropped.sum(dim=1), torch.ones(4, 64), atol=1e-6)
    assert (dropped > 0).all()  # no encoder layer (the embedding included) is ever zeroed
    # the same draw applied by hand to the logits: zero 30% of them, scale the rest by 1 / 0.7
    torch.manual_seed(1)
    kept = torch.nn.functional.dropout(torch.ones_like(attention.logits), p=0.3)
    assert 0.6 < (kept != 0).float().mean().item() < 0.8
    assert torch.allclose(dropped, torch.softmax(attention.logits * kept, dim=1), atol=1e-6)
    assert torch.equal(attention.eval().weights(), clean)


def test_dropconnect_keeps_a_masked_layer_at_zero_in_training():
    torch.manual_seed(0)
    attention = LayerAttention(num_decoder_layers=2, num_encoder_layers=3, embed_dim=8, dropconnect=0.5).train()
    attention.mask_layer(0)
    weights = attention.weights()
    assert not torch.isnan(weights).any()
    assert torch.equal(weights[:, 0], torch.zeros(2, 8))
    assert torch.allclose(weights.sum(dim=1), torch.ones(2, 8), atol=1e-6)


def test_hard_fusion_with_lambda_one_is_the_vanilla_distribution():
    torch.manual_seed(0)
    logits, surface = torch.randn(2, 3, 11), torch.randn(2, 3, 11)
    assert torch.equal(hard_fusion(logits, surface, lam=1.0, tau=1.0), torch.log_softmax(logits, dim=-1))


def test_hard_fusion_is_the_log_linear_interpolation_of_eq6():
    logits, surface = torch.tensor([0.0, math.log(3.0)]), torch.tensor([math.log(2.0), 0.0])
    # P = (1/4, 3/4); P_surface with tau=1 = (2/3, 1/3); Phi = 0.8 log P + 0.2 log P_surface
    expected = [0.8 * math.log(0.25) + 0.2 * math.log(2 / 3), 0.8 * math.log(0.75) + 0.2 * math.log(1 / 3)]
    assert hard_fusion(logits, surface, lam=0.8, tau=1.0).tolist() == pytest.approx(expected, abs=1e-6)
    # tau = 2 halves the surface logits: P_surface = softmax(log(2)/2, 0)
    p = math.sqrt(2) / (math.sqrt(2) + 1)
    expected_tau = [0.8 * math.log(0.25) + 0.2 * math.log(p), 0.8 * math.log(0.75) + 0.2 * math.log(1 - p)]
    assert hard_fusion(logits, surface, lam=0.8, tau=2.0).tolist() == pytest.approx(expected_tau, abs=1e-6)


def test_soft_fusion_is_a_normalised_distribution_of_eq7():
    torch.manual_seed(0)
    logits, surface = torch.randn(4, 9), torch.randn(4, 9)
    fused = soft_fusion(logits, surface, tau=5.0)
    assert torch.allclose(fused.exp().sum(-1), torch.ones(4), atol=1e-6)
    expected = torch.log_softmax(logits + torch.log_softmax(surface / 5.0, dim=-1), dim=-1)
    assert torch.allclose(fused, expected, atol=1e-6)


def test_surface_attention_reads_keys_from_one_tensor_and_values_from_another():
    torch.manual_seed(0)
    attention = SurfaceAttention(embed_dim=4, num_heads=1).eval()
    with torch.no_grad():
        for linear in (attention.q_proj, attention.k_proj, attention.v_proj, attention.out_proj):
            linear.weight.copy_(torch.eye(4))
            linear.bias.zero_()
    query = torch.tensor([[[1.0, 0.0, 0.0, 0.0]]])
    keys = torch.tensor([[[2.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]]])
    values = torch.tensor([[[10.0, 0.0, 0.0, 0.0], [0.0, 10.0, 0.0, 0.0]]])
    # scores = q.k / sqrt(4) = (1, 0): weights (e/(e+1), 1/(e+1)) over the values
    e = math.e
    out = attention(query, keys, values)
    assert out[0, 0].tolist() == pytest.approx([10 * e / (e + 1), 10 / (e + 1), 0.0, 0.0], abs=1e-5)
    padded = attention(query, keys, values, key_padding_mask=torch.tensor([[False, True]]))
    assert padded[0, 0].tolist() == pytest.approx([10.0, 0.0, 0.0, 0.0], abs=1e-5)


def test_surface_attention_projects_the_memory_once_per_sentence_and_follows_beam_reordering():
    torch.manual_seed(0)
    attention = SurfaceAttention(embed_dim=8, num_heads=2).eval()
    keys, values = torch.randn(3, 5, 8), torch.randn(3, 5, 8)
    queries = torch.randn(3, 2, 8)
    state = {}
    first = attention(queries[:, :1], keys, values, incremental_state=state)
    calls = []
    attention.k_proj.register_forward_hook(lambda *args: calls.append(1))
    second = attention(queries[:, 1:], keys * 0, values * 0, incremental_state=state)  # cached: inputs unused
    assert calls == []
    full = attention(queries, keys, values)
    assert torch.allclose(torch.cat([first, second], 1), full, atol=1e-6)
    order = torch.tensor([2, 0, 0])
    attention.reorder_incremental_state(state, order)
    reordered = attention(queries[order, 1:], keys, values, incremental_state=state)
    assert torch.allclose(reordered, full[order, 1:], atol=1e-6)


@pytest.mark.parametrize("kwargs,message", [
    ({"lam": 1.5}, r"SurfaceFusion lam \(Eq. 6\) must be in \[0, 1\], got 1.5"),
    ({"lam": -0.1}, r"SurfaceFusion lam \(Eq. 6\) must be in \[0, 1\], got -0.1"),
    ({"tau": 0.0}, r"SurfaceFusion tau \(Eq. 5\) must be > 0, got 0.0"),
    ({"kind": "medium"}, "SurfaceFusion kind must be hard or soft, got 'medium'"),
])
def test_surface_fusion_rejects_bad_settings(kwargs, message):
    settings = {"kind": "hard", "embed_dim": 8, "num_heads": 2, "lam": 0.8, "tau": 1.0, **kwargs}
    with pytest.raises(ValueError, match=message):
        SurfaceFusion(**settings)


@pytest.mark.parametrize("variant", ["paper", "released"])
def test_surface_attention_starts_as_its_variant_says(variant):
    """paper: Xavier-uniform at gain 1, zero biases. released: the released code's fairseq 0.9 attention,
    query/key/value weights at gain 1/sqrt(2) with torch's default biases, U(+-1/sqrt(d)); the output
    projection at gain 1 with a zero bias."""
    d = 256
    torch.manual_seed(0)
    attention = SurfaceFusion("hard", d, 1, lam=0.8, tau=1.0, variant=variant, ffn_dim=16).attention
    xavier_bound = math.sqrt(6 / (2 * d))
    qkv_gain = 1 / math.sqrt(2) if variant == "released" else 1.0
    for projection in (attention.q_proj, attention.k_proj, attention.v_proj):
        largest = projection.weight.abs().max().item()
        assert 0.99 * qkv_gain * xavier_bound < largest <= qkv_gain * xavier_bound
        bias = projection.bias.abs()
        if variant == "released":
            assert 0.9 / math.sqrt(d) < bias.max().item() <= 1 / math.sqrt(d)
        else:
            assert bias.max().item() == 0
    assert 0.99 * xavier_bound < attention.out_proj.weight.abs().max().item() <= xavier_bound
    assert attention.out_proj.bias.abs().max().item() == 0
