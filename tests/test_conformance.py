"""Conformance suite: every architecture this plugin registers, and every MLRF fusion variant of
``fusion_transformer``, must behave as a well-formed fairseq encoder-decoder:

1. every parameter receives a finite, non-zero gradient (DDP without --find-unused-parameters);
2. incremental (cached) decoding equals the teacher-forced forward;
3. ... also after the cache is reordered as beam search does;
4. a sentence's outputs do not depend on the padding added by batching;
5. a checkpoint file reloads through fairseq into an identical model;
6. beam search really decodes from the cache, with exact scores; and fairseq's real train /
   generate / interactive entry points work end to end for every architecture;
7. --checkpoint-activations / --offload-activations keep loss and gradients and lower the memory
   kept for backward, or are refused on the command line;
8. --print-alignment gets source attention without naming a layer, as fairseq asks for it.

fairseq's generation and training features per model family: ``test_conformance_features.py``;
data-parallel training: ``test_distributed.py``.

Architectures are discovered from fairseq's registries, so a model family added later is covered
automatically; it only needs an entry in ``conformance_utils.TINY_OVERRIDES`` (a test fails until it has one).
Run without the command-line tests: ``pytest tests/test_conformance.py -k "not cli"``.
"""

import concurrent.futures
import copy
import math
import os
import re

import pytest
import torch
from fairseq import checkpoint_utils
from fairseq.sequence_generator import SequenceGeneratorWithAlignment
from torch.nn.utils.weight_norm import WeightNorm

from conformance_utils import (
    ARCHITECTURES,
    TINY_OVERRIDES,
    Corpus,
    LinearWorkRecorder,
    Variant,
    assert_close,
    beam_search,
    build_like_fairseq_train,
    cli_pipeline,
    data_bin_fixture,
    decode_incrementally,
    distinct_length_indices,
    flags_of,
    full_forward,
    hypothesis_ids,
    plugin_architectures,
    run_each_in_fresh_interpreter,
    run_in_one_interpreter,
    teacher_forced_token_scores,
    tiny_config,
    training_step,
)
from fusion_fairseq.modules.hyper_connection import HyperConnection, ManifoldHyperConnection
from fusion_fairseq.modules.multiway_dense_connection import DynamicDenseWeights
from fusion_fairseq.modules import FUSION_FUNCTIONS, MultiHopAttentionFusion


def fuse(encoder, decoder):
    return ("--fuse-encoder", encoder, "--fuse-decoder", decoder)


PRE_NORM = ("--encoder-normalize-before", "--decoder-normalize-before")
ALL_ABLATIONS = ("--fusion-independent-w1", "--fusion-no-embedding-layer", "--fusion-no-layer-embedding",
                 "--fusion-no-layernorm")

# Every (encoder, decoder) fusion pair (Both-FNN-SA is enc=fnn,dec=sa; Both-SA is enc=sa,dec=sa),
# then each MLRF flag, pre-norm with fusion on both sides, and shapes that stress the shared layer
# embedding (unequal depths, one hop).
MLRF_VARIANTS = [
    Variant(f"enc={enc},dec={dec}", "fusion_transformer", fuse(enc, dec))
    for enc in FUSION_FUNCTIONS for dec in FUSION_FUNCTIONS
] + [
    Variant("Both-SA+independent-w1", "fusion_transformer", (*fuse("sa", "sa"), "--fusion-independent-w1")),
    Variant("Both-SA+no-layer-embedding", "fusion_transformer", (*fuse("sa", "sa"), "--fusion-no-layer-embedding")),
    Variant("Both-SA+no-embedding-layer", "fusion_transformer", (*fuse("sa", "sa"), "--fusion-no-embedding-layer")),
    Variant("enc=fnn,dec=avg+no-embedding-layer", "fusion_transformer", (*fuse("fnn", "avg"), "--fusion-no-embedding-layer")),
    Variant("Both-FNN-SA+no-layernorm", "fusion_transformer", (*fuse("fnn", "sa"), "--fusion-no-layernorm")),
    Variant("Both-AVG+no-layernorm", "fusion_transformer", (*fuse("avg", "avg"), "--fusion-no-layernorm")),
    Variant("pre-norm+Both-FNN-SA", "fusion_transformer", (*fuse("fnn", "sa"), *PRE_NORM)),
    Variant("pre-norm+Both-SA", "fusion_transformer", (*fuse("sa", "sa"), *PRE_NORM)),
    Variant("pre-norm+Both-AVG", "fusion_transformer", (*fuse("avg", "avg"), *PRE_NORM)),
    Variant("pre-norm+Both-SA+all-ablations", "fusion_transformer", (*fuse("sa", "sa"), *PRE_NORM, *ALL_ABLATIONS)),
    Variant("Both-SA+3-enc-1-dec-layers+1-hop", "fusion_transformer",
            (*fuse("sa", "sa"), "--encoder-layers", "3", "--decoder-layers", "1", "--fusion-hops", "1")),
]


def aggregate(strategy, *more):
    return ("--aggregate-encoder", strategy, "--aggregate-decoder", strategy, *more)


# Deep representations (Dou et al.) and encoder layer fusion (Liu et al.): every aggregation,
# the AGG choices of Table 4, multi-layer attention, both layer-attention kinds, both
# SurfaceFusion kinds, and compositions across families.
OTHER_FUSION_VARIANTS = [
    Variant(f"aggregate={strategy}", "fusion_transformer", aggregate(strategy))
    for strategy in ("dense", "linear", "linear-output", "iterative", "hierarchical")
] + [
    Variant("hierarchical+relu+residual-top", "fusion_transformer",
            aggregate("hierarchical", "--aggregation-fn", "relu", "--aggregation-residual", "top")),
    Variant("hierarchical+attention+residual-none", "fusion_transformer",
            aggregate("hierarchical", "--aggregation-fn", "attention", "--aggregation-residual", "none")),
    Variant("multi-layer-attention=2", "fusion_transformer",
            ("--multi-layer-attention", "2", "--encoder-layers", "3", "--decoder-layers", "3")),
    Variant("multi-layer-attention=3+pre-norm", "fusion_transformer",
            ("--multi-layer-attention", "3", "--encoder-layers", "4", "--decoder-layers", "4", *PRE_NORM)),
    Variant("layer-attention=coarse", "fusion_transformer", ("--layer-attention", "coarse")),
    Variant("layer-attention=fine+mask-1", "fusion_transformer",
            ("--layer-attention", "fine", "--mask-encoder-layer", "1")),
    Variant("surface-fusion=soft", "fusion_transformer", ("--surface-fusion", "soft")),
    Variant("fine+soft+dec=sa", "fusion_transformer",
            ("--layer-attention", "fine", "--surface-fusion", "soft", "--fuse-decoder", "sa")),
    Variant("enc=hierarchical+dec=sa+hard", "fusion_transformer",
            ("--aggregate-encoder", "hierarchical", "--fuse-decoder", "sa", "--surface-fusion", "hard",
             "--multi-layer-attention", "2", "--encoder-layers", "3", "--decoder-layers", "3")),
    Variant("surface-fusion=hard+released", "fusion_transformer",
            ("--surface-fusion", "hard", "--surface-fusion-variant", "released")),
]


def hyper_connections(kind, *more):
    return ("--hyper-connections-encoder", kind, "--hyper-connections-decoder", kind, *more)


DENSEFORMER = ("--denseformer-encoder", "--denseformer-decoder", "--encoder-layers", "3", "--decoder-layers", "3")
MUDD = ("--mudd-encoder", "--mudd-decoder", "--encoder-layers", "3", "--decoder-layers", "3")
# Today's layer fusion: DenseFormer with its dilation and period, every kind of hyper-connection,
# MUDDFormer in both sizings, in post-norm (fairseq's default) and pre-norm (the papers' setting),
# and compositions with the fusions that read the layer stack.
TODAYS_FUSION_VARIANTS = [
    Variant("denseformer", "fusion_transformer", DENSEFORMER),
    Variant("denseformer-2x2+pre-norm", "fusion_transformer",
            (*DENSEFORMER, "--denseformer-dilation", "2", "--denseformer-period", "2", *PRE_NORM)),
    Variant("denseformer-enc+fine+dec=sa", "fusion_transformer",
            ("--denseformer-encoder", "--layer-attention", "fine", "--fuse-decoder", "sa")),
] + [
    Variant(f"hyper-connections={kind}{suffix}", "fusion_transformer", hyper_connections(kind, *flags))
    for kind in ("static", "dynamic", "manifold") for suffix, flags in (("", ()), ("+pre-norm", PRE_NORM))
] + [
    Variant("hyper-connections=dynamic+rate-2+fine+hard", "fusion_transformer",
            hyper_connections("dynamic", "--hyper-connections-rate", "2", "--layer-attention", "fine",
                              "--surface-fusion", "hard")),
    Variant("hc-enc=manifold+denseformer-dec+enc=sa", "fusion_transformer",
            ("--hyper-connections-encoder", "manifold", "--denseformer-decoder", "--fuse-encoder", "sa")),
    Variant("mudd", "fusion_transformer", MUDD),
    Variant("mudd+released+pre-norm", "fusion_transformer", (*MUDD, "--mudd-variant", "released", *PRE_NORM)),
    Variant("mudd-enc+fine+dec=sa", "fusion_transformer",
            ("--mudd-encoder", "--layer-attention", "fine", "--fuse-decoder", "sa")),
    Variant("mudd-dec+denseformer-enc+hard", "fusion_transformer",
            ("--mudd-decoder", "--denseformer-encoder", "--surface-fusion", "hard", *PRE_NORM)),
]
ARCH_VARIANTS = [Variant(arch, arch) for arch in ARCHITECTURES]
# fairseq-train / -generate / -interactive: every architecture, and the options of today's layer fusion
CLI_VARIANTS = ARCH_VARIANTS + [v for v in TODAYS_FUSION_VARIANTS if v.id in ("denseformer", "hyper-connections=dynamic")]
VARIANTS = ARCH_VARIANTS + (MLRF_VARIANTS + OTHER_FUSION_VARIANTS + TODAYS_FUSION_VARIANTS if "fusion_transformer" in ARCHITECTURES else [])
BOTH_FNN_SA = Variant("fusion_transformer+Both-FNN-SA", "fusion_transformer", fuse("fnn", "sa"))

# A gradient counts as "all zeros" when its largest entry is below this fraction of the model's
# largest one (observed: live parameters >= 1e-3, shift-invariant biases <= 1e-7 relative).
ZERO_GRADIENT_FRACTION = 1e-5


def shift_invariant_biases(model):
    """Biases whose gradient is zero analytically, because the softmax right after them ignores a
    constant shift: every attention's key-projection bias (``q . b_k`` is the same for all keys;
    fairseq's MultiheadAttention and the plugin's attention modules name it ``k_proj.bias``) and
    W2's bias in MLRF self-attention fusion (added equally to every layer's energy before the
    softmax over layers, Eqs. 5-6), and the bias of MUDD's key LayerNorm (it reaches the energies
    only as W_k b, such a shift). They still get a (rounding-noise) gradient, so DDP is fine;
    they are excused only from the "not all zeros" part of the gradient check."""
    names = {name for name, _ in model.named_parameters()
             if name.endswith((".k_proj.bias", ".self_attn_key_layer_norm.bias"))}
    names |= {f"{name}.w2.bias" for name, module in model.named_modules() if isinstance(module, MultiHopAttentionFusion)}
    return names | gated_by_zero_weights(model)


def gated_by_zero_weights(model):
    """The parameters of hyper-connections that only act through weights the papers start at zero
    (Zhu et al.: W_m, W_r, W_beta = 0; mHC: phi = 0, our reading): the dynamic scales
    and the norm of DHC, mHC's scales. Their first gradient is zero analytically; the zero
    weights themselves get one, and after the first update so do these
    (``test_hyper_connections_dynamic_parts_learn`` in tests/test_todays_layer_fusion.py).
    Likewise MUDD's W_1, behind W_2 = 0 (``test_mudd_generators_learn`` in tests/test_muddformer.py)."""
    names = set()
    for name, module in model.named_modules():
        if isinstance(module, HyperConnection) and module.dynamic:
            names |= {f"{name}.dynamic_alpha_scale", f"{name}.dynamic_beta_scale",
                      f"{name}.norm.weight", f"{name}.norm.bias"}
        if isinstance(module, ManifoldHyperConnection):
            names.add(f"{name}.scales")
        if isinstance(module, DynamicDenseWeights):
            names.add(f"{name}.w1.weight")
    return names




# --------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread():
    """The models are tiny: one intra-op thread is several times faster than two on a 2-core
    machine (no spin-waiting against the CLI subprocesses running beside)."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


def moved_from_its_start(built, scale: float = 0.05):
    """``built`` with seeded noise added to every parameter: several methods start as the plain Transformer
    (DenseFormer's averages, MUDDFormer's static weights, hyper-connections' streams), where a wrong mix of
    layers or positions computes the same as the right one. Padding rows stay zero, as fairseq keeps them."""
    generator = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for parameter in built.model.parameters():
            parameter.add_(scale * torch.randn(parameter.shape, generator=generator))
        for module in built.model.modules():
            if isinstance(module, torch.nn.Embedding) and module.padding_idx is not None:
                module.weight[module.padding_idx].zero_()
    return built


@pytest.fixture(scope="module")
def built_cache():
    """Models built once per module (``{variant id: Built}``) and corpora (``{data_bin: Corpus}``);
    tests that mutate a model work on a copy or restore it."""
    return {"models": {}, "corpora": {}}


@pytest.fixture
def subject(variant, request, built_cache):
    """``(Built, Corpus)`` of ``variant``: its model, and the corpus (train split, padded batch,
    checkpoint writer) of the data it is built for."""
    data_bin = request.getfixturevalue(data_bin_fixture(variant))
    models, corpora = built_cache["models"], built_cache["corpora"]
    if variant.id not in models:
        models[variant.id] = moved_from_its_start(build_like_fairseq_train(data_bin, variant.arch, flags_of(variant)))
    built = models[variant.id]
    if data_bin not in corpora:
        corpora[data_bin] = Corpus.load(data_bin, built)
    return built, corpora[data_bin]


# --------------------------------------------------------------------------- discovery


def test_discovery_finds_the_plugin_architectures():
    """Guards the discovery itself: an empty or wrong registry scan would silently test nothing."""
    assert {"fusion_transformer", "mlrf_iwslt_de_en", "mlrf_nist_zh_en"} <= set(ARCHITECTURES), ARCHITECTURES
    assert "transformer" not in ARCHITECTURES, "fairseq's own architectures must not be picked up"


def test_every_registered_model_has_tiny_overrides():
    missing = sorted({model for model in ARCHITECTURES.values() if model not in TINY_OVERRIDES})
    assert not missing, (
        f"registered plugin model(s) {missing} have no tiny CLI overrides; add them to TINY_OVERRIDES "
        "in tests/conformance_utils.py so the conformance suite covers them"
    )


def test_mlrf_variants_cover_every_fusion_function_on_each_side():
    for side in ("--fuse-encoder", "--fuse-decoder"):
        used = {v.flags[v.flags.index(side) + 1] for v in MLRF_VARIANTS}
        assert used == set(FUSION_FUNCTIONS), (side, used)


# --------------------------------------------------------------------------- in-process checks


@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: v.id)
def test_every_parameter_gets_a_finite_nonzero_gradient(variant, subject):
    """One forward/backward of the training criterion reaches every parameter, so fairseq's DDP
    runs without --find-unused-parameters."""
    built, corpus = subject
    model = built.model
    criterion = built.task.build_criterion(built.args)
    model.zero_grad(set_to_none=True)
    try:
        loss, _, _ = criterion(model, corpus.batch)
        assert torch.isfinite(loss), f"loss is {loss.item()}"
        loss.backward()
        grads = {name: parameter.grad for name, parameter in model.named_parameters()}
    finally:
        model.zero_grad(set_to_none=True)

    no_grad = [name for name, grad in grads.items() if grad is None]
    assert not no_grad, f"parameters without gradient (DDP would need --find-unused-parameters): {no_grad}"
    non_finite = [name for name, grad in grads.items() if not torch.isfinite(grad).all()]
    assert not non_finite, f"parameters with non-finite gradient: {non_finite}"
    largest = max(grad.abs().max().item() for grad in grads.values())
    excused = shift_invariant_biases(model)
    zero = [
        name for name, grad in grads.items()
        if grad.abs().max().item() <= ZERO_GRADIENT_FRACTION * largest and name not in excused
    ]
    assert not zero, f"parameters whose gradient is all zeros (largest gradient {largest:.3g}): {zero}"


@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: v.id)
@torch.no_grad()
def test_incremental_decoding_equals_full_forward(variant, subject):
    built, corpus = subject
    model, net_input = built.model, corpus.batch["net_input"]
    encoder_out, logits, lprobs = full_forward(model, net_input)
    (step_logits, step_lprobs), _ = decode_incrementally(model, encoder_out, net_input["prev_output_tokens"])
    real_positions = corpus.batch["target"].ne(model.decoder.dictionary.pad())  # what beam search ever decodes
    assert_close(step_logits, logits, "incremental vs full logits", real_positions)
    assert_close(step_lprobs, lprobs, "incremental vs full log-probs", real_positions)


BEAM = 3
# Reorders as SequenceGenerator makes them, in its layout of BEAM consecutive rows per sentence:
# (sentence, [beam rows it continues from]). fairseq's own encoder-decoder attention relies on
# this layout (it skips reordering its cached source keys when the batch size is unchanged,
# since the beams of a sentence share them), so orders that mix sentences are not tested.
REORDERS = {
    "random-permutation-of-beams": None,  # seeded, drawn per sentence
    "repeated-beams": [(0, [0, 0, 1]), (1, [2, 2, 2]), (2, [1, 0, 0]), (3, [0, 1, 2])],
    "finished-sentence-dropped": [(0, [1, 0, 2]), (2, [2, 2, 0]), (3, [1, 1, 1])],
}


def beam_rows(choices):
    return torch.tensor([sentence * BEAM + beam for sentence, beams in choices for beam in beams])


@pytest.mark.parametrize("reorder", list(REORDERS))
@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: v.id)
@torch.no_grad()
def test_incremental_decoding_after_cache_reorder(variant, reorder, subject):
    """Like beam search: expand the encoder output to BEAM rows per sentence, decode 3 steps of
    distinct random hypotheses, reorder encoder output and cache, keep decoding the reordered
    prefixes. The result equals the full forward on the reordered rows."""
    built, corpus = subject
    model, net_input = built.model, corpus.batch["net_input"]
    sentences = net_input["src_tokens"].size(0)
    generator = torch.Generator().manual_seed(0)
    choices = REORDERS[reorder] or [(s, torch.randperm(BEAM, generator=generator).tolist()) for s in range(sentences)]
    order = beam_rows(choices)
    expand = torch.arange(sentences).repeat_interleave(BEAM)
    dictionary = model.decoder.dictionary
    hypotheses = torch.randint(dictionary.nspecial, len(dictionary), (sentences * BEAM, 6), generator=generator)
    prev = torch.cat([hypotheses.new_full((sentences * BEAM, 1), dictionary.eos()), hypotheses], dim=1)
    after = 3

    expected_input = {"src_tokens": net_input["src_tokens"][expand][order],
                      "src_lengths": net_input["src_lengths"][expand][order], "prev_output_tokens": prev[order]}
    _, logits, lprobs = full_forward(model, expected_input)
    encoder_out = model.encoder(net_input["src_tokens"], src_lengths=net_input["src_lengths"])
    encoder_out = model.encoder.reorder_encoder_out(encoder_out, expand)  # SequenceGenerator, before step 0
    _, (step_logits, step_lprobs) = decode_incrementally(model, encoder_out, prev, reorder_after=after, new_order=order)
    assert_close(step_logits, logits[:, after:], f"logits after {reorder} reorder")
    assert_close(step_lprobs, lprobs[:, after:], f"log-probs after {reorder} reorder")


@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: v.id)
@torch.no_grad()
def test_outputs_do_not_depend_on_batch_padding(variant, subject):
    """A short sentence alone vs batched with the longest one (source LEFT-padded, target
    right-padded by fairseq's collater): its predictions are the same. (Compared at the output:
    encoder outputs have model-specific layouts, e.g. fconv's (x, y) batch-first pair.)"""
    built, corpus = subject
    model, train_set = built.model, corpus.train_set
    short, long = distinct_length_indices(train_set, 2)[::-1]
    alone = train_set.collater([train_set[short]])
    padded = train_set.collater([train_set[short], train_set[long]])
    row = int((padded["id"] == short).nonzero())
    src_len, tgt_len = alone["net_input"]["src_tokens"].size(1), alone["target"].size(1)
    pad = train_set.src_dict.pad()
    assert padded["net_input"]["src_tokens"].size(1) > src_len and padded["target"].size(1) > tgt_len
    assert padded["net_input"]["src_tokens"][row, :-src_len].eq(pad).all(), "source must be left-padded"
    assert padded["net_input"]["prev_output_tokens"][row, tgt_len:].eq(pad).all(), "target must be right-padded"

    _, logits_alone, lprobs_alone = full_forward(model, alone["net_input"])
    _, logits_padded, lprobs_padded = full_forward(model, padded["net_input"])
    assert_close(logits_padded[row, :tgt_len], logits_alone[0], "logits of the padded sentence")
    assert_close(lprobs_padded[row, :tgt_len], lprobs_alone[0], "log-probs of the padded sentence")


def copy_of(model):
    """``copy.deepcopy(model)``. A weight-normalised layer (dense_fconv) holds its weight as computed
    by the last forward, a graph node that deepcopy refuses after a forward with gradients (which
    test ran before decides that): recompute it without gradients first."""
    with torch.no_grad():
        for module in model.modules():
            for hook in module._forward_pre_hooks.values():
                if isinstance(hook, WeightNorm):
                    hook(module, None)
    return copy.deepcopy(model)


@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: v.id)
@torch.no_grad()
def test_checkpoint_round_trip_is_exact(variant, subject, tmp_path):
    """Save as fairseq-train does, reload with ``load_model_ensemble_and_task`` (torch's default
    weights_only loading): same class, same configuration, bit-identical outputs. The weights are
    perturbed first, so a reload that re-initialised instead of loading could not pass."""
    built, corpus = subject
    model = copy_of(built.model)
    generator = torch.Generator().manual_seed(3)
    for parameter in model.parameters():
        parameter.add_(0.05 * torch.randn(parameter.shape, generator=generator))
    path = str(tmp_path / "checkpoint.pt")
    corpus.checkpoint_writer.save(model, built.args, path)

    (reloaded,), cfg, _ = checkpoint_utils.load_model_ensemble_and_task([path], arg_overrides={"data": corpus.data_bin})
    reloaded.eval()
    assert type(reloaded) is type(model)
    assert cfg.model._name == variant.arch
    for flag in variant.flags:
        if flag.startswith("--"):
            key = flag[2:].replace("-", "_")
            assert getattr(cfg.model, key) == getattr(built.args, key), key
    expected_state, actual_state = model.state_dict(), reloaded.state_dict()
    assert expected_state.keys() == actual_state.keys()
    assert all(torch.equal(expected_state[k], actual_state[k]) for k in expected_state)

    _, logits, lprobs = full_forward(model, corpus.batch["net_input"])
    _, logits2, lprobs2 = full_forward(reloaded, corpus.batch["net_input"])
    assert torch.equal(logits, logits2)
    assert torch.equal(lprobs, lprobs2)


@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: v.id)
def test_beam_search_decodes_from_the_cache(variant, subject):
    """SequenceGenerator (beam 3) hands the decoder the whole prefix at every step. A decoder that
    uses its incremental state does the same projection work at each step after the first; one
    that recomputes the prefix does growing work. The scores of the returned hypotheses equal a
    teacher-forced rescoring, so the cached path is also exact."""
    built, corpus = subject
    model = built.model
    length = 6
    sample = {"id": corpus.batch["id"][:1], "net_input": {k: v[:1] for k, v in corpus.batch["net_input"].items()}}
    with LinearWorkRecorder(model) as recorder:
        hypotheses = beam_search(model, built.task, sample, beam=BEAM, length=length)
    calls = recorder.calls

    assert [call["prefix_len"] for call in calls] == list(range(1, length + 2)), "one decoder call per step"
    assert calls[0]["state_entries_before"] == 0
    empty = [step for step, call in enumerate(calls[1:], 1) if not call["state_entries_before"]]
    assert not empty, f"incremental state empty at steps {empty}: nothing was cached"
    work = [call["linear_rows"] for call in calls]
    assert work[1] > 0 and work[1:] == [work[1]] * length, (
        f"rows through the decoder's Linear layers per step {work}: after step 1 they must stay constant; "
        "growth with the prefix means the prefix is recomputed")

    eos = built.task.target_dictionary.eos()
    src, lengths = sample["net_input"]["src_tokens"], sample["net_input"]["src_lengths"]
    (nbest,) = hypotheses
    assert len(nbest) == BEAM
    with torch.no_grad():
        for hypothesis in nbest:
            assert len(hypothesis["tokens"]) == length + 1 and hypothesis["tokens"][-1] == eos
            rescored = teacher_forced_token_scores(model, src, lengths, hypothesis["tokens"], eos)
            assert_close(hypothesis["positional_scores"][None, :, None], rescored[None, :, None],
                         "beam-search token scores vs teacher-forced rescoring")


# --------------------------------------------------------------------------- command line


def selected_cli_variants(request, test_name):
    return [
        item.callspec.params["variant"] for item in request.session.items
        if getattr(item, "originalname", None) == test_name and item.module is request.module
    ]


@pytest.fixture(scope="module", autouse=True)
def cli_runs(request, tmp_path_factory):
    """Starts, when the module starts, the command-line pipelines of the *selected* CLI tests in
    background threads, so that their subprocesses overlap with the in-process checks; each CLI
    test then waits for its own result.

    * every registered arch and today's layer fusion: train -> generate -> interactive, all runs of a worker in ONE
      subprocess interpreter (``CLI_DRIVER``: each run exactly as ``python -m``), two workers;
    * Both-FNN-SA: the same pipeline with a fresh ``python -m`` interpreter per run.
    """
    def runnable(variant):  # a model without tiny overrides fails in its own test, not here
        return ARCHITECTURES.get(variant.arch) in TINY_OVERRIDES

    per_arch = [v for v in selected_cli_variants(request, "test_cli_end_to_end") if runnable(v)]
    fresh = [v for v in selected_cli_variants(request, "test_cli_end_to_end_fresh_interpreters") if runnable(v)]
    if not per_arch and not fresh:
        yield {}
        return

    def pipeline(variant):
        data_bin = request.getfixturevalue(data_bin_fixture(variant))
        return cli_pipeline(data_bin, variant.arch, flags_of(variant), str(tmp_path_factory.mktemp("cli")))

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("OMP_NUM_THREADS", "1")  # tiny models; no thread oversubscription on 2 cores
        pipelines = {variant.id: pipeline(variant) for variant in per_arch + fresh}  # fixtures resolved here
        pool = concurrent.futures.ThreadPoolExecutor(max_workers=3)
        futures = {}
        for worker in range(2):
            shard = [v.id for v in per_arch[worker::2]]
            if shard:
                work_dir = str(tmp_path_factory.mktemp("cli-driver"))
                runs = [run for vid in shard for run in pipelines[vid]]
                future = pool.submit(run_in_one_interpreter, runs, work_dir, timeout=240 * len(shard))
                futures.update({vid: future for vid in shard})
        for variant in fresh:
            futures[variant.id] = pool.submit(run_each_in_fresh_interpreter, pipelines[variant.id])
        try:
            yield {vid: (pipelines[vid], futures[vid]) for vid in futures}
        finally:
            pool.shutdown(wait=True, cancel_futures=True)  # after -x or Ctrl-C, do not start the rest


def assert_cli_pipeline_worked(runs, test_src):
    """Every entry point exited cleanly; training made its 5 updates with a finite loss (read back
    from the checkpoint with torch's default weights_only loading); fairseq-generate printed a
    hypothesis for every test sentence and a BLEU line; fairseq-interactive one per input line."""
    train, generate, interactive = runs
    for run in runs:
        assert run.error is None, f"{run.module} {' '.join(map(str, run.args))} failed:\n{run.error}\n{run.log[-3000:]}"

    checkpoint = torch.load(os.path.join(train.args[train.args.index("--save-dir") + 1], "checkpoint_last.pt"))
    assert checkpoint["optimizer_history"][-1]["num_updates"] == 5
    losses = [float(x) for x in re.findall(r"\| train \| epoch \d+ \| loss ([^ ]+)", train.stdout + train.log)]
    assert losses and all(math.isfinite(x) for x in losses), (losses, train.log[-2000:])

    with open(test_src) as handle:
        test_sentences = sum(1 for _ in handle)
    assert sorted(hypothesis_ids(generate.stdout)) == list(range(test_sentences)), generate.stdout[-2000:]
    assert re.search(r"Generate test with beam=3: BLEU4 = \d", generate.stdout), generate.stdout[-2000:]

    assert sorted(hypothesis_ids(interactive.stdout)) == [0, 1], interactive.stdout[-2000:] + interactive.log[-2000:]


@pytest.mark.slow
@pytest.mark.parametrize("variant", CLI_VARIANTS, ids=lambda v: v.id)
def test_cli_end_to_end(variant, cli_runs, tiny_raw):
    tiny_config(variant)  # fails clearly for a model without tiny overrides
    runs, future = cli_runs[variant.id]
    future.result()
    assert_cli_pipeline_worked(runs, os.path.join(tiny_raw, "test.src"))


@pytest.mark.slow
@pytest.mark.parametrize("variant", [BOTH_FNN_SA], ids=lambda v: v.id)
def test_cli_end_to_end_fresh_interpreters(variant, cli_runs, tiny_raw):
    """Both-FNN-SA with a new interpreter per entry point, as a user runs them: fairseq-generate
    and -interactive load the checkpoint (torch's weights_only loading) with the plugin imported
    only through --user-dir."""
    runs, future = cli_runs[variant.id]
    future.result()
    assert_cli_pipeline_worked(runs, os.path.join(tiny_raw, "test.src"))


# --------------------------------------------------------------------------- activation checkpointing


def parse_error(capsys, data_bin, variant, extra):
    """The one-line argparse error of fairseq-train's parser for these flags, or None."""
    try:
        build_like_fairseq_train(data_bin, variant.arch, [*flags_of(variant), *extra])
    except SystemExit:
        return capsys.readouterr().err.strip().splitlines()[-1]
    return None


@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: v.id)
@pytest.mark.parametrize("flag", ["--checkpoint-activations", "--offload-activations"])
def test_activation_checkpointing_keeps_loss_and_gradients(variant, flag, subject, request, capsys):
    """With the flag a model computes the same training loss and gradients (dropout on, same
    masks) and keeps less activation memory for backward; a model that cannot checkpoint refuses
    the flag on the command line."""
    built, corpus = subject
    data_bin = request.getfixturevalue(data_bin_fixture(variant))
    error = parse_error(capsys, data_bin, variant, [flag])
    if error is not None:
        assert f"unrecognized arguments: {flag}" in error, error
        return
    checkpointed = build_like_fairseq_train(data_bin, variant.arch, [*flags_of(variant), flag])
    checkpointed.model.load_state_dict(built.model.state_dict())
    loss, grads, saved = training_step(built.model, corpus.batch)
    loss_checkpointed, grads_checkpointed, saved_checkpointed = training_step(checkpointed.model, corpus.batch)

    assert torch.allclose(loss_checkpointed, loss, rtol=1e-5, atol=1e-5), (loss_checkpointed, loss)
    assert grads_checkpointed.keys() == grads.keys()
    for name, grad in grads.items():
        assert torch.allclose(grads_checkpointed[name], grad, rtol=1e-4, atol=1e-6), name
    print(f"{variant.id} {flag}: {saved:,} -> {saved_checkpointed:,} bytes kept for backward "
          f"({saved_checkpointed / saved:.2f}x)")  # the figures of README.md, with -s
    assert saved_checkpointed < 0.75 * saved, (saved_checkpointed, saved)


# --------------------------------------------------------------------------- alignments


@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: v.id)
@torch.no_grad()
def test_alignment_as_fairseq_generate_prints_it(variant, subject):
    """``--print-alignment``: fairseq's SequenceGeneratorWithAlignment re-runs each hypothesis
    through ``model(...)`` WITHOUT naming an alignment layer and reads ``extra["attn"]``. Every
    model must then return source attention ``(batch, tgt, src)``: a distribution-like row per
    target position (finite, non-negative, at most 1 in total, nothing on padding), giving one
    source word per hypothesis word."""
    built, corpus = subject
    model = built.model
    net_input = corpus.batch["net_input"]
    _, extra = model(**net_input)
    (attn,) = extra["attn"]
    assert attn is not None, "decoder returned no attention when fairseq asked for none in particular"
    src, prev = net_input["src_tokens"], net_input["prev_output_tokens"]
    assert attn.shape == (src.size(0), prev.size(1), src.size(1)), attn.shape
    assert torch.isfinite(attn).all() and (attn >= 0).all()
    assert (attn.sum(-1) <= 1 + 1e-4).all()
    pad = built.task.source_dictionary.pad()
    assert attn.masked_select(src.eq(pad)[:, None, :].expand_as(attn)).abs().max() < 1e-6

    generator = SequenceGeneratorWithAlignment([model], built.task.target_dictionary, beam_size=BEAM,
                                               max_len_a=0, max_len_b=6, min_len=6)
    for sentence, nbest in enumerate(generator.generate([model], corpus.batch)):
        words = int(src[sentence].ne(pad).sum()) - 1  # without EOS
        for hypothesis in nbest:
            pairs = [tuple(pair) for pair in hypothesis["alignment"]]
            assert [t for _, t in pairs] == list(range(len(hypothesis["tokens"]) - 1)), pairs
            assert all(0 <= s < words for s, _ in pairs), (pairs, words)


def test_without_fusion_a_decoding_step_runs_fairseqs_operators():
    """fusion_transformer with no fusion flag calls, per incremental step, the very PyTorch operators
    fairseq's transformer calls (the plugin's decoder once sliced the averaged heads when fairseq asks for
    all of them: one slice a step)."""
    from torch.profiler import profile

    from model_building import build_model

    width = ("--encoder-layers", "2", "--decoder-layers", "2", "--encoder-embed-dim", "16", "--decoder-embed-dim",
             "16", "--encoder-ffn-embed-dim", "32", "--decoder-ffn-embed-dim", "32",
             "--encoder-attention-heads", "2", "--decoder-attention-heads", "2")
    calls = {}
    for arch in ("transformer", "fusion_transformer"):
        torch.manual_seed(1)
        model = build_model(arch, *width, src_vocab=50, tgt_vocab=50, joined=True).eval()
        prev = torch.randint(4, 50, (3, 4))
        net_input = {"src_tokens": torch.randint(4, 50, (3, 5)), "src_lengths": torch.full((3,), 5),
                     "prev_output_tokens": prev}
        with torch.no_grad():
            encoder_out, _, _ = full_forward(model, net_input)
            with profile() as profiler:
                decode_incrementally(model, encoder_out, prev)
        calls[arch] = {event.key: event.count for event in profiler.key_averages() if event.key.startswith("aten::")}
    assert calls["fusion_transformer"] == calls["transformer"]
