"""Layer attention and SurfaceFusion wired into the fusion_transformer (Liu et al., ICLR 2021)."""

from types import SimpleNamespace

import pytest
import torch
from fairseq.criterions.label_smoothed_cross_entropy import LabelSmoothedCrossEntropyCriterion
from fairseq.sequence_generator import SequenceGenerator

from model_building import build_model, count_parameters, parse_model_args

TINY = ["--encoder-layers", "3", "--decoder-layers", "2", "--encoder-embed-dim", "16", "--decoder-embed-dim", "16",
        "--encoder-ffn-embed-dim", "32", "--decoder-ffn-embed-dim", "32", "--encoder-attention-heads", "2",
        "--decoder-attention-heads", "2", "--dropout", "0", "--layer-attention-dropconnect", "0"]


def batch(model, seed=0, batch_size=3, src_len=6, tgt_len=5):
    generator = torch.Generator().manual_seed(seed)
    src = torch.randint(4, len(model.encoder.dictionary), (batch_size, src_len), generator=generator)
    target = torch.randint(4, len(model.decoder.dictionary), (batch_size, tgt_len), generator=generator)
    target[:, -1] = model.decoder.dictionary.eos()
    prev = torch.cat([target[:, -1:], target[:, :-1]], dim=1)
    return src, torch.full((batch_size,), src_len), prev, target


def test_layer_attention_parameter_counts():
    vanilla = count_parameters(build_model("fusion_transformer", *TINY))
    coarse = count_parameters(build_model("fusion_transformer", *TINY, "--layer-attention", "coarse"))
    fine = count_parameters(build_model("fusion_transformer", *TINY, "--layer-attention", "fine"))
    assert coarse - vanilla == 2 * (3 + 1)  # M x (N+1)
    assert fine - vanilla == 2 * (3 + 1) * 16  # M x (N+1) x D


def test_each_decoder_layer_reads_its_own_memory():
    model = build_model("fusion_transformer", *TINY, "--layer-attention", "coarse").eval()
    with torch.no_grad():  # at the zero start every layer's S_m is the same average
        model.decoder.layer_attention.logits.normal_(generator=torch.Generator().manual_seed(0))
    src, lengths, prev, _ = batch(model)
    seen = []
    for layer in model.decoder.layers:
        layer.encoder_attn.register_forward_hook(lambda module, args, kwargs, out: seen.append(kwargs["key"]),
                                                 with_kwargs=True)
    encoder_out = model.encoder(src, lengths)
    model.decoder(prev, encoder_out=encoder_out)
    memories = model.decoder.layer_memories(encoder_out, None)
    assert len(seen) == 2 and not torch.equal(memories[0], memories[1])
    for key, memory in zip(seen, memories):
        assert torch.equal(key, memory)
    # X_0 is the word embedding without positions
    embeddings = model.encoder.embed_scale * model.encoder.embed_tokens(src)
    assert torch.equal(encoder_out["encoder_embedding"][0], embeddings)


def memories_of_one_layer(model, src, lengths, layer):
    """S_m with every weight on encoder layer ``layer`` (a logit 200 above the others: the others'
    softmax weights underflow to exactly 0), in the model's current mode."""
    with torch.no_grad():
        model.decoder.layer_attention.logits.zero_()
        model.decoder.layer_attention.logits[:, layer] = 200.0
    encoder_out = model.encoder(src, lengths)
    return model.decoder.layer_memories(encoder_out, None), encoder_out


def test_x0_gets_the_embedding_dropout_in_training_and_none_in_evaluation():
    """X_0 stands where the encoder's dropped-out input embedding stands: with --dropout p, the
    memories read it dropped out (one mask shared by every S_m); in evaluation it is unchanged."""
    model = build_model("fusion_transformer", *TINY, "--layer-attention", "fine", "--dropout", "0.5")
    src, lengths, _, _ = batch(model, batch_size=4, src_len=8)
    torch.manual_seed(0)
    memories, encoder_out = memories_of_one_layer(model.train(), src, lengths, 0)
    x0 = encoder_out["encoder_embedding"][0].transpose(0, 1)
    dropped = memories[0] == 0
    assert 0.35 < dropped.float().mean().item() < 0.65
    assert torch.allclose(memories[0][~dropped], 2 * x0[~dropped])
    assert torch.equal(memories[1], memories[0])
    memories, encoder_out = memories_of_one_layer(model.eval(), src, lengths, 0)
    assert torch.equal(memories[0], encoder_out["encoder_embedding"][0].transpose(0, 1))


def test_memories_of_encoder_layers_get_no_dropout_of_their_own():
    """S_m adds no dropout to what the encoder layers' outputs already carry (X_N reaches the
    vanilla decoder so)."""
    model = build_model("fusion_transformer", *TINY, "--layer-attention", "fine", "--dropout", "0.5").train()
    src, lengths, _, _ = batch(model, batch_size=4, src_len=8)
    torch.manual_seed(0)
    memories, encoder_out = memories_of_one_layer(model, src, lengths, 2)
    assert torch.equal(memories[0], encoder_out["encoder_states"][2])


def test_memories_are_built_once_per_sentence_in_beam_search():
    model = build_model("fusion_transformer", *TINY, "--layer-attention", "fine", "--surface-fusion", "hard").eval()
    src, lengths, _, _ = batch(model)
    calls = []
    model.decoder.layer_attention.register_forward_hook(lambda *args: calls.append(1))
    key_projections = []
    model.decoder.layers[0].encoder_attn.k_proj.register_forward_hook(lambda *args: key_projections.append(1))
    surface_projections = []
    model.decoder.surface_fusion.attention.k_proj.register_forward_hook(lambda *args: surface_projections.append(1))
    generator = SequenceGenerator([model], model.decoder.dictionary, beam_size=3, max_len_b=6)
    hypotheses = generator.forward({"net_input": {"src_tokens": src, "src_lengths": lengths}})
    assert len(hypotheses) == 3 and max(len(h[0]["tokens"]) for h in hypotheses) > 2
    assert calls == [1] and key_projections == [1] and surface_projections == [1]


@pytest.mark.parametrize("kind", ["hard", "soft"])
def test_the_fused_distribution_is_what_the_loss_and_the_generator_see(kind):
    model = build_model("fusion_transformer", *TINY, "--surface-fusion", kind, "--surface-fusion-lambda", "0.7")
    model.train()
    src, lengths, prev, target = batch(model)
    sample = {"net_input": {"src_tokens": src, "src_lengths": lengths, "prev_output_tokens": prev},
              "target": target, "ntokens": target.numel()}
    task = SimpleNamespace(target_dictionary=model.decoder.dictionary)
    criterion = LabelSmoothedCrossEntropyCriterion(task, sentence_avg=False, label_smoothing=0.0)
    loss, _, _ = criterion(model, sample)
    loss.backward()
    attention = model.decoder.surface_fusion.attention
    for name, parameter in attention.named_parameters():
        assert parameter.grad is not None and parameter.grad.abs().sum() > 0, name
    # the loss is the NLL of the fused scores computed by hand from the two distributions
    model.eval()
    features, _ = model.decoder(prev, encoder_out=model.encoder(src, lengths), features_only=True)
    encoder_out = model.encoder(src, lengths)
    decoder_logits = model.decoder.output_layer(features).float()
    surface_logits = model.decoder.output_layer(attention(
        features, encoder_out["encoder_out"][0].transpose(0, 1), encoder_out["encoder_embedding"][0],
        encoder_out["encoder_padding_mask"][0])).float()
    tau = 1.0 if kind == "hard" else 5.0
    surface = torch.log_softmax(surface_logits / tau, -1)
    if kind == "hard":
        expected = 0.7 * torch.log_softmax(decoder_logits, -1) + 0.3 * surface
    else:
        expected = torch.log_softmax(decoder_logits + surface, -1)
    assert loss.item() == pytest.approx(-expected.gather(-1, target.unsqueeze(-1)).sum().item(), rel=1e-5)
    net_output = model(src, lengths, prev)
    assert torch.allclose(model.get_normalized_probs(net_output, log_probs=True), expected, atol=1e-5)
    assert torch.allclose(model.get_normalized_probs(net_output, log_probs=False), expected.exp(), atol=1e-6)


def test_generate_time_layer_masking_via_model_overrides():
    args = parse_model_args("fusion_transformer", *TINY, "--layer-attention", "fine")
    args.mask_encoder_layer = 2
    model = build_model("fusion_transformer", *TINY, "--layer-attention", "fine")
    masked = type(model).build_model(args, SimpleNamespace(source_dictionary=model.encoder.dictionary,
                                                             target_dictionary=model.decoder.dictionary))
    assert masked.decoder.layer_attention.masked_layer == 2
    assert torch.all(masked.decoder.layer_attention.eval().weights()[:, 2] == 0)


@pytest.mark.parametrize("flags,message", [
    (["--layer-attention", "fine", "--mask-encoder-layer", "4"],
     r"--mask-encoder-layer 4 does not exist: the encoder has layers 0 \(embedding\) to 3"),
    (["--mask-encoder-layer", "1"], "--mask-encoder-layer 1 masks a layer-attention weight, which needs --layer-attention"),
    (["--layer-attention", "fine", "--fuse-encoder", "fnn"], "both define the decoder's source memory"),
])
def test_bad_combinations_are_refused(flags, message):
    with pytest.raises(ValueError, match=message):
        build_model("fusion_transformer", *TINY, *flags)


@pytest.mark.parametrize("flags,message", [
    (["--surface-fusion-lambda", "1.2"], "--surface-fusion-lambda must be in [0, 1], got '1.2'"),
    (["--surface-fusion-tau", "0"], "--surface-fusion-tau must be >= 0.01, got '0'"),
    (["--surface-fusion-tau", "-1"], "--surface-fusion-tau must be >= 0.01, got '-1'"),
    (["--layer-attention", "medium"], "argument --layer-attention: invalid choice: 'medium'"),
])
def test_bad_flags_are_refused_by_the_command_line(capsys, flags, message):
    with pytest.raises(SystemExit):
        parse_model_args("fusion_transformer", *flags)
    assert message in capsys.readouterr().err


def test_soft_fusion_defaults_to_the_papers_temperature():
    assert parse_model_args("fusion_transformer", "--surface-fusion", "soft").surface_fusion_tau == 5.0
    assert parse_model_args("surface_fusion_wmt_en_ro").surface_fusion_tau == 1.0
    big = parse_model_args("surface_fusion_wmt_en_de_big")
    assert (big.encoder_embed_dim, big.surface_fusion, big.surface_fusion_lambda) == (1024, "hard", 0.9)
    fgla = parse_model_args("fgla_wmt_en_ro")
    assert (fgla.layer_attention, fgla.layer_attention_dropconnect, fgla.dropout) == ("fine", 0.3, 0.3)


def test_soft_fusion_on_a_hard_fusion_preset_gets_the_soft_temperature():
    assert parse_model_args("surface_fusion_wmt_en_ro", "--surface-fusion", "soft").surface_fusion_tau == 5.0
    assert parse_model_args("surface_fusion_wmt_en_de_big", "--surface-fusion", "soft").surface_fusion_tau == 5.0


# ------------------------------------------------------------- SurfaceFusion: paper text vs released code

def surface_loss(model, seed=0):
    src, lengths, prev, target = batch(model, seed)
    log_probs = model.get_normalized_probs(model(src, lengths, prev), log_probs=True)
    return -log_probs.gather(-1, target.unsqueeze(-1)).mean()


def test_released_surface_fusion_has_one_head_and_a_shared_output_ffn():
    """Parameters: the released code adds one residual FFN d -> d_ff -> d (2 d d_ff + d_ff + d) to the
    paper's surface attention; one head either way costs the same 4 (d^2 + d)."""
    paper = build_model("fusion_transformer", *TINY, "--surface-fusion", "hard")
    released = build_model("fusion_transformer", *TINY, "--surface-fusion", "hard", "--surface-fusion-variant", "released")
    assert count_parameters(released) - count_parameters(paper) == 2 * 16 * 32 + 32 + 16
    assert paper.decoder.surface_fusion.attention.num_heads == 2 and paper.decoder.surface_fusion.output_ffn is None
    assert released.decoder.surface_fusion.attention.num_heads == 1


def test_released_surface_fusion_sends_no_gradient_through_query_and_keys():
    """Only the surface distribution's loss (lambda = 0): the paper's variant trains the decoder and
    the encoder layers through the query and keys; the released one reaches only the embeddings
    (values) and its own attention and FFN."""
    grads = {}
    for variant in ("paper", "released"):
        torch.manual_seed(0)
        model = build_model("fusion_transformer", *TINY, "--surface-fusion", "hard", "--surface-fusion-lambda", "0",
                            "--surface-fusion-variant", variant).train()
        surface_loss(model).backward()
        grads[variant] = {name: p.grad for name, p in model.named_parameters()}
    for name in ("decoder.layers.1.fc2.weight", "encoder.layers.2.fc2.weight"):
        assert grads["paper"][name] is not None and grads["paper"][name].abs().sum() > 0, name
        assert grads["released"][name] is None or grads["released"][name].abs().sum() == 0, name
    for name in ("encoder.embed_tokens.weight", "decoder.surface_fusion.attention.q_proj.weight",
                 "decoder.surface_fusion.attention.k_proj.weight", "decoder.surface_fusion.output_ffn.ffn.fc1.weight"):
        assert grads["released"][name].abs().sum() > 0, name


def test_released_surface_fusion_feeds_both_features_through_the_ffn_and_drops_embedding_values():
    model = build_model("fusion_transformer", *TINY, "--surface-fusion", "hard", "--surface-fusion-lambda", "0.7",
                        "--surface-fusion-variant", "released", "--dropout", "0.5").eval()
    src, lengths, prev, _ = batch(model)
    fusion = model.decoder.surface_fusion
    encoder_out = model.encoder(src, lengths)
    features, _ = model.decoder(prev, encoder_out=encoder_out, features_only=True)
    surface = fusion.attention(features, encoder_out["encoder_out"][0].transpose(0, 1),
                               encoder_out["encoder_embedding"][0], encoder_out["encoder_padding_mask"][0])
    decoder_logits = model.decoder.output_layer(fusion.output_ffn(features)).float()
    surface_logits = model.decoder.output_layer(fusion.output_ffn(surface)).float()
    expected = 0.7 * torch.log_softmax(decoder_logits, -1) + 0.3 * torch.log_softmax(surface_logits, -1)
    assert torch.allclose(model.get_normalized_probs(model(src, lengths, prev), log_probs=True), expected, atol=1e-5)
    # in training, dropout 0.5 zeroes embedding values the surface attention reads (and rescales the rest)
    seen = []
    fusion.attention.v_proj.register_forward_hook(lambda module, inputs, output: seen.append(inputs[0]))
    model.train()
    model(src, lengths, prev)
    embeddings = model.encoder.embed_scale * model.encoder.embed_tokens(src)
    dropped = seen[0] == 0
    assert 0.3 < dropped.float().mean() < 0.7
    assert torch.allclose(seen[0][~dropped], 2 * embeddings[~dropped])


def test_surface_fusion_variant_flag():
    assert parse_model_args("surface_fusion_wmt_en_ro").surface_fusion_variant == "paper"
    args = parse_model_args("surface_fusion_wmt_en_ro", "--surface-fusion-variant", "released")
    assert args.surface_fusion_variant == "released"


def test_bad_surface_fusion_variant_is_refused(capsys):
    with pytest.raises(SystemExit):
        parse_model_args("fusion_transformer", "--surface-fusion-variant", "authors")
    assert "argument --surface-fusion-variant: invalid choice: 'authors'" in capsys.readouterr().err
    args = parse_model_args("fusion_transformer", *TINY, "--surface-fusion", "hard")
    args.surface_fusion_variant = "authors"
    model = build_model("fusion_transformer", *TINY)
    with pytest.raises(ValueError, match="--surface-fusion-variant must be one of paper, released, got 'authors'"):
        type(model).build_model(args, SimpleNamespace(source_dictionary=model.encoder.dictionary,
                                                        target_dictionary=model.decoder.dictionary))


def test_surface_fusion_variant_without_surface_fusion_is_warned_about(caplog):
    def variant_warnings():
        return [r.getMessage() for r in caplog.records if r.levelname == "WARNING" and "variant" in r.getMessage()]

    build_model("fusion_transformer", *TINY, "--surface-fusion-variant", "released")
    assert variant_warnings() == ["flag without effect: --surface-fusion-variant released: it changes "
                                  "SurfaceFusion, and --surface-fusion is none"]
    caplog.clear()
    build_model("fusion_transformer", *TINY, "--surface-fusion", "soft", "--surface-fusion-variant", "released")
    assert variant_warnings() == []
