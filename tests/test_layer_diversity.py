"""Layer-diversity regulariser (Dou et al. 2018, Sec. 3.2, Eqs. 9-10): the pure term on vectors
with known cosines, and the criterion ``label_smoothed_cross_entropy_with_layer_diversity`` on a
real tiny ``fusion_transformer``."""

import copy
import functools
import importlib.util
import math
import os
import subprocess
import sys

import pytest
import torch
from fairseq.criterions import CRITERION_REGISTRY
from fairseq.criterions.label_smoothed_cross_entropy import LabelSmoothedCrossEntropyCriterion
from fairseq.logging import metrics

from conftest import TINY_MLRF_FLAGS, USER_DIR
from model_building import build_model, task_of

from fusion_fairseq.criterions import label_smoothed_cross_entropy_with_layer_diversity as criterion_module
from fusion_fairseq.criterions.label_smoothed_cross_entropy_with_layer_diversity import (
    NAME,
    LabelSmoothedCrossEntropyWithLayerDiversityCriterion as DiversityCriterion,
)
from fusion_fairseq.models import layerwise_coordination
from fusion_fairseq.modules.layer_diversity import cosine_squared_distance, layer_diversity

# TINY_MLRF_FLAGS without its --fusion-* pairs: 2+2 layers at width 16
TINY_FLAGS = [
    value for flag, value in zip(TINY_MLRF_FLAGS[::2], TINY_MLRF_FLAGS[1::2]) if not flag.startswith("--fusion-")
    for value in (flag, value)
]
SRC_VOCAB, TGT_VOCAB = 40, 30


def at_angle(degrees, dim=4):
    """Two unit-scale vectors (with different norms) at ``degrees`` from each other."""
    theta = math.radians(degrees)
    a = torch.zeros(dim)
    b = torch.zeros(dim)
    a[0] = 2.0
    b[0], b[1] = 3.0 * math.cos(theta), 3.0 * math.sin(theta)
    return a, b


def stack_of(*vectors):
    """One position, one sentence per layer: each layer ``1 x 1 x C``."""
    return [v.view(1, 1, -1) for v in vectors]


# ------------------------------------------------------------------------------ the pure term
@pytest.mark.parametrize("degrees, expected", [(0, 0.0), (180, 0.0), (90, 1.0), (60, 0.75), (45, 0.5), (30, 0.25), (120, 0.75)])
def test_cosine_squared_distance_of_known_angles(degrees, expected):
    a, b = at_angle(degrees)
    assert cosine_squared_distance(a, b).item() == pytest.approx(expected, abs=1e-6)
    assert layer_diversity(stack_of(a, b)).item() == pytest.approx(expected, abs=1e-6)


def test_parallel_and_antiparallel_vectors_of_any_scale_are_not_diverse():
    v = torch.randn(8)
    assert layer_diversity(stack_of(v, 5 * v)).item() == pytest.approx(0.0, abs=1e-6)
    assert layer_diversity(stack_of(v, -0.1 * v)).item() == pytest.approx(0.0, abs=1e-6)


def test_zero_vector_counts_as_orthogonal_with_finite_gradient():
    zero = torch.zeros(4, requires_grad=True)
    other = torch.randn(4, requires_grad=True)
    value = layer_diversity(stack_of(zero, other))
    assert value.item() == pytest.approx(1.0)
    value.backward()
    assert torch.isfinite(zero.grad).all() and torch.isfinite(other.grad).all()


def test_padding_positions_are_excluded_hand_computed():
    # T=3, B=2. Distances per position (t, b): sentence 0 at t=0,1,2 -> 0, 1, 0.75;
    # sentence 1 at t=0 -> 0.5, t=1,2 padding.
    angles = {(0, 0): 0, (1, 0): 90, (2, 0): 60, (0, 1): 45, (1, 1): 90, (2, 1): 90}
    lower, upper = torch.zeros(3, 2, 4), torch.zeros(3, 2, 4)
    for (t, b), degrees in angles.items():
        lower[t, b], upper[t, b] = at_angle(degrees)
    padding_mask = torch.tensor([[False, False, False], [False, True, True]])  # batch x time
    expected = (0.0 + 1.0 + 0.75 + 0.5) / 4
    assert layer_diversity([lower, upper], padding_mask).item() == pytest.approx(expected, abs=1e-6)
    # no mask: every position counts
    assert layer_diversity([lower, upper]).item() == pytest.approx((0 + 1 + 0.75 + 0.5 + 1 + 1) / 6, abs=1e-6)
    # changing what sits at the padded positions changes nothing
    garbage_lower, garbage_upper = lower.clone(), upper.clone()
    garbage_lower[1:, 1] = torch.randn(2, 4) * 100
    garbage_upper[1:, 1] = garbage_lower[1:, 1] * -3  # would be distance 0 if counted
    assert layer_diversity([garbage_lower, garbage_upper], padding_mask).item() == pytest.approx(expected, abs=1e-6)


def test_three_layers_average_the_two_adjacent_pairs_only():
    # H1 -> H2 at 90 degrees (D = 1), H2 -> H3 at 60 degrees (D = 0.75); H1 and H3 are at
    # 150 degrees (D = 0.25), which Eq. 10 does not use.
    h1 = torch.tensor([1.0, 0.0, 0.0])
    h2 = torch.tensor([0.0, 2.0, 0.0])
    h3 = torch.tensor([-math.sin(math.radians(60)), math.cos(math.radians(60)), 0.0])
    assert layer_diversity(stack_of(h1, h2, h3)).item() == pytest.approx((1.0 + 0.75) / 2, abs=1e-6)


def test_pairs_and_positions_on_random_states_match_a_loop():
    torch.manual_seed(0)
    layers = [torch.randn(5, 3, 6) for _ in range(4)]
    mask = torch.tensor([[False] * 5, [False, False, False, True, True], [False, True, True, True, True]])
    pair_means = []
    for lower, upper in zip(layers[:-1], layers[1:]):
        values = [
            1 - torch.nn.functional.cosine_similarity(lower[t, b], upper[t, b], dim=0).item() ** 2
            for b in range(3) for t in range(5) if not mask[b, t]
        ]
        pair_means.append(sum(values) / len(values))
    assert layer_diversity(layers, mask).item() == pytest.approx(sum(pair_means) / 3, abs=1e-5)


def test_half_precision_and_autocast_compute_in_float32():
    torch.manual_seed(0)
    layers = [torch.randn(4, 2, 8) for _ in range(3)]
    reference = layer_diversity(layers)
    half = layer_diversity([layer.half() for layer in layers])
    assert half.dtype == torch.float32
    assert half.item() == pytest.approx(reference.item(), abs=1e-3)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        under_autocast = layer_diversity([layer.bfloat16() for layer in layers])
    assert under_autocast.dtype == torch.float32
    assert under_autocast.item() == pytest.approx(reference.item(), abs=2e-2)


def test_bad_inputs_of_the_pure_term():
    with pytest.raises(ValueError, match="at least 2 layers"):
        layer_diversity([torch.randn(2, 1, 4)])
    with pytest.raises(ValueError, match="padding_mask must be batch x time"):
        layer_diversity([torch.randn(2, 3, 4)] * 2, torch.zeros(2, 3, dtype=torch.bool))
    with pytest.raises(ValueError, match="shape"):
        layer_diversity([torch.randn(2, 3, 4), torch.randn(2, 3, 5)])


# --------------------------------------------------------------------------- the criterion
@functools.lru_cache(maxsize=None)
def _built_model(arch, *flags):
    torch.manual_seed(0)
    return build_model(arch, *TINY_FLAGS, "--dropout", "0", *flags, src_vocab=SRC_VOCAB, tgt_vocab=TGT_VOCAB)


def tiny_model(arch="fusion_transformer", *flags):
    """A fresh copy of a tiny model without dropout (parsing fairseq's flags is the slow part)."""
    return copy.deepcopy(_built_model(arch, *flags))


def tiny_sample():
    """Two sentences as fairseq's language-pair collater makes them: source left-padded, target
    right-padded, prev_output_tokens = eos + target[:-1]."""
    pad, eos = 1, 2
    src_tokens = torch.tensor([[10, 11, 12, 13, eos], [pad, pad, 20, 21, eos]])
    target = torch.tensor([[5, 6, 7, 8, eos], [9, 10, eos, pad, pad]])
    prev_output_tokens = torch.tensor([[eos, 5, 6, 7, 8], [eos, 9, 10, pad, pad]])
    return {
        "net_input": {"src_tokens": src_tokens, "src_lengths": torch.tensor([5, 3]), "prev_output_tokens": prev_output_tokens},
        "target": target,
        "ntokens": int(target.ne(pad).sum()),
        "nsentences": 2,
    }


def criterion(diversity_lambda=1.0, sides="both", sentence_avg=False, label_smoothing=0.1):
    return DiversityCriterion(task_of(SRC_VOCAB, TGT_VOCAB), sentence_avg, label_smoothing, diversity_lambda=diversity_lambda, diversity_sides=sides)


def expected_terms(model, sample, sentence_avg=False):
    """Each side's Eq. 10, its sentences weighted by their target tokens (1 each under --sentence-avg)."""
    _, extra = model(**sample["net_input"])
    weights = torch.ones(2) if sentence_avg else sample["target"].ne(1).sum(1)
    encoder = layer_diversity(extra["encoder_states"][1:], sample["net_input"]["src_tokens"].eq(1), weights)
    decoder = layer_diversity(extra["inner_states"][1:], sample["target"].eq(1), weights)
    return encoder, decoder


@pytest.mark.parametrize("sentence_avg", [False, True])
def test_loss_is_label_smoothed_loss_minus_lambda_term_times_sample_size(sentence_avg):
    model, sample = tiny_model(), tiny_sample()
    plain = LabelSmoothedCrossEntropyCriterion(task_of(SRC_VOCAB, TGT_VOCAB), sentence_avg, 0.1)
    ls_loss, ls_size, ls_log = plain(model, sample)
    loss, sample_size, log = criterion(2.5, sentence_avg=sentence_avg)(model, sample)
    encoder, decoder = expected_terms(model, sample, sentence_avg)
    assert sample_size == ls_size == (2 if sentence_avg else 8)
    assert 0 < encoder.item() < 1 and 0 < decoder.item() < 1
    expected = ls_loss - 2.5 * (encoder + decoder) * sample_size
    assert loss.item() == pytest.approx(expected.item(), rel=1e-5)
    assert log["nll_loss"].item() == pytest.approx(ls_log["nll_loss"].item(), rel=1e-6)


def test_a_model_without_layer_states_is_refused_naming_the_model_to_use():
    model, sample = tiny_model("transformer"), tiny_sample()
    with pytest.raises(ValueError, match=r"needs the model's layer states in its output \(extra\['encoder_states', "
                                         r"'inner_states'\]\), which this model does not return; use --arch "
                                         r"fusion_transformer or one of its presets"):
        criterion(1.0)(model, sample)


def test_sides_select_the_encoder_or_decoder_term_and_both_is_their_sum():
    model, sample = tiny_model(), tiny_sample()
    encoder, decoder = expected_terms(model, sample)
    for sides, expected in (("encoder", encoder), ("decoder", decoder), ("both", encoder + decoder)):
        div = criterion(1.0, sides).compute_diversity(model(**sample["net_input"]), sample)[0]
        assert div.item() == pytest.approx(expected.item(), rel=1e-6), sides


def test_mean_combination_averages_the_two_sides():
    model, sample = tiny_model(), tiny_sample()
    encoder, decoder = expected_terms(model, sample)
    averaged = DiversityCriterion(task_of(SRC_VOCAB, TGT_VOCAB), False, 0.1, diversity_lambda=1.0, diversity_combine="mean")
    div = averaged.compute_diversity(model(**sample["net_input"]), sample)[0]
    assert div.item() == pytest.approx(((encoder + decoder) / 2).item(), rel=1e-6)
    with pytest.raises(ValueError, match="--diversity-combine must be one of"):
        DiversityCriterion(task_of(SRC_VOCAB, TGT_VOCAB), False, 0.1, diversity_combine="max")


def test_the_embedding_output_is_not_a_layer_and_padding_is_excluded():
    model, sample = tiny_model(), tiny_sample()
    net_output = model(**sample["net_input"])
    extra = net_output[1]
    assert len(extra["encoder_states"]) == len(extra["inner_states"]) == 3  # h0, h1, h2
    term, per_side = criterion().compute_diversity(net_output, sample)
    # with 2 layers Eq. 10 is the single pair (H1, H2); h0 does not enter
    extra["encoder_states"][0] = torch.randn_like(extra["encoder_states"][0])
    extra["inner_states"][0] = torch.randn_like(extra["inner_states"][0])
    # garbage at the padded positions: source (1, 0:2) and target (1, 3:5)
    for states, (b, positions) in ((extra["encoder_states"], (1, slice(0, 2))), (extra["inner_states"], (1, slice(3, 5)))):
        for index in (1, 2):
            states[index] = states[index].clone()
            states[index][positions, b] = torch.randn_like(states[index][positions, b]) * 50
    again, _ = criterion().compute_diversity(net_output, sample)
    assert again.item() == pytest.approx(term.item(), rel=1e-6)


def grads(model):
    return {name: p.grad for name, p in model.named_parameters()}


def has_grad(grad):
    return grad is not None and grad.abs().sum().item() > 0


def test_diversity_term_alone_sends_gradients_into_lower_layers():
    model, sample = tiny_model(), tiny_sample()
    # the difference of the two losses is exactly -lambda * term * sample_size: no NLL in it
    with_div, _, _ = criterion(100.0)(model, sample)
    without, _, _ = criterion(0.0)(model, sample)
    model.zero_grad()
    (with_div - without).backward()
    gradients = grads(model)
    for name in ("encoder.layers.0.fc1.weight", "encoder.layers.0.self_attn.q_proj.weight",
                 "decoder.layers.0.fc1.weight", "decoder.layers.0.self_attn.q_proj.weight",
                 "encoder.embed_tokens.weight", "decoder.embed_tokens.weight"):
        assert has_grad(gradients[name]), name
    # the top decoder layer's output feeds the output projection, which H^1..H^L never see
    assert not has_grad(gradients["decoder.output_projection.weight"])


def test_each_side_sends_gradients_only_where_its_states_come_from():
    model, sample = tiny_model(), tiny_sample()
    model.zero_grad()
    encoder_term, _ = criterion(1.0, "encoder").compute_diversity(model(**sample["net_input"]), sample)
    encoder_term.backward()
    gradients = grads(model)
    assert has_grad(gradients["encoder.layers.0.fc1.weight"])
    assert not any(has_grad(g) for name, g in gradients.items() if name.startswith("decoder."))

    model.zero_grad()
    decoder_term, _ = criterion(1.0, "decoder").compute_diversity(model(**sample["net_input"]), sample)
    decoder_term.backward()
    gradients = grads(model)
    assert has_grad(gradients["decoder.layers.0.fc1.weight"])
    assert has_grad(gradients["encoder.layers.0.fc1.weight"])  # through the cross-attention


def test_lambda_zero_logs_the_term_without_a_graph():
    model, sample = tiny_model(), tiny_sample()
    plain_loss, _, _ = LabelSmoothedCrossEntropyCriterion(task_of(SRC_VOCAB, TGT_VOCAB), False, 0.1)(model, sample)
    loss, sample_size, log = criterion(0.0)(model, sample)
    assert loss.item() == pytest.approx(plain_loss.item(), rel=1e-6)
    assert 0 < log["layer_diversity"].item() / sample_size < 2
    assert not log["layer_diversity"].requires_grad


def test_logged_diversity_equals_the_computed_term():
    model, sample = tiny_model(), tiny_sample()
    loss, sample_size, log = criterion(1.0)(model, sample)
    encoder, decoder = expected_terms(model, sample)
    assert (log["layer_diversity"] / sample_size).item() == pytest.approx((encoder + decoder).item(), rel=1e-6)
    assert (log["layer_diversity_encoder"] / sample_size).item() == pytest.approx(encoder.item(), rel=1e-6)
    assert (log["layer_diversity_decoder"] / sample_size).item() == pytest.approx(decoder.item(), rel=1e-6)

    # reduce_metrics: weighted by sample_size over logging outputs (workers / accumulated batches)
    other = {**log, "layer_diversity": torch.tensor(0.5 * 2), "sample_size": 2, "ntokens": 2}
    with metrics.aggregate() as aggregator:
        DiversityCriterion.reduce_metrics([log, other])
    values = aggregator.get_smoothed_values()
    expected = ((encoder + decoder).item() * sample_size + 0.5 * 2) / (sample_size + 2)
    assert values["layer_diversity"] == pytest.approx(expected, abs=1e-4)
    assert "layer_diversity_encoder" in values and "layer_diversity_decoder" in values and "nll_loss" in values


def test_unreduced_losses_are_the_label_smoothed_ones():
    model, sample = tiny_model(), tiny_sample()
    plain_loss, _, _ = LabelSmoothedCrossEntropyCriterion(task_of(SRC_VOCAB, TGT_VOCAB), False, 0.1)(model, sample, reduce=False)
    loss, sample_size, log = criterion(1.0)(model, sample, reduce=False)
    assert torch.allclose(loss, plain_loss)
    assert log["layer_diversity"].item() > 0


@pytest.mark.parametrize("bad", [-0.1, float("nan"), float("inf")])
def test_bad_lambda_is_refused(bad):
    with pytest.raises(ValueError, match="--diversity-lambda must be a finite number >= 0"):
        criterion(bad)


def test_vanilla_transformer_is_refused_with_a_pointer_to_the_plugin_models():
    model, sample = tiny_model("transformer"), tiny_sample()
    with pytest.raises(ValueError, match="--arch fusion_transformer"):
        criterion(1.0)(model, sample)


def test_a_side_with_one_layer_is_skipped_and_no_stack_to_regularise_is_an_error():
    sample = tiny_sample()
    model = tiny_model("fusion_transformer", "--encoder-layers", "1")
    plain_loss, _, _ = LabelSmoothedCrossEntropyCriterion(task_of(SRC_VOCAB, TGT_VOCAB), False, 0.1)(model, sample)
    loss, sample_size, log = criterion(1.0)(model, sample)
    _, extra = model(**sample["net_input"])
    decoder = layer_diversity(extra["inner_states"][1:], sample["target"].eq(1))
    assert "layer_diversity_encoder" not in log
    assert loss.item() == pytest.approx((plain_loss - decoder * sample_size).item(), rel=1e-5)
    with pytest.raises(ValueError, match="no selected layer stack"):
        criterion(1.0, "encoder")(model, sample)


# ------------------------------------------------------------------------------ registration
def test_registered_under_its_name_with_its_flags():
    assert CRITERION_REGISTRY[NAME] is DiversityCriterion
    config = criterion_module.LabelSmoothedCrossEntropyWithLayerDiversityConfig()
    assert config.diversity_lambda == 1.0 and config.diversity_sides == "both"


def test_the_same_file_under_a_second_module_name_is_refused_naming_both():
    """The plugin registers once, as fusion_fairseq: a second copy of the criterion (the same file under
    another module name) is a clash naming both definitions, and the registered one stays."""
    name = "fusion_fairseq_second_copy.criterions.label_smoothed_cross_entropy_with_layer_diversity"
    spec = importlib.util.spec_from_file_location(name, criterion_module.__file__)
    module = importlib.util.module_from_spec(spec)
    with pytest.raises(ValueError, match=f"Cannot register duplicate criterion .{NAME}.: fusion_fairseq_second_copy"
                                         f".* would replace fusion_fairseq.criterions"):
        spec.loader.exec_module(module)
    assert CRITERION_REGISTRY[NAME] is DiversityCriterion


def test_a_genuine_criterion_name_clash_still_raises():
    class SomebodyElsesCriterion(LabelSmoothedCrossEntropyCriterion):
        pass

    with pytest.raises(ValueError, match="Cannot register duplicate criterion"):
        criterion_module.register_criterion(NAME)(SomebodyElsesCriterion)
    assert CRITERION_REGISTRY[NAME] is DiversityCriterion


# -------------------------------------------------------------------------------------- CLI
@pytest.mark.slow
def test_fairseq_train_logs_the_layer_diversity(tiny_data_bin, tmp_path):
    args = [
        sys.executable, "-m", "fairseq_cli.train", tiny_data_bin, "--user-dir", USER_DIR,
        "--arch", "fusion_transformer", *TINY_FLAGS,
        "--criterion", NAME, "--diversity-lambda", "1.0", "--label-smoothing", "0.1",
        "--optimizer", "adam", "--lr", "0.001", "--max-tokens", "500", "--max-update", "3",
        "--log-format", "simple", "--log-interval", "1", "--no-progress-bar", "--seed", "1",
        "--save-dir", str(tmp_path / "ckpt"), "--no-save", "--num-workers", "0",
    ]
    result = subprocess.run(args, capture_output=True, text=True, timeout=300,
                            env={**os.environ, "PYTHONWARNINGS": "ignore"})
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-5000:]  # "invalid choice": --user-dir did not register the criterion
    train_lines = [line for line in output.splitlines() if "train_inner" in line or "| train |" in line]
    assert train_lines and all("layer_diversity" in line for line in train_lines), output[-3000:]
    assert "layer_diversity_encoder" in output and "layer_diversity_decoder" in output
    valid_lines = [line for line in output.splitlines() if "| valid |" in line]
    assert valid_lines and "layer_diversity" in valid_lines[-1]


def test_layerwise_coordinations_decoder_side_reads_its_states_time_major():
    """Its decoder returned batch-major states: a traceback at the first batch, or, with as many sentences
    as target positions, the padding mask read across (a wrong value in silence). Here 5 sentences of 5."""
    torch.manual_seed(0)
    model = build_model("layerwise_coordination", "--layers", "3", "--embed-dim", "16", "--ffn-embed-dim", "32",
                        "--attention-heads", "2", "--dropout", "0", src_vocab=SRC_VOCAB, tgt_vocab=SRC_VOCAB,
                        joined=True)
    pad, eos = 1, 2
    target = torch.randint(4, SRC_VOCAB, (5, 5))
    for sentence, length in enumerate((5, 4, 3, 2, 1)):
        target[sentence, length - 1], target[sentence, length:] = eos, pad
    prev = torch.cat([torch.full((5, 1), eos), target[:, :-1]], dim=1).masked_fill(target.eq(pad), pad)
    sample = {"net_input": {"src_tokens": torch.randint(4, SRC_VOCAB, (5, 4)), "src_lengths": torch.full((5,), 4),
                            "prev_output_tokens": prev}, "target": target, "ntokens": int(target.ne(pad).sum())}
    net_output = model(**sample["net_input"])
    states = net_output[1]["inner_states"]
    with torch.no_grad():  # h0, the target embedding, is batch-major where the model computes it
        embedded = model.decoder.embedding(prev, layerwise_coordination.TARGET)
    assert torch.equal(states[0], embedded.transpose(0, 1))
    div = DiversityCriterion(task_of(SRC_VOCAB, SRC_VOCAB), False, 0.1, diversity_sides="decoder")
    value = div.compute_diversity(net_output, sample)[0]
    # the same Eq. 10 from the batch-major states the layers compute, each sentence's own positions only
    batch_major = [state.transpose(0, 1) for state in states[1:]]
    distances = [sum(cosine_squared_distance(lower[b, :n], upper[b, :n]).sum() for b, n in enumerate((5, 4, 3, 2, 1)))
                 for lower, upper in zip(batch_major[:-1], batch_major[1:])]
    assert value.item() == pytest.approx((sum(distances) / 15 / 2).item(), rel=1e-5)


def sentences_of(sample, rows):
    """The sub-batch of ``rows``, its padding columns kept (the models' outputs do not depend on them)."""
    net_input = {key: value[rows] for key, value in sample["net_input"].items()}
    target = sample["target"][rows]
    return {"net_input": net_input, "target": target, "ntokens": int(target.ne(1).sum()), "nsentences": len(rows)}


@pytest.mark.parametrize("sentence_avg", [False, True])
@pytest.mark.parametrize("sides", ["encoder", "decoder", "both"])
def test_the_loss_of_a_batch_is_the_sum_of_its_sentences_losses(sides, sentence_avg):
    """As fairseq's own losses: --update-freq 2 and two processes sum the halves' losses and sample sizes. The
    encoder's positions were pooled over the batch, and with source and target lengths in other ratios
    (here 5/5 and 3/2) the halves did not add up to the whole."""
    model, sample = tiny_model(), tiny_sample()
    sample["target"][1, 1], sample["target"][1, 2] = 2, 1  # the second target: 9 EOS, one token shorter
    sample["net_input"]["prev_output_tokens"][1, 2] = 1
    sample["ntokens"] = int(sample["target"].ne(1).sum())
    div = criterion(3.0, sides, sentence_avg=sentence_avg)
    whole, whole_size, _ = div(model, sample)
    halves = [div(model, sentences_of(sample, [row])) for row in (0, 1)]
    assert sum(size for _, size, _ in halves) == whole_size
    assert sum(loss for loss, _, _ in halves).item() == pytest.approx(whole.item(), rel=1e-5)
