"""DenseFormer (Pagliardini et al. 2024) and hyper-connections (Zhu et al. 2025; mHC, Xie et al.
2026) as options of ``fusion_transformer``: at initialisation the model is fairseq's
``transformer``; the papers' parameter counts; the weights each reads; the bad configurations."""

import pytest
import torch

from fusion_fairseq.models.fusion_config import check_fusion_args
from fusion_fairseq.modules.depth_weighted_average import (
    DepthWeightedAverage,
    averaged_blocks,
    averaged_outputs,
)
from fusion_fairseq.modules.hyper_connection import (
    HyperConnection,
    ManifoldHyperConnection,
    sinkhorn,
)
from model_building import build_model, parse_model_args
from conftest import TINY_MLRF_FLAGS


def hyper_connection_parameters(kind: str, rate: int, embed_dim: int) -> int:
    """Parameters of one connection: n(n+2) for SHC; DHC adds the LayerNorm (2d), W_m, W_r, W_beta
    (d(n+2)) and two scales; mHC has nd x n(n+2) + n(n+2) + 3."""
    n, d = rate, embed_dim
    if kind == "static":
        return n * (n + 2)
    if kind == "dynamic":
        return n * (n + 2) + 2 * d + d * (n + 2) + 2
    return n * d * n * (n + 2) + n * (n + 2) + 3  # manifold


TINY = TINY_MLRF_FLAGS[:16]  # small dimensions, no fusion flags
PRE_NORM = ("--encoder-normalize-before", "--decoder-normalize-before")
BOTH_DENSEFORMER = ("--denseformer-encoder", "--denseformer-decoder")


def hyper(kind, *more):
    return ("--hyper-connections-encoder", kind, "--hyper-connections-decoder", kind, *more)


TODAYS_FUSION = {
    "denseformer": BOTH_DENSEFORMER,
    "denseformer-2x3": (*BOTH_DENSEFORMER, "--denseformer-dilation", "2", "--denseformer-period", "3"),
    "static": hyper("static"),
    "dynamic": hyper("dynamic"),
    "manifold": hyper("manifold"),
    "dynamic-rate-1": hyper("dynamic", "--hyper-connections-rate", "1"),
    "manifold-rate-3": hyper("manifold", "--hyper-connections-rate", "3"),
    "mudd": ("--mudd-encoder", "--mudd-decoder"),
    "mudd-released": ("--mudd-encoder", "--mudd-decoder", "--mudd-variant", "released"),
}


def logits(model, src_tokens, prev_output_tokens):
    model.eval()
    with torch.no_grad():
        lengths = src_tokens.ne(1).sum(dim=1)
        return model(src_tokens, lengths, prev_output_tokens)[0]


@pytest.mark.parametrize("norm", ["post-norm", "pre-norm"])
@pytest.mark.parametrize("name", sorted(TODAYS_FUSION))
def test_at_initialisation_the_model_computes_fairseqs_transformer(name, norm):
    """The fusion model, given the weights of a fairseq ``transformer`` of the same size (its own
    parameters keep their initialisation: ``strict=False``), computes the same
    logits, padding included."""
    depth = ("--encoder-layers", "6", "--decoder-layers", "6")
    norm_flags = PRE_NORM if norm == "pre-norm" else ()
    vanilla = build_model("transformer", *TINY, *depth, *norm_flags)
    fused = build_model("fusion_transformer", *TINY, *depth, *norm_flags, *TODAYS_FUSION[name])
    fused.load_state_dict(vanilla.state_dict(), strict=False)  # the fusion parameters keep their start
    torch.manual_seed(0)
    src = torch.randint(4, 100, (3, 7))
    src[0, :2] = 1  # left padding, as fairseq batches sources
    prev = torch.randint(4, 80, (3, 5))
    torch.testing.assert_close(logits(fused, src, prev), logits(vanilla, src, prev), rtol=0, atol=2e-5)


def test_once_trained_the_options_compute_something_else():
    """The identity above is a property of the initialisation, not of a wiring that ignores its weights."""
    depth = ("--encoder-layers", "3", "--decoder-layers", "3")
    vanilla = build_model("transformer", *TINY, *depth)
    src, prev = torch.randint(4, 100, (2, 6)), torch.randint(4, 80, (2, 4))
    for flags in TODAYS_FUSION.values():
        fused = build_model("fusion_transformer", *TINY, *depth, *flags)
        fused.load_state_dict(vanilla.state_dict(), strict=False)
        with torch.no_grad():
            for name, parameter in fused.named_parameters():
                if "hyper_connections." in name or "aggregation." in name:
                    parameter.add_(0.3 * torch.randn_like(parameter))
        assert not torch.allclose(logits(fused, src, prev), logits(vanilla, src, prev), atol=1e-3), flags


# --- DenseFormer ----------------------------------------------------------------------------------

def test_denseformer_has_d_times_d_plus_3_over_2_weights_per_stack():
    """Pagliardini et al. Sec. 3: d(d+3)/2 scalars for depth d (k = p = 1)."""
    for depth in (1, 3, 6, 12, 48):
        assert sum(p.numel() for p in DepthWeightedAverage(depth).parameters()) == depth * (depth + 3) // 2
    model = build_model("fusion_transformer", *TINY, *BOTH_DENSEFORMER, "--encoder-layers", "6", "--decoder-layers", "4")
    counted = sum(p.numel() for name, p in model.named_parameters() if ".aggregation." in name)
    assert counted == 6 * 9 // 2 + 4 * 7 // 2


def test_denseformer_dilation_and_period_read_what_the_authors_code_reads():
    """epfml/DenseFormer ``DWAModules``: a DWA after block i (1-based) when i % p == 0, over
    (i + k) // k outputs, those with index j = i (mod k)."""
    for dilation in (1, 2, 3, 4):
        for period in (1, 2, 3):
            blocks = averaged_blocks(12, period)
            assert blocks == [i for i in range(1, 13) if i % period == 0]
            for block in blocks:
                read = averaged_outputs(block, dilation)
                assert len(read) == (block + dilation) // dilation
                assert read[-1] == block and all((block - j) % dilation == 0 and j >= 0 for j in read)
    assert averaged_outputs(6, 2) == [0, 2, 4, 6] and averaged_outputs(5, 2) == [1, 3, 5]


def test_denseformer_hands_each_layer_the_weighted_average_of_earlier_outputs():
    stack = DepthWeightedAverage(3)
    with torch.no_grad():
        stack.alphas[1].copy_(torch.tensor([0.5, -1.0, 2.0]))  # after block 2: X_0, X_1, X_2
    inputs = []

    def apply_layer(index, layer_input, states):
        inputs.append(layer_input)
        return torch.full_like(layer_input, float(index + 1))  # X_i = i

    x0 = torch.zeros(2, 1, 4)
    top, states = stack.run(x0, apply_layer)
    assert torch.equal(inputs[1], torch.full_like(x0, 1.0))  # Y_1 = X_1 (identity weights)
    assert torch.equal(inputs[2], torch.full_like(x0, 0.5 * 0 - 1.0 * 1 + 2.0 * 2))
    assert torch.equal(top, torch.full_like(x0, 3.0)) and len(states) == 4


# --- hyper-connections ----------------------------------------------------------------------------

def test_hyper_connection_parameter_counts():
    """Zhu et al.: SHC has n(n+2) weights per connection (B, A_m, A_r); DHC adds W_m, W_r,
    W_beta (d(n+2)), two scales and its norm; mHC: phi (nd x n(n+2)), its biases and three scales."""
    d = 16
    for n in (2, 4):
        for kind, module in (("static", HyperConnection(n, d, 0, False)), ("dynamic", HyperConnection(n, d, 0, True)),
                             ("manifold", ManifoldHyperConnection(n, d))):
            assert sum(p.numel() for p in module.parameters()) == hyper_connection_parameters(kind, n, d)
    model = build_model("fusion_transformer", *TINY, *hyper("static"))
    connections = sum(p.numel() for name, p in model.named_parameters() if "hyper_connections." in name)
    assert connections == (2 * 2 + 2 * 3) * hyper_connection_parameters("static", 4, 16)  # 2+2 layers, 2 and 3 sublayers


def test_static_initialisation_reads_stream_k_mod_n_and_keeps_every_stream():
    """The paper's initialisation: A_m = e_{k mod n}, A_r = I, B = 1."""
    for k in range(6):
        connection = HyperConnection(4, 8, k, dynamic=False)
        streams = torch.randn(5, 4, 8)
        layer_input, kept, beta = connection.width(streams)
        assert torch.equal(layer_input, streams[:, k % 4])
        assert torch.equal(kept, streams) and torch.equal(beta, torch.ones(4))


def test_sinkhorn_runs_eq_9_columns_then_rows():
    """mHC's Eq. 9, M(t) = T_r(T_c(M(t-1))): the rows sum exactly to one (the last step normalises
    them), the columns to within what 20 iterations reach for logits of scale 4 (about 0.04 off);
    the order of checkpoints trained before, rows then columns, only when named."""
    torch.manual_seed(0)
    logits = 4 * torch.randn(10, 4, 4)
    matrix = sinkhorn(logits)
    assert (matrix >= 0).all()
    torch.testing.assert_close(matrix.sum(-1), torch.ones(10, 4), atol=1e-6, rtol=0)
    assert (matrix.sum(-2) - 1).abs().max() < 0.1
    old_order = sinkhorn(logits, order="rows-first")
    torch.testing.assert_close(old_order.sum(-2), torch.ones(10, 4), atol=1e-6, rtol=0)
    assert (old_order.sum(-1) - 1).abs().max() > 1e-2  # the other order leaves the rows off


def test_manifold_mixing_stays_doubly_stochastic_for_any_input():
    """mHC: whatever the streams and weights, the stream mixing H_res has rows summing to one (each
    new stream is a convex combination of the old ones) and columns to within what 20 iterations
    reach; the sublayer's input weights are in (0, 1) and its output weights in (0, 2)."""
    torch.manual_seed(1)
    connection = ManifoldHyperConnection(4, 8)
    with torch.no_grad():
        for parameter in connection.parameters():
            parameter.add_(torch.randn_like(parameter))
    streams = 5 * torch.randn(3, 4, 8)
    _, kept, post = connection.width(streams)
    assert ((post >= 0) & (post <= 2)).all()
    n = 4
    flat = streams.flatten(-2)
    flat = flat * torch.rsqrt(flat.pow(2).mean(-1, keepdim=True) + 1e-6)
    logits = connection.scales[2] * (flat @ connection.phi)[..., 2 * n:] + connection.bias[2 * n:]
    res = sinkhorn(logits.unflatten(-1, (n, n)))
    constant = torch.ones(3, 4, 8)
    torch.testing.assert_close(res @ constant, constant, atol=1e-5, rtol=0)  # rows: a constant stream is kept
    assert (res.sum(-2) - 1).abs().max() < 0.05  # columns: as far as 20 iterations reach
    torch.testing.assert_close(kept, res @ streams)


def test_the_sinkhorn_order_reaches_the_model():
    """``--hyper-connections-sinkhorn-order`` sets every mHC connection's order (default: Eq. 9)."""
    for flags, order in (((), "columns-first"), (("--hyper-connections-sinkhorn-order", "rows-first"), "rows-first")):
        model = build_model("fusion_transformer", *TINY, *hyper("manifold"), *flags)
        orders = {module.sinkhorn_order for module in model.modules() if isinstance(module, ManifoldHyperConnection)}
        assert orders == {order}


def output_weights(model):
    return {name: p.detach().clone() for name, p in model.named_parameters()
            if name.endswith(("out_proj.weight", "fc2.weight"))}


@pytest.mark.parametrize("kind", ["static", "dynamic"])
def test_hyper_connections_divide_the_output_projections_init_by_sqrt_n(kind):
    """Zhu et al. Sec. 4: each sublayer's output projection (self- and cross-attention's out_proj, the
    FFN's fc2) starts with its std divided by sqrt(n); everything else as fairseq initialises it, and
    ``--hyper-connections-no-output-rescale`` keeps fairseq's."""
    def built(*flags):
        torch.manual_seed(3)
        return build_model("fusion_transformer", *TINY, *hyper(kind, "--hyper-connections-rate", "4"), *flags)

    rescaled, kept = built(), built("--hyper-connections-no-output-rescale")
    expected = {name: weight / 2 for name, weight in output_weights(kept).items()}  # sqrt(4)
    assert len(expected) == 2 * 2 + 2 * 3  # 2 encoder layers x 2 sublayers, 2 decoder layers x 3
    for name, weight in output_weights(rescaled).items():
        torch.testing.assert_close(weight, expected[name], rtol=0, atol=0)
    others = {name for name in dict(kept.named_parameters()) if name not in expected}
    for name in others:
        assert torch.equal(dict(rescaled.named_parameters())[name], dict(kept.named_parameters())[name]), name


def test_manifold_hyper_connections_keep_fairseqs_initialisation():
    """mHC's paper states no rescaling: its output projections start as fairseq's."""
    def built(*flags):
        torch.manual_seed(3)
        return build_model("fusion_transformer", *TINY, *flags)

    vanilla, manifold = output_weights(built()), output_weights(built(*hyper("manifold")))
    for name, weight in manifold.items():
        assert torch.equal(weight, vanilla[name]), name


def adam_step(model, optimizer_name, weight_decay=0.1):
    """One step of a fairseq optimizer, built as fairseq's trainer builds it, with every gradient zero:
    only the weight decay moves the parameters."""
    from fairseq import optim
    from omegaconf import OmegaConf

    cfg = OmegaConf.create({"_name": optimizer_name, "adam_betas": "(0.9, 0.98)", "adam_eps": 1e-8,
                            "weight_decay": weight_decay, "use_old_adam": False, "fp16_adam_stats": False,
                            "tpu": False, "lr": [0.5]})
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = optim.build_optimizer(cfg, params)
    for p in params:
        p.grad = torch.zeros_like(p)
    before = {name: p.detach().clone() for name, p in model.named_parameters() if p.any()}  # 0 decays to 0
    optimizer.step()
    return {name: not torch.equal(before[name], p) for name, p in model.named_parameters() if name in before}


def test_static_hyper_connection_weights_get_no_weight_decay():
    """Zhu et al. Sec. 4: no weight decay on the static weights A_m, A_r, B; fairseq's Adam decays every
    parameter, ``--optimizer adam_with_overrides`` honours the parameters' ``optim_overrides``; the
    dynamic weights and the rest of the model are decayed as by ``--optimizer adam``."""
    torch.manual_seed(0)
    model = build_model("fusion_transformer", *TINY, *hyper("dynamic"))
    moved = adam_step(model, "adam_with_overrides")
    static = {name for name in moved if name.endswith(("static_alpha", "static_beta"))}
    assert static and not any(moved[name] for name in static)
    assert all(moved[name] for name in moved if name not in static)
    assert all(adam_step(build_model("fusion_transformer", *TINY, *hyper("dynamic")), "adam").values())
    decayed = build_model("fusion_transformer", *TINY, *hyper("dynamic"), "--hyper-connections-decay-static")
    assert all(adam_step(decayed, "adam_with_overrides").values())


def test_adam_with_overrides_is_fairseqs_adam_where_nothing_is_overridden():
    """Without any override the update is ``--optimizer adam``'s, to the last bit."""
    results = []
    for name in ("adam", "adam_with_overrides"):
        torch.manual_seed(0)
        model = build_model("fusion_transformer", *TINY, *hyper("manifold"))
        params = [p for p in model.parameters()]
        torch.manual_seed(1)
        for p in params:
            p.grad = torch.randn_like(p)
        adam_step_with_grads(model, name)
        results.append([p.detach().clone() for p in params])
    for a, b in zip(*results):
        assert torch.equal(a, b)


def test_an_optimizer_state_of_other_groups_is_refused_naming_the_way_out():
    """A run resumed with --hyper-connections-decay-static switched: torch's 40-line ValueError ("a different
    number of parameter groups") before; one line naming the flag and --reset-optimizer now."""
    from fairseq import optim
    from omegaconf import OmegaConf

    cfg = OmegaConf.create({"_name": "adam_with_overrides", "adam_betas": "(0.9, 0.98)", "adam_eps": 1e-8,
                            "weight_decay": 0.01, "use_old_adam": False, "fp16_adam_stats": False, "tpu": False,
                            "lr": [0.01]})
    undecayed = optim.build_optimizer(cfg, list(build_model("fusion_transformer", *TINY, *hyper("static")).parameters()))
    decayed = optim.build_optimizer(cfg, list(build_model(
        "fusion_transformer", *TINY, *hyper("static"), "--hyper-connections-decay-static").parameters()))
    with pytest.raises(ValueError, match=r"^--optimizer adam_with_overrides: the checkpoint's optimizer state has 2 "
                                         r"parameter group\(s\), this model's parameters form 1 .*"
                                         r"--hyper-connections-decay-static\); pass --reset-optimizer"):
        decayed.load_state_dict(undecayed.state_dict())
    undecayed.load_state_dict(undecayed.state_dict())  # the same groups load


def adam_step_with_grads(model, optimizer_name):
    from fairseq import optim
    from omegaconf import OmegaConf

    cfg = OmegaConf.create({"_name": optimizer_name, "adam_betas": "(0.9, 0.98)", "adam_eps": 1e-8,
                            "weight_decay": 0.01, "use_old_adam": False, "fp16_adam_stats": False,
                            "tpu": False, "lr": [0.01]})
    optim.build_optimizer(cfg, list(model.parameters())).step()


@pytest.mark.slow
def test_fairseq_train_keeps_the_static_weights_undecayed_through_a_resume(tiny_data_bin, tmp_path):
    """fairseq's own trainer with ``--optimizer adam_with_overrides``: the static weights form their own
    group with no weight decay, and resuming from the checkpoint (fairseq reloads the optimizer state)
    keeps it so, also under ``--optimizer-overrides``."""
    from conftest import USER_DIR, run_cli

    def train(updates, *more):
        run_cli("fairseq_cli.train", tiny_data_bin, "--user-dir", USER_DIR, "--arch", "fusion_transformer", *TINY,
                *hyper("dynamic"), "--optimizer", "adam_with_overrides", "--weight-decay", "0.5", "--lr", "0.001",
                "--max-tokens", "1000", "--max-update", str(updates), "--save-dir", str(tmp_path), "--seed", "1",
                "--no-progress-bar", "--no-epoch-checkpoints", "--num-workers", "0", *more)
        state = torch.load(tmp_path / "checkpoint_last.pt", map_location="cpu", weights_only=False)
        return [group["weight_decay"] for group in state["last_optimizer_state"]["param_groups"]]

    assert train(3) == [0.5, 0.0]
    assert train(5, "--optimizer-overrides", "{'weight_decay': 0.25}") == [0.25, 0.0]


def test_hyper_connections_dynamic_parts_learn():
    """The parts the papers start at zero get a gradient at the first step; after one update, so do
    the scales and the norm they gate."""
    for kind in ("dynamic", "manifold"):
        model = build_model("fusion_transformer", *TINY, *hyper(kind))
        model.train()
        optimiser = torch.optim.SGD(model.parameters(), lr=0.1)
        src, prev = torch.randint(4, 100, (2, 6)), torch.randint(4, 80, (2, 4))
        for step in range(2):
            optimiser.zero_grad()
            model(src, src.ne(1).sum(dim=1), prev)[0].float().logsumexp(-1).sum().backward()
            grads = {name: p.grad for name, p in model.named_parameters() if "hyper_connections.0." in name}
            zero = sorted(name for name, grad in grads.items() if not grad.abs().gt(0).any())
            if step == 0:
                assert zero and all(name.endswith(("scale", "scales", "norm.weight", "norm.bias")) for name in zero), zero
            else:
                assert not zero, zero
            optimiser.step()


# --- configurations -----------------------------------------------------------------------------

def args_with(*flags):
    return parse_model_args("fusion_transformer", *TINY, *flags)


@pytest.mark.parametrize("flags,message", [
    (("--denseformer-encoder", "--aggregate-encoder", "dense"),
     "--denseformer-encoder and --aggregate-encoder dense both wire the encoder's layers"),
    (("--hyper-connections-decoder", "static", "--denseformer-decoder"),
     "--denseformer-decoder and --hyper-connections-decoder static both wire the decoder's layers"),
    (("--hyper-connections-encoder", "dynamic", "--aggregate-encoder", "hierarchical"),
     "--hyper-connections-encoder dynamic and --aggregate-encoder hierarchical both wire"),
    (("--hyper-connections-encoder", "dynamic", "--multi-layer-attention", "2", "--encoder-layers", "3",
      "--decoder-layers", "3"),
     "--hyper-connections-encoder dynamic and --multi-layer-attention 2"),
    (("--hyper-connections-decoder", "manifold", "--hyper-connections-rate", "1"),
     "--hyper-connections-decoder manifold needs --hyper-connections-rate of at least 2 .*got 1"),
    (("--denseformer-decoder", "--denseformer-period", "3"),
     "--denseformer-period 3 leaves no decoder layer averaged: --decoder-layers is 2"),
    (("--hyper-connections-decoder", "dynamic", "--cross-self-attention"),
     "does not support --cross-self-attention"),
    (("--denseformer-encoder", "--encoder-layerdrop", "0.1"),
     "--encoder-layerdrop/--decoder-layerdrop must be 0 with --denseformer-encoder"),
])
def test_configurations_that_do_not_compose_are_refused_naming_both_flags(flags, message):
    with pytest.raises(ValueError, match=message):
        check_fusion_args(args_with(*flags))


@pytest.mark.parametrize("flag,value", [("--hyper-connections-encoder", "ring"), ("--hyper-connections-rate", "0"),
                                        ("--denseformer-dilation", "0"), ("--denseformer-period", "-1")])
def test_bad_values_are_refused_naming_the_flag(capsys, flag, value):
    with pytest.raises(SystemExit):
        parse_model_args("fusion_transformer", flag, value)
    err = capsys.readouterr().err
    assert flag in err and value in err


@pytest.mark.parametrize("flags,idle", [
    (("--denseformer-dilation", "2"), "--denseformer-dilation 2"),
    (("--hyper-connections-rate", "2"), "--hyper-connections-rate 2"),
    (("--hyper-connections-encoder", "static", "--hyper-connections-sinkhorn-order", "rows-first"),
     "--hyper-connections-sinkhorn-order rows-first: only manifold hyper-connections normalise their stream mix, and "
     "--hyper-connections-encoder/--hyper-connections-decoder are static/none"),
    (("--hyper-connections-decoder", "manifold", "--hyper-connections-no-output-rescale"),
     "--hyper-connections-no-output-rescale: only static and dynamic hyper-connections rescale"),
    (("--hyper-connections-decay-static",), "--hyper-connections-decay-static: only static and dynamic"),
])
def test_flags_without_their_feature_are_warned_about(caplog, flags, idle):
    check_fusion_args(args_with(*flags))
    assert any(idle in record.getMessage() and "without effect" in record.getMessage() for record in caplog.records)


@pytest.mark.parametrize("flags", [
    ("--hyper-connections-encoder", "manifold", "--hyper-connections-sinkhorn-order", "rows-first"),
    ("--hyper-connections-decoder", "dynamic", "--hyper-connections-no-output-rescale", "--hyper-connections-decay-static"),
    ("--denseformer-decoder", "--denseformer-period", "2"), ("--mudd-encoder", "--mudd-variant", "released"),
])
def test_flags_with_their_feature_give_no_warning(caplog, flags):
    check_fusion_args(args_with(*flags))
    assert not [record for record in caplog.records if record.levelname == "WARNING"]


def test_parameters_added_to_transformer_base():
    """The figures of docs/models.md: fairseq's base Transformer (6+6, d=512) with each option,
    against the formulas: 2 x d(d+3)/2 DWA weights; 30 connections (6 encoder layers of 2
    sublayers, 6 decoder layers of 3) of n(n+2) = 24 (SHC), 24 + 2d + d(n+2) + 2 = 4,122 (DHC)
    and nd n(n+2) + n(n+2) + 3 = 49,179 (mHC) for n = 4."""
    vanilla = sum(p.numel() for p in build_model("transformer").parameters())
    added = {
        BOTH_DENSEFORMER: 2 * 27,
        hyper("static"): 30 * 24,
        hyper("dynamic"): 30 * 4_122,
        hyper("manifold"): 30 * 49_179,
    }
    for flags, expected in added.items():
        assert sum(p.numel() for p in build_model("fusion_transformer", *flags).parameters()) - vanilla == expected, flags


@pytest.mark.parametrize("override", [{"hyper_connections_rate": 2}, {"hyper_connections_decoder": "static"},
                                      {"denseformer_period": 2}, {"denseformer_encoder": False}])
def test_a_checkpoint_keeps_its_structure_against_model_overrides(override):
    """The options are structural: ``--model-overrides`` cannot change them at load (checkpoint_safety)."""
    from fusion_fairseq.checkpoint_safety import structural_override_errors

    trained = args_with(*BOTH_DENSEFORMER, "--encoder-layers", "4", *hyper("dynamic")[2:])
    trained.denseformer_decoder = False  # one wiring per side: DenseFormer encoder, hyper-connections decoder
    (error,) = structural_override_errors("ckpt.pt", trained, override)
    (flag, value), = override.items()
    assert f"--model-overrides sets {flag} {value!r} but checkpoint ckpt.pt was trained with {flag}" in str(error)
