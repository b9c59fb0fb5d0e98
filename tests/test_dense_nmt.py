"""DenseNMT (Shen et al., NAACL 2018): dense ConvS2S and dense Transformer."""

import warnings

import pytest
import torch

import fusion_fairseq.models.dense_fconv  # noqa: F401  (registers dense_fconv*)
import fusion_fairseq.models.dense_transformer  # noqa: F401  (registers dense_transformer*)
from fusion_fairseq.modules.densenmt_connection import block_sizes, dense_plan, final_width, summary_positions
from model_building import build_model, count_parameters, dictionary_of_size, parse_model_args

warnings.filterwarnings("ignore", category=FutureWarning)

TINY_FCONV = [
    "--encoder-embed-dim", "16", "--decoder-embed-dim", "16", "--decoder-out-embed-dim", "12",
    "--encoder-layers", "[(8, 3)] * 3", "--decoder-layers", "[(8, 3)] * 3",
]
TINY_TRANSFORMER = [
    "--encoder-embed-dim", "16", "--decoder-embed-dim", "16", "--encoder-layers", "3", "--decoder-layers", "3",
    "--encoder-ffn-embed-dim", "24", "--decoder-ffn-embed-dim", "24",
    "--encoder-attention-heads", "2", "--decoder-attention-heads", "2", "--growth-dim", "8", "--summary-every", "0",
]
TINY = {"dense_fconv_iwslt_de_en": TINY_FCONV, "dense_transformer_iwslt_de_en": TINY_TRANSFORMER}

VARIANTS = [
    [],                                                     # DenseNMT-L-2
    ["--dense-attention", "1"],                             # DenseNMT-L-1
    ["--dense-attention", "none"],
    ["--summary-every", "3"],                               # conv summary layers (the default)
    ["--no-dense-decoder", "--dense-attention", "none"],    # DenseENC
    ["--no-dense-encoder", "--dense-attention", "none"],    # DenseDEC
    ["--no-dense-encoder", "--no-dense-decoder"],           # DenseAtt (DenseAtt-2 only)
    ["--no-dense-encoder", "--no-dense-decoder", "--dense-attention", "none"],  # BASE
    ["--embed-bottleneck-dim", "6"],                        # small embeddings
]
CASES = [(arch, variant) for arch in TINY for variant in VARIANTS]
CASES.append(("dense_fconv_iwslt_de_en", ["--summary-every", "3", "--summary-layer", "linear"]))
IDS = [f"{arch.split('_')[1]}:{' '.join(variant) or 'default'}" for arch, variant in CASES]


def tiny_model(arch, *flags, dropout="0.1"):
    torch.manual_seed(0)
    return build_model(arch, *TINY[arch], "--dropout", dropout, *flags, src_vocab=30, tgt_vocab=25)


def run(model, src, prev):
    return model(src, src.ne(1).sum(1), prev)[0]


def incremental(model, encoder_out, prev, state, start, stop):
    return torch.cat([model.decoder(prev[:, : t + 1], encoder_out, incremental_state=state)[0]
                      for t in range(start, stop)], dim=1)


@pytest.mark.parametrize("arch", ["dense_fconv_iwslt_de_en", "dense_fconv_iwslt_de_en_8l", "dense_fconv_wmt_en_de",
                                  "dense_transformer_iwslt_de_en"])
def test_paper_architectures_build(arch):
    model = build_model(arch, src_vocab=40, tgt_vocab=30)
    assert count_parameters(model) > 0
    if arch == "dense_fconv_wmt_en_de":
        # 15 layers, sumlen 6: summaries after layers 5 and 10, DenseAtt-2 over the top block
        assert len(model.encoder.layer_convolutions) == 15 and len(model.decoder.convolutions) == 15
        assert sorted(map(int, model.encoder.summaries)) == [4, 9] == sorted(map(int, model.decoder.summaries))
        assert model.encoder.num_sources == 6  # summary output + layers 11..15


def test_paper_sizes_match_the_residual_baselines():
    """Sec. 4.2: "the hidden size is set as 128 in order to keep the model size consistent"."""
    dense = count_parameters(build_model("dense_fconv_iwslt_de_en", src_vocab=8848, tgt_vocab=6632))
    base = count_parameters(build_model("fconv_iwslt_de_en", "--decoder-layers", "[(256, 3)] * 4",
                                        src_vocab=8848, tgt_vocab=6632))
    assert abs(dense - base) / base < 0.05
    # all dense parts off: exactly ConvS2S's residual model (same parameter count)
    small = ["--encoder-embed-dim", "32", "--decoder-embed-dim", "32", "--decoder-out-embed-dim", "32"]
    residual = build_model("dense_fconv_iwslt_de_en", *small, "--no-dense-encoder", "--no-dense-decoder",
                           "--dense-attention", "none", "--residual-dim", "16", src_vocab=50, tgt_vocab=40)
    fconv = build_model("fconv_iwslt_de_en", *small, "--encoder-layers", "[(16, 3)] * 4",
                        "--decoder-layers", "[(16, 3)] * 4", src_vocab=50, tgt_vocab=40)
    assert count_parameters(residual) == count_parameters(fconv)
    # DenseAtt-1 and DenseAtt-2 have the same parameters (Sec. 3.2)
    att1, att2 = (build_model("dense_fconv_iwslt_de_en", *small, "--dense-attention", kind, src_vocab=50, tgt_vocab=40)
                  for kind in ("1", "2"))
    assert count_parameters(att1) == count_parameters(att2)


def iwslt_count(arch, *flags):
    return count_parameters(build_model(arch, *flags, src_vocab=8848, tgt_vocab=6632))


def test_table_2_ablations_have_about_base_4l_size():
    """Sec. 4.2: DenseENC-4L / DenseDEC-4L are BASE-4L with one side made dense (growth 128), and
    "different 4-layer models have similar model sizes": the residual side keeps BASE-4L's 256."""
    base = iwslt_count("fconv_iwslt_de_en", "--decoder-layers", "[(256, 3)] * 4")
    dense_encoder = iwslt_count("dense_fconv_iwslt_de_en", "--no-dense-decoder", "--dense-attention", "none")
    dense_decoder = iwslt_count("dense_fconv_iwslt_de_en", "--no-dense-encoder", "--dense-attention", "none")
    dense_attention = iwslt_count("dense_fconv_iwslt_de_en", "--no-dense-encoder", "--no-dense-decoder")
    plugin_base = iwslt_count("dense_fconv_iwslt_de_en", "--no-dense-encoder", "--no-dense-decoder",
                              "--dense-attention", "none")
    assert (dense_encoder, dense_decoder, dense_attention, plugin_base) == (9847248, 10468816, 10342864, base)
    for count in (dense_encoder, dense_decoder, dense_attention):
        assert abs(count - base) / base < 0.035


@pytest.mark.slow
def test_en_de_15_has_the_papers_20_percent_fewer_parameters_than_convs2s():
    """Sec. 5.4: DenseNMT-En-De-15 has "20% fewer parameters" than ConvS2S (fconv_wmt_en_de), which
    conv + GLU summary layers reproduce (40k vocabularies: 0.794); linear ones give 0.661."""
    vocab = {"src_vocab": 40000, "tgt_vocab": 40000}
    convs2s = count_parameters(build_model("fconv_wmt_en_de", **vocab))
    dense = build_model("dense_fconv_wmt_en_de", **vocab)
    assert round(count_parameters(dense) / convs2s, 3) == 0.794
    linear = count_parameters(build_model("dense_fconv_wmt_en_de", "--summary-layer", "linear", **vocab))
    assert round(linear / convs2s, 3) == 0.661
    # a summary layer is a convolution over the concatenated features, back to the embedding size
    summary = dense.decoder.summaries["4"]
    assert (summary.in_channels, summary.out_channels, summary.kernel_size[0]) == (768 + 5 * 256, 2 * 768, 3)


def test_8_layer_preset_keeps_linear_summary_layers_near_base_8l():
    base = iwslt_count("fconv_iwslt_de_en", "--encoder-layers", "[(192, 3)] * 8", "--decoder-layers", "[(192, 3)] * 8")
    assert round(iwslt_count("dense_fconv_iwslt_de_en_8l") / base, 3) == 1.099
    assert round(iwslt_count("dense_fconv_iwslt_de_en_8l", "--summary-layer", "conv") / base, 3) == 1.298


def test_bad_summary_layer_is_refused(capsys):
    with pytest.raises(SystemExit):
        parse_model_args("dense_fconv_iwslt_de_en", "--summary-layer", "mlp")
    assert "argument --summary-layer: invalid choice: 'mlp'" in capsys.readouterr().err


@pytest.mark.parametrize("arch,variant", CASES, ids=IDS)
def test_forward_backward_and_incremental_decoding(arch, variant):
    model = tiny_model(arch, *variant)
    src = torch.randint(4, 30, (3, 7))
    src[1, :2] = 1  # left padding
    prev = torch.randint(4, 25, (3, 6))
    prev[:, 0] = 2
    model.train()
    out = run(model, src, prev)
    assert out.shape == (3, 6, 25) and torch.isfinite(out).all()
    out.logsumexp(-1).mean().backward()
    missing = [name for name, p in model.named_parameters() if p.requires_grad and p.grad is None]
    assert not missing
    assert all(torch.isfinite(p.grad).all() for p in model.parameters())

    model.eval()
    with torch.no_grad():
        full = run(model, src, prev)
        encoder_out = model.encoder(src, src.ne(1).sum(1))
        steps = incremental(model, encoder_out, prev, {}, 0, prev.size(1))
    assert (steps - full).abs().max() <= 1e-5


@pytest.mark.parametrize("arch,variant", [case for case in CASES if case[1] in (VARIANTS[0], VARIANTS[3], VARIANTS[7])])
def test_incremental_state_survives_beam_reordering(arch, variant):
    """Beam search reorders hypotheses of one source sentence: rows share the source."""
    model = tiny_model(arch, *variant).eval()
    src = torch.randint(4, 30, (1, 6)).repeat(3, 1)
    prev = torch.randint(4, 25, (3, 7))
    prev[:, 0] = 2
    new_order = torch.tensor([1, 0, 0])
    with torch.no_grad():
        encoder_out = model.encoder(src, src.ne(1).sum(1))
        state = {}
        incremental(model, encoder_out, prev, state, 0, 4)
        model.decoder.reorder_incremental_state_scripting(state, new_order)
        encoder_out = model.encoder.reorder_encoder_out(encoder_out, new_order)
        reordered = torch.cat([prev[new_order, :4], prev[:, 4:]], dim=1)
        after = incremental(model, encoder_out, reordered, state, 4, 7)
        full = run(model, src, reordered)[:, 4:]
    assert (after - full).abs().max() <= 1e-5


@pytest.mark.parametrize("dense_attention", ["2", "1"])
def test_decoder_projects_the_source_memory_once_per_sentence(dense_attention):
    """DenseAtt-2 stacks every encoder layer in the memory (L x src positions): projecting its keys
    and values again at every step would cost L x src rows per layer and step. Only the first
    step may project them; the result equals the full forward."""
    model = tiny_model("dense_transformer_iwslt_de_en", "--dense-attention", dense_attention).eval()
    src = torch.randint(4, 30, (2, 6))
    prev = torch.randint(4, 25, (2, 5))
    prev[:, 0] = 2
    rows = []
    hooks = [layer.encoder_attn.k_proj.register_forward_hook(lambda m, i, o: rows.append(i[0].shape[:-1].numel()))
             for layer in model.decoder.layers]
    with torch.no_grad():
        full = run(model, src, prev)
        rows.clear()
        steps = incremental(model, model.encoder(src, src.ne(1).sum(1)), prev, {}, 0, prev.size(1))
    for hook in hooks:
        hook.remove()
    sources = 3 if dense_attention == "2" else 1
    assert rows == [sources * 6 * 2] * len(model.decoder.layers), rows  # first step only, whole memory
    assert (steps - full).abs().max() <= 1e-5


def test_dense_attention_cache_follows_a_finished_sentence_out_with_a_beam_size_set():
    """Two sentences x 2 hypotheses; the first sentence finishes, so beam search keeps the rows of
    the second. A decoder told its beam size (``set_beam_size``, which fairseq's beamable
    attention uses to keep one copy per sentence) must still reorder the per-hypothesis
    DenseAtt-2 cache row by row."""
    model = tiny_model("dense_transformer_iwslt_de_en").eval()
    model.decoder.set_beam_size(2)
    src = torch.randint(4, 30, (2, 6)).repeat_interleave(2, dim=0)
    prev = torch.randint(4, 25, (4, 6))
    prev[:, 0] = 2
    keep = torch.tensor([3, 2])
    with torch.no_grad():
        encoder_out = model.encoder(src, src.ne(1).sum(1))
        state = {}
        incremental(model, encoder_out, prev, state, 0, 3)
        model.decoder.reorder_incremental_state_scripting(state, keep)
        after = incremental(model, model.encoder.reorder_encoder_out(encoder_out, keep), prev[keep], state, 3, 6)
        full = run(model, src[keep], prev[keep])[:, 3:]
    assert (after - full).abs().max() <= 1e-5


def trace_dense_decoder(model, src, prev):
    """Run the tiny dense Transformer once; per decoder layer its source attention's own output
    ``a``, the value its residual add received (LayerNorm input minus residual: post-norm layers
    hand the residual in as the query), and the a_l block of the features the output projection
    reads (d0 = 16, growth 8: block l at 16 + 16 l + 8)."""
    traces, handles, read = [], [], {}
    for layer in model.decoder.layers:
        trace = {}
        handles.append(layer.encoder_attn.register_forward_hook(
            lambda m, args, kwargs, out, trace=trace: trace.update(query=kwargs["query"], a=out[0]), with_kwargs=True))
        handles.append(layer.encoder_attn_layer_norm.register_forward_pre_hook(
            lambda m, args, trace=trace: trace.update(summed=args[0])))
        traces.append(trace)
    handles.append(model.decoder.project_out_dim.register_forward_pre_hook(lambda m, args: read.update(x=args[0])))
    torch.manual_seed(3)
    run(model, src, prev)
    for handle in handles:
        handle.remove()
    features = read["x"].transpose(0, 1)  # T x B x C, as the layers' states
    for index, trace in enumerate(traces):
        start = 16 + 16 * index + 8
        trace["read"] = features[..., start:start + 8]
        trace["added"] = trace["summed"] - trace["query"]
    return traces


def test_dense_transformer_concatenates_a_l_with_the_dropout_of_its_residual_add():
    """Eq. 7's a_l, as later layers and the output projection read it, is the attention output
    after the layer's dropout, with the same mask as the residual add (not the raw output)."""
    model = tiny_model("dense_transformer_iwslt_de_en", dropout="0.5").train()
    src = torch.randint(4, 30, (4, 7))
    prev = torch.randint(4, 25, (4, 6))
    prev[:, 0] = 2
    for trace in trace_dense_decoder(model, src, prev):
        assert torch.allclose(trace["read"], trace["added"], atol=1e-5)
        dropped = trace["read"] == 0
        assert 0.3 < dropped.float().mean().item() < 0.7
        assert torch.allclose(trace["read"][~dropped], 2 * trace["a"][~dropped], atol=1e-5)


def test_dense_transformer_reads_a_l_unchanged_in_evaluation():
    model = tiny_model("dense_transformer_iwslt_de_en", dropout="0.5").eval()
    src = torch.randint(4, 30, (4, 7))
    prev = torch.randint(4, 25, (4, 6))
    prev[:, 0] = 2
    with torch.no_grad():
        for trace in trace_dense_decoder(model, src, prev):
            assert torch.equal(trace["read"], trace["a"])


@pytest.mark.parametrize("arch,variant", [case for case in CASES if case[1] in (VARIANTS[0], VARIANTS[1], VARIANTS[7])])
def test_left_padding_invariance(arch, variant):
    model = tiny_model(arch, *variant).eval()
    short = torch.randint(4, 30, (1, 4))
    long = torch.randint(4, 30, (1, 9))
    batch = torch.cat([torch.cat([torch.ones(1, 5, dtype=torch.long), short], dim=1), long])
    prev = torch.randint(4, 25, (2, 5))
    prev[:, 0] = 2
    with torch.no_grad():
        alone = run(model, short, prev[:1])
        padded = run(model, batch, prev)[:1]
    assert (alone - padded).abs().max() <= 1e-5


def test_dense_plan_widths():
    """Sec. 3.3: the L-th layer reads (L-1) d + d0; with sumlen S a summary after every S-1 layers
    bounds every input by (S-1) d + d0 (the summary itself) and (S-2) d + d0 (a layer)."""
    d0, d = 32, 8
    plan = dense_plan([d] * 4, d0)
    assert [(s.kind, s.in_dim) for s in plan] == [("layer", 32), ("layer", 40), ("layer", 48), ("layer", 56)]
    assert final_width(plan) == 64 and block_sizes(plan) == [8, 8, 8, 8]
    assert summary_positions(7, 3) == [1, 3, 5]
    plan = dense_plan([d] * 7, d0, summary_every=3)
    assert [(s.kind, s.in_dim) for s in plan] == [
        ("layer", 32), ("layer", 40), ("summary", 48), ("layer", 32), ("layer", 40), ("summary", 48),
        ("layer", 32), ("layer", 40), ("summary", 48), ("layer", 32)]
    assert all(s.in_dim <= (3 - 1) * d + d0 for s in plan)
    assert block_sizes(plan) == [32, 8] and final_width(plan) == 40


def test_model_layer_input_widths():
    flags = ["--encoder-layers", "[(8, 3)] * 5", "--decoder-layers", "[(8, 3)] * 5", "--growth-dim", "4",
             "--summary-every", "3"]
    model = tiny_model("dense_fconv_iwslt_de_en", *flags)
    # encoder: d0 = 16, growth 4 per layer; decoder: 2 x 4 per layer (z and a, Eq. 7)
    assert model.encoder.layer_input_widths == [16, 20, 24, 16, 20, 24, 16]
    assert model.decoder.layer_input_widths == [16, 24, 32, 16, 24, 32, 16]
    assert [conv.in_channels for conv in model.encoder.layer_convolutions] == [16, 20, 16, 20, 16]
    assert [conv.out_channels for conv in model.decoder.convolutions] == [8] * 5  # GLU halves to 4
    assert model.decoder.fc2.in_features == 16 + 2 * 4 * 1
    transformer = tiny_model("dense_transformer_iwslt_de_en", "--summary-every", "3", "--encoder-layers", "5",
                             "--decoder-layers", "5")
    assert transformer.encoder.layer_input_widths == [16, 24, 32, 16, 24, 32, 16]
    assert transformer.decoder.layer_input_widths == [16, 32, 48, 16, 32, 48, 16]


def cli_error(capsys, arch, *flags):
    with pytest.raises(SystemExit) as exit_info:
        parse_model_args(arch, *flags)
    assert exit_info.value.code == 2
    return capsys.readouterr().err


@pytest.mark.parametrize("arch", list(TINY))
@pytest.mark.parametrize("flags,message", [
    (["--growth-dim", "0"], "--growth-dim must be a positive integer, got '0'"),
    (["--growth-dim", "-4"], "--growth-dim must be a positive integer, got '-4'"),
    (["--summary-every", "1"], "--summary-every must be 0 (no summary layers) or an integer >= 2"),
    (["--embed-bottleneck-dim", "0"], "--embed-bottleneck-dim must be a positive integer, got '0'"),
    (["--dense-attention", "3"], "argument --dense-attention: invalid choice: '3'"),
])
def test_bad_flags_are_argparse_errors(capsys, arch, flags, message):
    assert message in cli_error(capsys, arch, *flags)


@pytest.mark.parametrize("flags, message", [
    (["--growth-dim", "6", "--encoder-attention-heads", "4"], "--growth-dim 6 must be divisible by "
                                                              "--encoder-attention-heads 4"),
    (["--no-dense-decoder", "--decoder-embed-dim", "18", "--decoder-attention-heads", "4"],
     "--decoder-embed-dim 18 must be divisible by --decoder-attention-heads 4"),
    (["--share-decoder-input-output-embed", "--decoder-output-dim", "12"],
     "--share-decoder-input-output-embed needs --decoder-output-dim 12 to equal the target embedding width 16"),
    (["--share-all-embeddings", "--decoder-output-dim", "12"],
     "--share-all-embeddings needs --decoder-output-dim 12 to equal the target embedding width 16"),
])
def test_the_dense_transformer_refuses_widths_its_attention_or_tied_output_cannot_take(flags, message):
    with pytest.raises(ValueError, match=message):
        build_model("dense_transformer_iwslt_de_en", *TINY_TRANSFORMER, *flags, src_vocab=30, tgt_vocab=30,
                    joined=True)


@pytest.mark.parametrize("arch", list(TINY))
def test_bad_values_are_clear_errors(arch):
    with pytest.raises(ValueError, match=r"--embed-bottleneck-dim 32 is wider than --encoder-embed-dim 16"):
        tiny_model(arch, "--embed-bottleneck-dim", "32")
    with pytest.raises(ValueError, match="--summary-every 2 needs a dense side"):
        tiny_model(arch, "--no-dense-encoder", "--no-dense-decoder", "--summary-every", "2")
    model_cls = type(tiny_model(arch))
    for changes, message in [({"growth_dim": 0}, "--growth-dim must be a positive integer, got 0"),
                             ({"summary_every": 1}, r"--summary-every must be 0 \(no summary layers\) or an integer >= 2"),
                             ({"dense_attention": "3"}, "--dense-attention must be one of none, 1, 2")]:
        args = parse_model_args(arch, *TINY[arch])
        vars(args).update(changes)
        task = type("Task", (), {"source_dictionary": dictionary_of_size(30), "target_dictionary": dictionary_of_size(25)})
        with pytest.raises(ValueError, match=message):
            model_cls.build_model(args, task)


@pytest.mark.parametrize("flags", [[], ["--dense-attention", "1"]], ids=["DenseAtt-2", "DenseAtt-1"])
def test_a_trained_step_leaves_no_tensor_that_stops_a_copy(flags):
    """fairseq's --store-ema deep-copies the model after the first forward: the dense decoder's layers
    kept that forward's a_l and attention output, tensors of the graph that torch will not copy."""
    import copy

    model = tiny_model("dense_transformer_iwslt_de_en", *flags).train()
    src, prev = torch.randint(4, 30, (2, 5)), torch.randint(4, 25, (2, 4))
    run(model, src, prev).sum().backward()
    copied = copy.deepcopy(model)
    assert all(torch.equal(a, b) for a, b in zip(copied.state_dict().values(), model.state_dict().values()))
