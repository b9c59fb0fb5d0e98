"""Layer aggregation and multi-layer attention (Dou et al., EMNLP 2018) against hand-computed values."""

import math
import os
import shlex
import subprocess

import pytest
import torch
from fairseq import options

from fusion_fairseq.modules import AggregationNode, hierarchical_tree
from fusion_fairseq.modules.layer_aggregation import (
    DenseConnection,
    HierarchicalAggregation,
    IterativeAggregation,
    LinearCombination,
)
from conftest import USER_DIR
from model_building import build_model, count_parameters, parse_model_args


def add_one(index, layer_input, states):
    return layer_input + 1


@pytest.mark.parametrize("layers,tree", [
    (3, [((1, 2), None), ((3,), 0)]),
    (4, [((1, 2), None), ((3, 4), 0)]),
    (6, [((1, 2), None), ((3, 4), 0), ((5, 6), 1)]),
    (7, [((1, 2), None), ((3, 4), 0), ((5, 6), 1), ((7,), 2)]),
])
def test_hierarchical_tree(layers, tree):
    assert hierarchical_tree(layers) == tree


def layer_norm(values):
    mean = sum(values) / len(values)
    variance = sum((v - mean) ** 2 for v in values) / len(values)
    return [(v - mean) / math.sqrt(variance + 1e-5) for v in values]


def set_node(node, fc1_weight, fc2_weight):
    with torch.no_grad():
        node.fc1.weight.copy_(torch.tensor(fc1_weight))
        node.fc1.bias.zero_()
        node.fc2.weight.copy_(torch.tensor(fc2_weight))
        node.fc2.bias.zero_()


@pytest.mark.parametrize("residual", ["all", "top", "none"])
def test_aggregation_node_eq7_by_hand(residual):
    node = AggregationNode(num_inputs=2, embed_dim=2, hidden_dim=1, function="sigmoid", residual=residual, top_input=0)
    set_node(node, [[1.0, 0.0, 0.0, 1.0]], [[2.0], [-2.0]])  # hidden = sigmoid(x[0] + y[1])
    x, y = [1.0, 3.0], [0.5, -1.0]
    hidden = 1 / (1 + math.exp(-(1.0 - 1.0)))
    ffn = [2 * hidden, -2 * hidden]
    residual_term = {"all": [x[0] + y[0], x[1] + y[1]], "top": x, "none": [0.0, 0.0]}[residual]
    expected = layer_norm([f + r for f, r in zip(ffn, residual_term)])
    assert node(torch.tensor(x), torch.tensor(y)).tolist() == pytest.approx(expected, abs=1e-5)


def test_aggregation_node_relu_and_attention_functions():
    relu = AggregationNode(2, 2, 1, function="relu")
    set_node(relu, [[-1.0, 0.0, 0.0, 0.0]], [[1.0], [0.0]])
    x, y = torch.tensor([2.0, 0.0]), torch.tensor([0.0, 1.0])
    assert relu(x, y).tolist() == pytest.approx(layer_norm([2.0, 1.0]), abs=1e-5)  # relu(-2) = 0
    attention = AggregationNode(3, 4, 8, function="attention", num_heads=2)
    inputs = [torch.randn(5, 2, 4) for _ in range(3)]
    assert attention(*inputs).shape == (5, 2, 4)
    with pytest.raises(ValueError, match="needs FFN aggregation"):
        attention.input_weight_blocks()


def test_aggregation_node_drops_out_f_before_the_residual_sum():
    """In training, F's output is dropped out (the model's --dropout) before the inputs are added;
    in evaluation the node is Eq. 7 as above."""
    torch.manual_seed(0)
    node = AggregationNode(2, 8, 16, dropout=0.5)
    x, y = torch.randn(50, 8), torch.randn(50, 8)
    node.eval()
    evaluated = node(x, y)
    torch.testing.assert_close(evaluated, node.layer_norm(node.transform([x, y]) + x + y))
    node.train()
    torch.manual_seed(1)
    trained = node(x, y)
    torch.manual_seed(1)  # the same draw: the node's dropout is its only random operation
    mask = torch.nn.functional.dropout(torch.ones(50, 8), 0.5, training=True)
    torch.testing.assert_close(trained, node.layer_norm(node.transform([x, y]) * mask + x + y))
    assert not torch.allclose(trained, evaluated)


def test_aggregation_strategies_pass_the_models_dropout_to_their_nodes():
    model = build_model("fusion_transformer", "--aggregate-encoder", "hierarchical", "--aggregate-decoder",
                        "iterative", "--multi-layer-attention", "2", "--dropout", "0.25")
    nodes = [m for name, m in model.named_modules() if isinstance(m, AggregationNode)]
    in_stacks = [m for name, m in model.named_modules() if isinstance(m, AggregationNode) and ".aggregation." in name]
    assert in_stacks and all(node.dropout_module.p == 0.25 for node in in_stacks)
    assert all(node.dropout_module.p == 0.0 for node in nodes if node not in in_stacks)  # multi-layer attention's


def test_dense_connection_literal_is_eq4_by_hand():
    # H1 = L(H0); H2 = L(H1) + H1; H3 = L(H2) + H1 + H2, with L(x) = x + 1
    top, states = DenseConnection(3, "literal").run(torch.tensor([0.0]), add_one)
    h1 = 1.0
    h2 = (h1 + 1) + h1
    h3 = (h2 + 1) + h1 + h2
    assert [s.item() for s in states] == [0.0, h1, h2, h3]
    assert top.item() == h3


def test_dense_connection_sum_adds_the_layers_own_outputs():
    # O1 = L(H0) = 1, H1 = 1; O2 = L(H1) = 2, H2 = O1 + O2 = 3; O3 = L(H2) = 4, H3 = 1 + 2 + 4 = 7
    top, states = DenseConnection(3, "sum").run(torch.tensor([0.0]), add_one)
    assert [s.item() for s in states] == [0.0, 1.0, 3.0, 7.0]
    assert top.item() == 7.0


def test_dense_connection_mean_averages_the_layers_own_outputs():
    # O1 = 1, H1 = 1; O2 = L(H1) = 2, H2 = (1 + 2) / 2 = 1.5; O3 = L(H2) = 2.5, H3 = (1 + 2 + 2.5) / 3
    top, states = DenseConnection(3, "mean").run(torch.tensor([0.0]), add_one)
    assert [s.item() for s in states] == pytest.approx([0.0, 1.0, 1.5, 5.5 / 3])
    assert top.item() == pytest.approx(5.5 / 3)


def test_dense_connection_default_is_layernorm():
    assert DenseConnection(3).reading == "layernorm"
    assert parse_model_args("fusion_transformer").dense_connection == "layernorm"
    assert parse_model_args("fusion_transformer", "--dense-connection", "literal").dense_connection == "literal"


def test_dense_connection_layernorm_normalises_eq4_without_parameters():
    def output(index, layer_input, states):
        return torch.tensor([1.0, 3.0]) * (index + 1)

    dense = DenseConnection(2)
    assert not list(dense.parameters())
    _, states = dense.run(torch.zeros(2), output)
    assert states[1].tolist() == pytest.approx([-1.0, 1.0], abs=1e-4)  # LN([1, 3])
    assert states[2].tolist() == pytest.approx([-1.0, 1.0], abs=1e-4)  # LN([2, 6] + H1) = LN([1, 7])


def test_dense_connection_unknown_reading_is_an_error():
    with pytest.raises(ValueError, match="DenseConnection reading must be one of layernorm, literal, sum, mean, got 'half'"):
        DenseConnection(3, "half")


def top_decoder_state_norm(model):
    torch.manual_seed(0)
    src, prev = torch.randint(4, 100, (2, 6)), torch.randint(4, 80, (2, 5))
    with torch.no_grad():
        features, _ = model(src, torch.full((2,), 6), prev, features_only=True)
    return features.norm(dim=-1).mean().item()


@pytest.mark.parametrize("reading,low,high", [("layernorm", 0.8, 1.2), ("mean", 0.8, 1.2), ("literal", 10.0, 64.0)])
def test_dense_connection_scale_from_the_same_vanilla_weights(reading, low, high):
    # six decoder layers: the literal sum doubles every layer; the default keeps the vanilla scale
    six = [*TINY, "--encoder-layers", "6", "--decoder-layers", "6"]
    vanilla = build_model("fusion_transformer", *six).eval()
    dense = build_model("fusion_transformer", *six, "--aggregate-encoder", "dense", "--aggregate-decoder", "dense",
                        "--dense-connection", reading).eval()
    dense.load_state_dict(vanilla.state_dict(), strict=True)
    ratio = top_decoder_state_norm(dense) / top_decoder_state_norm(vanilla)
    assert low < ratio < high


def test_linear_combination_starts_as_the_vanilla_stack_and_combines_all_lower_layers():
    stack = LinearCombination(num_layers=2, embed_dim=1)
    top, states = stack.run(torch.tensor([0.5]), add_one)
    assert [s.item() for s in states] == [0.5, 1.5, 2.5] and top.item() == 2.5
    with torch.no_grad():
        stack.combinations[1].weight.copy_(torch.tensor([[2.0, 3.0]]))  # input of layer 2: 2 H0 + 3 H1
        stack.combinations[2].weight.copy_(torch.tensor([[1.0, -1.0, 10.0]]))  # output: H0 - H1 + 10 H2
    top, states = stack.run(torch.tensor([0.5]), add_one)
    h1 = 0.5 + 1
    h2 = (2 * 0.5 + 3 * h1) + 1
    assert [s.item() for s in states] == pytest.approx([0.5, h1, h2])
    assert top.item() == pytest.approx(0.5 - h1 + 10 * h2)


def test_linear_combination_has_one_matrix_per_combination_and_lower_layer():
    stack = LinearCombination(num_layers=6, embed_dim=4)
    assert sum(p.numel() for p in stack.parameters()) == 28 * 16  # (L+1)(L+2)/2 matrices


def record_inputs(log):
    def apply_layer(index, layer_input, states):
        log.append((index, layer_input.clone(), len(states)))
        return layer_input * 2 + index
    return apply_layer


def test_hierarchical_aggregation_feeds_nodes_back_into_the_backbone():
    torch.manual_seed(0)
    stack = HierarchicalAggregation(3, lambda k, top: AggregationNode(k, 4, 8, top_input=top))
    log = []
    x0 = torch.randn(2, 4)
    top, states = stack.run(x0, record_inputs(log))
    node0 = stack.nodes[0](states[1], states[2])
    assert torch.equal(log[1][1], states[1])  # layer 2 reads layer 1
    assert torch.allclose(log[2][1], node0)  # layer 3 reads the first node, not H^2
    assert torch.allclose(top, stack.nodes[1](states[3], node0))
    assert [node.num_inputs for node in stack.nodes] == [2, 2]
    assert [node.num_inputs for node in HierarchicalAggregation(6, lambda k, t: AggregationNode(k, 4, 8)).nodes] == [2, 3, 3]


def test_iterative_aggregation_chains_without_feeding_back():
    torch.manual_seed(0)
    stack = IterativeAggregation(3, lambda k, top: AggregationNode(k, 4, 8, top_input=top))
    log = []
    top, states = stack.run(torch.randn(2, 4), record_inputs(log))
    assert all(torch.equal(log[i][1], states[i]) for i in range(3))  # plain backbone
    expected = stack.nodes[1](states[3], stack.nodes[0](states[2], states[1]))
    assert torch.allclose(top, expected)


BASE = ["--encoder-layers", "6", "--decoder-layers", "6", "--encoder-embed-dim", "512", "--encoder-ffn-embed-dim", "2048",
        "--encoder-attention-heads", "8", "--decoder-attention-heads", "8"]


def base_delta(*flags):
    vanilla = count_parameters(build_model("fusion_transformer", *BASE, src_vocab=8, tgt_vocab=8))
    return count_parameters(build_model("fusion_transformer", *BASE, *flags, src_vocab=8, tgt_vocab=8)) - vanilla


@pytest.mark.slow
def test_table1_parameter_deltas_on_transformer_base():
    d, f = 512, 2048
    node = lambda k: k * d * f + f + f * d + d + 2 * d  # noqa: E731  FFN [x1..xk] -> f -> d, then LN
    both = lambda side: ["--aggregate-encoder", side, "--aggregate-decoder", side]  # noqa: E731
    assert base_delta(*both("dense")) == 0
    assert base_delta(*both("linear")) == 2 * 28 * d * d == 14_680_064  # Table 1: +14.7M
    assert base_delta(*both("linear-output")) == 2 * 6 * d * d == 3_145_728  # Eq. 5 as written: +3.1M
    assert base_delta(*both("iterative")) == 2 * 5 * node(2) == 31_493_120  # Table 1: +31.5M
    assert base_delta(*both("hierarchical")) == 2 * (node(2) + 2 * node(3)) == 23_090_176  # Table 1: +23.1M


def test_eq5_as_written_combines_the_layers_once_at_the_output():
    """linear-output: the layers are the vanilla stack's; the output is sum_l W_l H^l (H^0 excluded),
    which starts as the vanilla output."""
    torch.manual_seed(0)
    vanilla = build_model("fusion_transformer", *TINY).eval()
    combined = build_model("fusion_transformer", *TINY, "--aggregate-encoder", "linear-output").eval()
    combined.load_state_dict(vanilla.state_dict(), strict=False)
    tokens, lengths = torch.tensor([[5, 6, 7, 2]]), torch.tensor([4])
    vanilla_out = vanilla.encoder(tokens, lengths, return_all_hiddens=True)
    combined_out = combined.encoder(tokens, lengths, return_all_hiddens=True)
    assert torch.allclose(combined_out["encoder_out"][0], vanilla_out["encoder_out"][0], atol=1e-6)
    with torch.no_grad():
        combined.encoder.aggregation.combination.weight.normal_()
    changed = combined.encoder(tokens, lengths, return_all_hiddens=True)["encoder_out"][0]
    assert not torch.allclose(changed, vanilla_out["encoder_out"][0], atol=1e-3)


def test_multi_layer_attention_parameter_delta():
    """Reading of Eq. 8: one full extra attention per extra lower layer and an Eq. 7 node over the
    k contexts, in every layer l with k layer outputs below it (l > k): Table 1's +33.6M (k=2)
    and +37.8M (k=3) on Transformer-Base."""
    d, f = 512, 2048
    attention = 4 * (d * d + d)
    node = lambda k: k * d * f + f + f * d + d + 2 * d  # noqa: E731
    assert base_delta("--multi-layer-attention", "2") == 2 * 4 * (attention + node(2)) == 33_599_488  # +33.6M
    assert base_delta("--multi-layer-attention", "3") == 2 * 3 * (2 * attention + node(3)) == 37_794_816  # +37.8M


def test_multi_layer_attention_hands_each_layer_its_lower_layers():
    model = build_model("fusion_transformer", "--encoder-layers", "5", "--decoder-layers", "4",
                        "--encoder-embed-dim", "8", "--encoder-ffn-embed-dim", "16", "--encoder-attention-heads", "2",
                        "--decoder-attention-heads", "2", "--multi-layer-attention", "3", "--dropout", "0").eval()
    layers = model.encoder.layers
    assert [len(getattr(layer.self_attn, "lower_attentions", [])) for layer in layers] == [0, 0, 0, 2, 2]
    assert [len(getattr(layer.self_attn, "lower_attentions", [])) for layer in model.decoder.layers] == [0, 0, 0, 2]
    seen = {}
    for index, attention in enumerate(layers[3].self_attn.lower_attentions):
        attention.register_forward_hook(
            lambda module, args, kwargs, out, index=index: seen.__setitem__(index, kwargs.get("key", args[1] if len(args) > 1 else None)),
            with_kwargs=True)
    src = torch.randint(4, 100, (2, 5))
    out = model.encoder(src, torch.full((2,), 5), return_all_hiddens=True)
    states = out["encoder_states"]
    assert torch.equal(seen[0], states[2]) and torch.equal(seen[1], states[1])  # H^{l-2}, H^{l-3} for l = 4


@pytest.mark.parametrize("flags,message", [
    (["--aggregate-encoder", "hierarchical", "--fuse-encoder", "fnn"],
     "--aggregate-encoder hierarchical and --fuse-encoder fnn both define the encoder's output"),
    (["--aggregate-decoder", "dense", "--decoder-layerdrop", "0.1"], "--decoder-layerdrop must be 0 with --aggregate-decoder dense"),
    (["--multi-layer-attention", "3", "--decoder-layers", "3"],
     "--multi-layer-attention 3 attends the 3 layers below a layer, so it needs more than 3 layers; --decoder-layers is 3"),
])
def test_combinations_that_do_not_make_sense_are_refused(flags, message):
    with pytest.raises(ValueError, match=message.replace("/", ".")):
        build_model("fusion_transformer", *flags)


@pytest.mark.parametrize("flags,message", [
    (["--aggregate-encoder", "tree"], "argument --aggregate-encoder: invalid choice: 'tree'"),
    (["--aggregation-fn", "tanh"], "argument --aggregation-fn: invalid choice: 'tanh'"),
    (["--aggregation-residual", "some"], "argument --aggregation-residual: invalid choice: 'some'"),
    (["--dense-connection", "half"], "argument --dense-connection: invalid choice: 'half'"),
    (["--multi-layer-attention", "0"], "--multi-layer-attention must be a positive integer, got '0'"),
])
def test_bad_flags(capsys, flags, message):
    with pytest.raises(SystemExit):
        parse_model_args("fusion_transformer", *flags)
    assert message in capsys.readouterr().err


def test_deeprep_architectures():
    base = parse_model_args("deeprep_transformer_wmt_en_de")
    assert (base.encoder_embed_dim, base.aggregate_encoder, base.aggregate_decoder) == (512, "hierarchical", "hierarchical")
    assert (base.aggregation_fn, base.aggregation_residual) == ("sigmoid", "all")
    big = parse_model_args("deeprep_transformer_wmt_en_de_big")
    assert (big.encoder_embed_dim, big.encoder_attention_heads, big.dropout) == (1024, 16, 0.3)


TINY = ["--encoder-layers", "3", "--decoder-layers", "3", "--encoder-embed-dim", "16", "--decoder-embed-dim", "16",
        "--encoder-ffn-embed-dim", "32", "--decoder-ffn-embed-dim", "32", "--encoder-attention-heads", "2",
        "--decoder-attention-heads", "2", "--dropout", "0"]


def test_vanilla_checkpoint_initialises_a_fusion_model():
    vanilla = build_model("transformer", *TINY).eval()
    fusion = build_model("fusion_transformer", *TINY, "--aggregate-encoder", "hierarchical",
                         "--aggregate-decoder", "linear", "--multi-layer-attention", "2").eval()
    fresh = {k: v.clone() for k, v in fusion.state_dict().items()}
    fusion.load_state_dict(vanilla.state_dict(), strict=False)
    loaded = fusion.state_dict()
    for key, value in vanilla.state_dict().items():
        assert torch.equal(loaded[key], value), key
    new_keys = set(loaded) - set(vanilla.state_dict())
    assert new_keys and all(torch.equal(loaded[key], fresh[key]) for key in new_keys)
    # linear aggregation alone starts exactly as the vanilla model
    linear = build_model("fusion_transformer", *TINY, "--aggregate-encoder", "linear", "--aggregate-decoder", "linear").eval()
    linear.load_state_dict(vanilla.state_dict(), strict=False)
    src, prev = torch.randint(4, 100, (2, 6)), torch.randint(4, 80, (2, 4))
    lengths = torch.full((2,), 6)
    assert torch.allclose(linear(src, lengths, prev)[0], vanilla(src, lengths, prev)[0], atol=1e-6)


def test_a_fusion_checkpoint_with_other_fusion_modules_still_fails_the_strict_load():
    hierarchical = build_model("fusion_transformer", *TINY, "--encoder-layers", "4", "--aggregate-encoder", "hierarchical")
    iterative = build_model("fusion_transformer", *TINY, "--encoder-layers", "4", "--aggregate-encoder", "iterative")
    with pytest.raises(RuntimeError, match="Error.s. in loading state_dict"):
        iterative.load_state_dict(hierarchical.state_dict(), strict=True)


DEEPREP_TRAIN_SH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "examples", "deep_representations", "train.sh")


@pytest.mark.parametrize("variant,expected", [
    ("vanilla", {"arch": "transformer_wmt_en_de", "criterion": "label_smoothed_cross_entropy"}),
    # the control: the vanilla model continued with stage 2's restarted schedule and budget
    ("vanilla-continued", {"arch": "transformer_wmt_en_de", "criterion": "label_smoothed_cross_entropy",
                           "max_update": 100000, "warmup_updates": 4000}),
    ("linear-output", {"aggregate_encoder": "linear-output", "aggregate_decoder": "linear-output"}),
    ("linear", {"arch": "deeprep_transformer_wmt_en_de", "aggregate_encoder": "linear", "aggregate_decoder": "linear"}),
    ("mla3", {"aggregate_encoder": "none", "multi_layer_attention": 3}),
    ("hierarchical+div", {"aggregate_decoder": "hierarchical", "diversity_lambda": 1.0,
                          "criterion": "label_smoothed_cross_entropy_with_layer_diversity"}),
    ("fn-relu", {"aggregation_fn": "relu"}),
])
def test_recipe_commands_parse_with_the_paper_settings(variant, expected, tmp_path):
    """examples/deep_representations/train.sh --dry-run: a fairseq-train command that fairseq's
    parser accepts, Transformer-Base trained as the paper (8 GPUs x 4096 tokens, emulated), the
    fusion variants initialised from the vanilla checkpoint."""
    result = subprocess.run(["bash", DEEPREP_TRAIN_SH, str(tmp_path), variant, "--dry-run", "--gpus", "2",
                             "--user-dir", USER_DIR], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    argv = shlex.split(result.stdout)
    args = options.parse_args_and_arch(options.get_training_parser(), argv[1:])
    for key, value in expected.items():
        assert getattr(args, key) == value, key
    assert argv[0] == "fairseq-train" and args.max_tokens * 2 * args.update_freq[0] == 8 * 4096
    assert (args.encoder_layers, args.encoder_embed_dim, args.share_all_embeddings) == (6, 512, False)
    vanilla = "checkpoints/deeprep-wmt14-en-de/vanilla/checkpoint_best.pt"
    assert (args.finetune_from_model == vanilla) == (variant != "vanilla")


@pytest.mark.parametrize("argv,message", [
    (["bogus"], "unknown VARIANT 'bogus'"),
    (["vanilla+div"], "vanilla+div: the diversity regulariser"),
    (["vanilla-continued+div"], "vanilla-continued+div: the diversity regulariser"),
    (["linear", "--gpus", "3"], "--gpus 3"),
    (["linear", "--max-update", "x"], "--max-update: invalid value 'x'"),
])
def test_recipe_refuses_bad_arguments(argv, message, tmp_path):
    result = subprocess.run(["bash", DEEPREP_TRAIN_SH, str(tmp_path), *argv, "--dry-run"], capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 2 and message in result.stderr
