"""MUDDFormer (Xiao et al. 2025) as options of ``fusion_transformer`` (``--mudd-encoder``,
``--mudd-decoder``) and its preset ``muddformer``: the equations on a case computed by hand, the
layer's four inputs, the Transformer at initialisation, incremental decoding with trained weights,
the parameter count against the paper's formula, and the refusals."""

import math

import pytest
import torch
import torch.nn.functional as F

from fusion_fairseq.models.fusion_config import check_fusion_args
from fusion_fairseq.models.multiway_dense_layers import MultiwayEncoderLayer
from fusion_fairseq.modules.multiway_dense_connection import DynamicDenseWeights, MultiwayDynamicDense
from conftest import TINY_MLRF_FLAGS
from conformance_utils import decode_incrementally
from model_building import build_model, parse_model_args

TINY = TINY_MLRF_FLAGS[:16]  # d=16, 2 heads, FFN 32; no fusion flags
PRE_NORM = ("--encoder-normalize-before", "--decoder-normalize-before")
BOTH = ("--mudd-encoder", "--mudd-decoder")
DEPTH = ("--encoder-layers", "3", "--decoder-layers", "3")


def mudd_parameters(layers: int, width: int, variant: str = "paper", pre_norm: bool = False) -> int:
    """Eq. 13's terms and the static weights, for one side: the DA after layer i has W_1 (D x K_i),
    W_2 (K_i x C_i(i+1)) and a_i (C_i(i+1)), C_i = 4 ways before the last layer and 1 (the residual)
    after it, K_i = 4(i+1) (``released``: rounded up past the next multiple of 64); pre-norm adds
    the key and value LayerNorms (2 x 2D) of every layer."""
    total = 0
    for i in range(1, layers + 1):
        ways, hidden = (4 if i < layers else 1), 4 * (i + 1)
        if variant == "released":
            hidden = (hidden // 64 + 1) * 64
        total += width * hidden + hidden * ways * (i + 1) + ways * (i + 1)
    return total + (4 * width * layers if pre_norm else 0)


def logits(model, src, prev):
    model.eval()
    with torch.no_grad():
        return model(src, src.ne(1).sum(dim=1), prev)[0]


def batch():
    torch.manual_seed(0)
    src = torch.randint(4, 100, (3, 7))
    src[0, :2] = 1  # left padding, as fairseq batches sources
    return src, torch.randint(4, 80, (3, 5))


def perturb(model, *markers):
    """Weights as after training: every parameter (or those whose name holds a marker) moved."""
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if not markers or any(marker in name for marker in markers):
                parameter.add_(0.3 * torch.randn_like(parameter))


# --- the equations ----------------------------------------------------------------------------------

def test_weights_generated_from_a_hand_computed_state():
    """Eq. 6, A(X) = GELU(RMSNorm(X) W_1) W_2 + a, for X = (1, -1) (RMS 1: RMSNorm leaves it), with
    W_1 reading h_0 = x_0, h_1 = x_1 and W_2 sending h_0 to (query, X_0) and h_1 to (residual, X_1)."""
    generator = DynamicDenseWeights(embed_dim=2, num_inputs=2, num_ways=4, hidden_size=8)
    with torch.no_grad():
        generator.w1.weight.zero_()
        generator.w1.weight[0, 0] = generator.w1.weight[1, 1] = 1.0
        generator.w2.weight.zero_()
        generator.w2.weight[0, 0] = 1.0  # output (way 0, input 0)
        generator.w2.weight[7, 1] = 2.0  # output (way 3, input 1)
    weights = generator(torch.tensor([[1.0, -1.0]]))[0]
    gelu_1, gelu_minus_1 = 0.8413447, -0.1586553  # x Phi(x) at 1 and -1
    expected = torch.tensor([[0.0, 1.0]] * 4)  # a_i: one on X_i for every way
    expected[0, 0] += gelu_1
    expected[3, 1] += 2 * gelu_minus_1
    torch.testing.assert_close(weights, expected, atol=1e-5, rtol=0)


def test_each_layer_reads_its_ways_mixed_from_every_earlier_output():
    """Eqs. 5 and 8 with two layers whose outputs are X_1 = 1 and X_2 = 2 (X_0 = 0.5): the first
    layer reads X_0 in every way; after it, way w reads a_w . (X_0, X_1); the stack's output is the
    last DA's one (residual) way."""
    stack = MultiwayDynamicDense(num_layers=2, embed_dim=4)
    with torch.no_grad():
        stack.generators[0].static.copy_(torch.tensor([[1.0, 1.0], [2.0, 0.0], [0.0, -1.0], [0.5, 0.5]]))
        stack.generators[1].static.copy_(torch.tensor([[3.0, -1.0, 0.25]]))
    inputs = []

    def apply_layer(index, ways, states):
        inputs.append(ways)
        return torch.full_like(ways[..., 0, :], float(index + 1))

    x0 = torch.full((5, 2, 4), 0.5)
    top, states = stack.run(x0, apply_layer)
    assert inputs[0].shape == (5, 2, 4, 4) and torch.equal(inputs[0], x0.unsqueeze(2).expand(5, 2, 4, 4))
    read = inputs[1][0, 0, :, 0]  # one position, one channel: the four ways
    torch.testing.assert_close(read, torch.tensor([0.5 + 1.0, 1.0 + 0.0, 0.0 - 1.0, 0.25 + 0.5]))
    torch.testing.assert_close(top, torch.full_like(x0, 3.0 * 0.5 - 1.0 + 0.25 * 2.0))
    assert len(states) == 3 and torch.equal(states[1], inputs[1][..., 3, :])  # states: the residual ways


def test_the_layer_attends_from_the_query_way_to_the_key_and_value_ways_and_adds_the_residual_way():
    """Eq. 7 in pre-norm, computed with plain tensor algebra from the layer's weights: X_A =
    R + MHA(LN_q(Q), LN_k(K), LN_v(V)), output X_A + FFN(LN(X_A)), each way with its own norm."""
    torch.manual_seed(3)
    model = build_model("fusion_transformer", *TINY, *BOTH, *PRE_NORM)
    layer = model.encoder.layers[1]
    assert isinstance(layer, MultiwayEncoderLayer)
    perturb(layer)
    layer.eval()
    query, key, value, residual = torch.randn(4, 6, 2, 16).unbind(0)  # T=6, B=2, C=16
    ways = torch.stack([query, key, value, residual], dim=2)
    with torch.no_grad():
        output = layer(ways, None)

        def norm(module, x):
            return F.layer_norm(x, (16,), module.weight, module.bias, eps=module.eps)

        attention = layer.self_attn
        q = F.linear(norm(layer.self_attn_layer_norm, query), attention.q_proj.weight, attention.q_proj.bias)
        k = F.linear(norm(layer.self_attn_key_layer_norm, key), attention.k_proj.weight, attention.k_proj.bias)
        v = F.linear(norm(layer.self_attn_value_layer_norm, value), attention.v_proj.weight, attention.v_proj.bias)
        heads = [x.view(6, 2, 2, 8).permute(1, 2, 0, 3) for x in (q, k, v)]  # B x H x T x 8
        probabilities = torch.softmax(heads[0] @ heads[1].transpose(-1, -2) / math.sqrt(8), dim=-1)
        context = (probabilities @ heads[2]).permute(2, 0, 1, 3).reshape(6, 2, 16)
        x_a = residual + F.linear(context, attention.out_proj.weight, attention.out_proj.bias)
        hidden = torch.relu(F.linear(norm(layer.final_layer_norm, x_a), layer.fc1.weight, layer.fc1.bias))
        expected = x_a + F.linear(hidden, layer.fc2.weight, layer.fc2.bias)
    torch.testing.assert_close(output, expected, atol=1e-5, rtol=1e-5)


# --- the Transformer at initialisation -------------------------------------------------------------

@pytest.mark.parametrize("norm", ["post-norm", "pre-norm"])
def test_from_a_trained_transformer_the_model_starts_as_that_transformer(norm):
    """Paper, Sec. 3: W_2 = 0 and a_i one-hot on X_i reduce MUDDFormer to the Transformer. Given a
    trained ``transformer``'s weights (every parameter moved from its initialisation, the norms
    included), MUDD's key and value norms start as copies of the query's, and the logits are the
    Transformer's."""
    norm_flags = PRE_NORM if norm == "pre-norm" else ()
    vanilla = build_model("transformer", *TINY, *DEPTH, *norm_flags)
    perturb(vanilla)
    mudd = build_model("fusion_transformer", *TINY, *DEPTH, *norm_flags, *BOTH)
    mudd.load_state_dict(vanilla.state_dict(), strict=False)
    src, prev = batch()
    torch.testing.assert_close(logits(mudd, src, prev), logits(vanilla, src, prev), rtol=0, atol=2e-5)
    perturb(mudd, "aggregation.")
    assert not torch.allclose(logits(mudd, src, prev), logits(vanilla, src, prev), atol=1e-3)


def test_the_preset_is_mudd_on_both_sides_of_a_pre_norm_transformer():
    args = parse_model_args("muddformer", *TINY)
    assert args.mudd_encoder and args.mudd_decoder and args.mudd_variant == "paper"
    assert args.encoder_normalize_before and args.decoder_normalize_before
    vanilla = build_model("transformer", *TINY, *PRE_NORM)
    mudd = build_model("muddformer", *TINY)
    mudd.load_state_dict(vanilla.state_dict(), strict=False)
    src, prev = batch()
    torch.testing.assert_close(logits(mudd, src, prev), logits(vanilla, src, prev), rtol=0, atol=2e-5)


# --- decoding --------------------------------------------------------------------------------------

@pytest.mark.parametrize("seed", [1, 2])
@pytest.mark.parametrize("norm", ["post-norm", "pre-norm"])
def test_incremental_decoding_with_trained_weights_equals_the_full_forward(norm, seed, monkeypatch):
    """With every weight moved (the ways differ from each other and between positions), decoding one
    position at a time, with the cache reordered as beam search does after step 2 (three hypotheses
    of one sentence change places), gives the teacher-forced logits: in float64 to 1e-10, so exact (fairseq's
    attention softmax, float32 whatever its input, made float64 here; in float32 the moved weights amplify
    its rounding past 1e-5 of the logits for some weights: pre-norm at seed 2)."""
    from fairseq import utils

    monkeypatch.setattr(utils, "softmax", lambda x, dim, onnx_trace=False: F.softmax(x, dim=dim))
    torch.manual_seed(seed)
    model = build_model("fusion_transformer", *TINY, *DEPTH, *BOTH, *(PRE_NORM if norm == "pre-norm" else ()))
    perturb(model)
    model.eval().double()
    src, prev = batch()
    src = src[:1].expand(3, -1)  # one padded sentence, three hypotheses: a beam
    with torch.no_grad():
        encoder_out = model.encoder(src, src_lengths=src.ne(1).sum(dim=1))
        full = model.decoder(prev, encoder_out=encoder_out)[0]
        (steps, _), _ = decode_incrementally(model, encoder_out, prev)
        order = torch.tensor([2, 0, 1])
        (before, _), (after, _) = decode_incrementally(model, encoder_out, prev, reorder_after=2, new_order=order)
        reordered = model.decoder(prev[order], encoder_out=model.encoder.reorder_encoder_out(encoder_out, order))[0]
    tolerance = 1e-10 * full.abs().max().item()  # float64 rounding at the logits' scale (about 20 here)
    torch.testing.assert_close(steps, full, atol=tolerance, rtol=0)
    torch.testing.assert_close(before, full[:, :2], atol=tolerance, rtol=0)
    torch.testing.assert_close(after, reordered[:, 2:], atol=tolerance, rtol=0)


def test_mudd_generators_learn():
    """W_2 starts at zero, so W_1's first gradient is zero; the others get one, and after one
    update so does W_1 (the conformance suite excuses W_1 from its first-step check for this)."""
    model = build_model("fusion_transformer", *TINY, *BOTH)
    model.train()
    optimiser = torch.optim.SGD(model.parameters(), lr=0.1)
    src, prev = batch()
    for step in range(2):
        optimiser.zero_grad()
        model(src, src.ne(1).sum(dim=1), prev)[0].logsumexp(-1).sum().backward()
        grads = {name: p.grad for name, p in model.named_parameters() if ".aggregation." in name}
        zero = sorted(name for name, grad in grads.items() if not grad.abs().gt(0).any())
        assert zero == (sorted(name for name in grads if name.endswith("w1.weight")) if step == 0 else []), zero
        optimiser.step()


# --- parameters ------------------------------------------------------------------------------------

@pytest.mark.parametrize("variant", ["paper", "released"])
def test_parameter_count_is_the_papers_formula(variant):
    for layers, width in ((1, 8), (3, 16), (6, 512), (24, 1024)):
        stack = MultiwayDynamicDense(layers, width, variant)
        assert sum(p.numel() for p in stack.parameters()) == mudd_parameters(layers, width, variant)
    for norm_flags in ((), PRE_NORM):
        vanilla = build_model("transformer", *TINY, "--encoder-layers", "4", *norm_flags)
        mudd = build_model("fusion_transformer", *TINY, "--encoder-layers", "4", *norm_flags, *BOTH,
                           "--mudd-variant", variant)
        added = sum(p.numel() for p in mudd.parameters()) - sum(p.numel() for p in vanilla.parameters())
        pre_norm = bool(norm_flags)
        assert added == mudd_parameters(4, 16, variant, pre_norm) + mudd_parameters(2, 16, variant, pre_norm)


def added_parameters(*flags, mudd=BOTH) -> int:
    vanilla = sum(p.numel() for p in build_model("transformer", *flags).parameters())
    return sum(p.numel() for p in build_model("fusion_transformer", *flags, *mudd).parameters()) - vanilla


def test_parameters_added_to_transformer_base_and_to_the_small_setting():
    """The figures of docs/models.md: MUDD on both sides of Transformer-Base (post-norm, pre-norm as
    the ``muddformer`` preset, and released sizes) and of the 6+6, d=128, FFN 512, 4-head Transformer."""
    assert mudd_parameters(6, 512) == 57_019
    assert added_parameters() == 2 * 57_019 == 114_038
    assert added_parameters(*PRE_NORM) == 2 * mudd_parameters(6, 512, pre_norm=True) == 138_614
    vanilla = sum(p.numel() for p in build_model("transformer", *PRE_NORM).parameters())
    assert sum(p.numel() for p in build_model("muddformer").parameters()) - vanilla == 138_614
    assert added_parameters(mudd=(*BOTH, "--mudd-variant", "released")) == 404_526
    assert added_parameters(*PRE_NORM, mudd=(*BOTH, "--mudd-variant", "released")) == 429_102
    small = ("--encoder-embed-dim", "128", "--decoder-embed-dim", "128", "--encoder-ffn-embed-dim", "512",
             "--decoder-ffn-embed-dim", "512", "--encoder-attention-heads", "4", "--decoder-attention-heads", "4")
    assert mudd_parameters(6, 128) == 15_547
    assert added_parameters(*small) == 31_094
    assert added_parameters(*small, *PRE_NORM) == 2 * mudd_parameters(6, 128, pre_norm=True) == 37_238


# --- configurations --------------------------------------------------------------------------------

@pytest.mark.parametrize("flags,message", [
    (("--mudd-encoder", "--denseformer-encoder"),
     "--denseformer-encoder and --mudd-encoder both wire the encoder's layers"),
    (("--mudd-decoder", "--hyper-connections-decoder", "dynamic"),
     "--hyper-connections-decoder dynamic and --mudd-decoder both wire the decoder's layers"),
    (("--mudd-encoder", "--aggregate-encoder", "linear"),
     "--mudd-encoder and --aggregate-encoder linear both wire the encoder's layers"),
    (("--mudd-decoder", "--multi-layer-attention", "2", *DEPTH), "--mudd-decoder and --multi-layer-attention 2"),
    (("--mudd-decoder", "--cross-self-attention"), "--mudd-decoder .*does not support --cross-self-attention"),
    (("--mudd-encoder", "--encoder-layerdrop", "0.1"),
     "--encoder-layerdrop/--decoder-layerdrop must be 0 with --mudd-encoder"),
])
def test_configurations_that_wire_a_side_twice_are_refused_naming_both_flags(flags, message):
    with pytest.raises(ValueError, match=message):
        check_fusion_args(parse_model_args("fusion_transformer", *TINY, *flags))


def test_a_bad_variant_is_refused_naming_the_flag(capsys):
    with pytest.raises(SystemExit):
        parse_model_args("fusion_transformer", "--mudd-variant", "round64")
    err = capsys.readouterr().err
    assert "--mudd-variant" in err and "round64" in err


def test_the_variant_without_mudd_is_warned_about(caplog):
    check_fusion_args(parse_model_args("fusion_transformer", *TINY, "--mudd-variant", "released"))
    assert any("--mudd-variant released" in record.getMessage() and "without effect" in record.getMessage()
               for record in caplog.records)
