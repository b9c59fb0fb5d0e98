"""Fusion modules against values computed by hand from the MLRF equations."""

import math

import pytest
import torch
from torch import nn

from fusion_fairseq.modules import (
    AverageFusion,
    FeedForwardFusion,
    LayerFusion,
    MultiHopAttentionFusion,
    build_layer_fusion,
)


def set_linear(linear, weight, bias):
    with torch.no_grad():
        linear.weight.copy_(torch.tensor(weight, dtype=torch.float))
        linear.bias.copy_(torch.tensor(bias, dtype=torch.float))


def identity_ffn(ffn, dim):
    set_linear(ffn.fc1, torch.eye(dim).tolist(), [0.0] * dim)
    set_linear(ffn.fc2, torch.eye(dim).tolist(), [0.0] * dim)


def test_average_fusion_is_the_mean_over_layers():
    layers = torch.tensor([[1.0, 2.0], [3.0, 4.0], [5.0, 9.0]])  # L=3, d=2
    assert AverageFusion()(layers).tolist() == [3.0, 5.0]


def test_feedforward_fusion_concatenates_layers_in_order():
    fusion = FeedForwardFusion(num_layers=2, embed_dim=2, ffn_dim=1)
    # hidden = relu(1*z1[0] + 2*z1[1] + 3*z2[0] + 4*z2[1] - 1); out = [hidden, -hidden] + [0.5, 0]
    set_linear(fusion.ffn.fc1, [[1.0, 2.0, 3.0, 4.0]], [-1.0])
    set_linear(fusion.ffn.fc2, [[1.0], [-1.0]], [0.5, 0.0])
    layers = torch.tensor([[1.0, 1.0], [0.0, 2.0]])
    hidden = 1 + 2 + 0 + 8 - 1
    assert fusion(layers).tolist() == [hidden + 0.5, -hidden]
    # a negative pre-activation is cut by the ReLU
    assert fusion(-layers).tolist() == [0.5, 0.0]


def test_feedforward_fusion_adds_the_layer_embedding_before_concatenating():
    embedding = nn.Embedding(3, 2)
    with torch.no_grad():
        embedding.weight.copy_(torch.tensor([[9.0, 9.0], [0.5, 0.0], [-1.0, 1.0]]))
    # first_layer_index=1: the two fused layers read rows 1 and 2 (as when h0 is not fused)
    fusion = FeedForwardFusion(num_layers=2, embed_dim=2, ffn_dim=1, layer_embedding=embedding, first_layer_index=1)
    set_linear(fusion.ffn.fc1, [[1.0, 2.0, 3.0, 4.0]], [-1.0])
    set_linear(fusion.ffn.fc2, [[1.0], [-1.0]], [0.5, 0.0])
    layers = torch.tensor([[1.0, 1.0], [0.0, 2.0]])  # Eq. 4: z~1 = (1.5, 1), z~2 = (-1, 3)
    hidden = 1.5 + 2 - 3 + 12 - 1
    assert fusion(layers).tolist() == pytest.approx([hidden + 0.5, -hidden])
    with pytest.raises(ValueError, match="layer embedding has 3 rows, fusing layers 0..3 needs more"):
        FeedForwardFusion(num_layers=4, embed_dim=2, ffn_dim=1, layer_embedding=embedding)


def test_feedforward_fusion_parameter_count_matches_mlrf_table2_difference():
    # Enc-FNN (11.63M) - baseline (10.97M): FNN over h0..h3 at d=256, df=512 (+ the LayerNorm)
    fusion = FeedForwardFusion(num_layers=4, embed_dim=256, ffn_dim=512)
    assert sum(p.numel() for p in fusion.parameters()) == 1024 * 512 + 512 + 512 * 256 + 256 == 656128


def hand_attention(energies, layers):
    """Eq. 6-7 by hand for one hop: softmax over layers, weighted sum of layer vectors."""
    exps = [math.exp(e) for e in energies]
    weights = [e / sum(exps) for e in exps]
    return weights, [sum(w * layer[k] for w, layer in zip(weights, layers)) for k in range(len(layers[0]))]


def test_multihop_attention_single_hop_by_hand():
    fusion = MultiHopAttentionFusion(num_layers=2, embed_dim=2, attn_dim=1, ffn_dim=2, num_hops=1)
    set_linear(fusion.w1, [[1.0, 0.0]], [0.0])  # W1 reads the first coordinate
    set_linear(fusion.w2, [[2.0]], [0.0])
    identity_ffn(fusion.ffn, 2)
    z1, z2 = [0.0, 3.0], [1.0, 1.0]
    out, weights = fusion(torch.tensor([z1, z2]), need_weights=True)
    expected_weights, expected_out = hand_attention([2 * math.tanh(0.0), 2 * math.tanh(1.0)], [z1, z2])
    assert weights.shape == (1, 2)
    assert weights[0].tolist() == pytest.approx(expected_weights, abs=1e-6)
    assert out.tolist() == pytest.approx(expected_out, abs=1e-6)


def test_multihop_attention_adds_layer_embedding_before_attending():
    embedding = nn.Embedding(3, 2)
    with torch.no_grad():
        embedding.weight.copy_(torch.tensor([[9.0, 9.0], [0.5, 0.0], [-1.0, 1.0]]))
    # first_layer_index=1: layers use rows 1 and 2 (as when h0 is not fused)
    fusion = MultiHopAttentionFusion(2, 2, 1, 2, 1, layer_embedding=embedding, first_layer_index=1)
    set_linear(fusion.w1, [[1.0, 0.0]], [0.0])
    set_linear(fusion.w2, [[1.0]], [0.0])
    identity_ffn(fusion.ffn, 2)
    z1, z2 = [0.0, 3.0], [2.0, 1.0]
    z1e, z2e = [0.5, 3.0], [1.0, 2.0]  # Eq. 4: z~ = z + E_l
    out, weights = fusion(torch.tensor([z1, z2]), need_weights=True)
    expected_weights, expected_out = hand_attention([math.tanh(0.5), math.tanh(1.0)], [z1e, z2e])
    assert weights[0].tolist() == pytest.approx(expected_weights, abs=1e-6)
    assert out.tolist() == pytest.approx(expected_out, abs=1e-6)


def test_multihop_attention_hops_are_independent_columns_of_w2():
    fusion = MultiHopAttentionFusion(num_layers=2, embed_dim=1, attn_dim=1, ffn_dim=2, num_hops=2)
    set_linear(fusion.w1, [[1.0]], [0.0])
    set_linear(fusion.w2, [[1.0], [-1.0]], [0.0, 0.0])  # hop 2 prefers what hop 1 avoids
    # FNN over the 2 hops x 1 dim: hidden = [s~_1, s~_2], output = s~_1 + 10 * s~_2
    set_linear(fusion.ffn.fc1, [[1.0, 0.0], [0.0, 1.0]], [0.0, 0.0])
    set_linear(fusion.ffn.fc2, [[1.0, 10.0]], [0.0])
    z1, z2 = [0.0], [1.0]
    out, weights = fusion(torch.tensor([z1, z2]), need_weights=True)
    w_hop1, (s_hop1,) = hand_attention([0.0, math.tanh(1.0)], [z1, z2])
    w_hop2, (s_hop2,) = hand_attention([0.0, -math.tanh(1.0)], [z1, z2])
    assert weights.tolist() == [pytest.approx(w_hop1, abs=1e-6), pytest.approx(w_hop2, abs=1e-6)]
    assert out.tolist() == pytest.approx([s_hop1 + 10 * s_hop2], abs=1e-6)


def test_independent_w1_uses_one_matrix_per_layer():
    fusion = MultiHopAttentionFusion(2, 1, 1, 1, 1, independent_w1=True)
    with torch.no_grad():
        fusion.w1_weight.copy_(torch.tensor([[[1.0]], [[-2.0]]]))  # layer 1: x, layer 2: -2x
        fusion.w1_bias.zero_()
    set_linear(fusion.w2, [[1.0]], [0.0])
    identity_ffn(fusion.ffn, 1)
    z1, z2 = [1.0], [1.0]
    _, weights = fusion(torch.tensor([z1, z2]), need_weights=True)
    expected, _ = hand_attention([math.tanh(1.0), math.tanh(-2.0)], [z1, z2])
    assert weights[0].tolist() == pytest.approx(expected, abs=1e-6)
    shared = MultiHopAttentionFusion(2, 4, 8, 3, 2)
    independent = MultiHopAttentionFusion(2, 4, 8, 3, 2, independent_w1=True)
    count = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731
    assert count(independent) - count(shared) == 4 * 8 + 8  # one more W1 (with bias)


def test_attention_weights_sum_to_one_over_layers():
    torch.manual_seed(0)
    fusion = MultiHopAttentionFusion(num_layers=4, embed_dim=8, attn_dim=6, ffn_dim=5, num_hops=3)
    out, weights = fusion(torch.randn(7, 2, 4, 8), need_weights=True)
    assert out.shape == (7, 2, 8)
    assert weights.shape == (7, 2, 3, 4)
    assert torch.allclose(weights.sum(-1), torch.ones(7, 2, 3), atol=1e-6)


def test_layer_fusion_skips_embedding_layer_and_normalises():
    states = [torch.full((1, 4), 100.0), torch.tensor([[1.0, 2.0, 3.0, 4.0]]), torch.tensor([[3.0, 2.0, 5.0, 6.0]])]
    without_h0 = LayerFusion(AverageFusion(), 4, include_embedding_layer=False, layer_norm=False)
    assert without_h0(states)[0].tolist() == [[2.0, 2.0, 4.0, 5.0]]
    with_h0 = LayerFusion(AverageFusion(), 4, include_embedding_layer=True, layer_norm=False)
    assert with_h0(states)[0][0].tolist() == pytest.approx([104 / 3, 104 / 3, 36.0, 110 / 3])
    normalised, _ = LayerFusion(AverageFusion(), 4, include_embedding_layer=False)(states)
    # LayerNorm with its initial weight 1 / bias 0: zero mean, unit (biased) variance
    assert normalised.mean().item() == pytest.approx(0.0, abs=1e-6)
    assert normalised.var(unbiased=False).item() == pytest.approx(1.0, abs=1e-3)


def test_build_layer_fusion_choices_and_layer_embedding_rows():
    assert build_layer_fusion("none", 3, 8, 4, 4, 2) is None
    sa = build_layer_fusion("sa", 3, 8, 4, 4, 2, layer_embedding=nn.Embedding(4, 8))
    assert sa.function.layer_ids.tolist() == [0, 1, 2, 3]
    sa_no_h0 = build_layer_fusion("sa", 3, 8, 4, 4, 2, include_embedding_layer=False, layer_embedding=nn.Embedding(4, 8))
    assert sa_no_h0.function.layer_ids.tolist() == [1, 2, 3]
    table = nn.Embedding(4, 8)
    fnn_no_h0 = build_layer_fusion("fnn", 3, 8, 4, 4, 2, include_embedding_layer=False, layer_embedding=table)
    assert fnn_no_h0.function.layer_embedding is table and fnn_no_h0.function.layer_ids.tolist() == [1, 2, 3]
    with pytest.raises(ValueError, match="unknown fusion function 'max'; allowed: none, avg, fnn, sa"):
        build_layer_fusion("max", 3, 8, 4, 4, 2)
    with pytest.raises(ValueError, match="layer embedding has 3 rows"):
        build_layer_fusion("sa", 3, 8, 4, 4, 2, layer_embedding=nn.Embedding(3, 8))


def test_fusion_linears_use_the_papers_fan_in_initialisation():
    torch.manual_seed(0)
    fusion = MultiHopAttentionFusion(num_layers=4, embed_dim=64, attn_dim=256, ffn_dim=128, num_hops=4)
    for linear in (fusion.w1, fusion.w2, fusion.ffn.fc1, fusion.ffn.fc2):
        bound = 1 / math.sqrt(linear.in_features)
        assert linear.weight.abs().max().item() <= bound
        assert linear.weight.abs().max().item() > 0.9 * bound  # uniform over the whole range
