"""Layer-wise coordination (He et al., NeurIPS 2018): sharing, the mixed-attention mask, sizes."""

import pytest
import torch
from fairseq.sequence_generator import SequenceGenerator

from fusion_fairseq.modules.resettable_positions import positions_from_zero, sinusoidal_positions
from model_building import build_model, count_parameters, parse_model_args

TINY = ["--layers", "3", "--embed-dim", "16", "--ffn-embed-dim", "32", "--attention-heads", "2", "--dropout", "0"]


def tiny(*flags, vocab=60):
    return build_model("layerwise_coordination", *TINY, *flags, src_vocab=vocab, joined=True).eval()


def layer_size(d, f):
    return 4 * (d * d + d) + (d * f + f + f * d + d) + 2 * 2 * d


def test_sharing_keeps_one_stack_and_the_count_is_the_hand_computed_one():
    model = tiny()
    assert model.encoder.layers is model.decoder.layers
    assert count_parameters(model) == 60 * 16 + 2 * 16 + 3 * layer_size(16, 32) == 7664
    separate = tiny("--no-layer-sharing")
    assert count_parameters(separate) == count_parameters(model) + 2 * layer_size(16, 32)  # source: layers 1..N-1


def test_table3_size_of_the_small_configuration():
    """14 layers, d=256, d_ff=1024 and a shared vocabulary of about 31K: Table 3's 19.07M."""
    model = build_model("layerwise_coordination_iwslt_de_en", src_vocab=31_300, joined=True)
    expected = 31_300 * 256 + 2 * 256 + 14 * layer_size(256, 1024)
    assert count_parameters(model) == expected == 19_069_952  # 19.07M
    ablated = build_model("layerwise_coordination_iwslt_de_en", "--no-mixed-attention", src_vocab=31_300, joined=True)
    assert count_parameters(ablated) == expected


def test_architectures():
    small = parse_model_args("layerwise_coordination_iwslt_de_en")
    assert (small.layers, small.embed_dim, small.ffn_embed_dim, small.attention_heads) == (14, 256, 1024, 4)
    base = parse_model_args("layerwise_coordination_wmt_en_de")
    assert (base.layers, base.embed_dim, base.ffn_embed_dim, base.attention_heads) == (14, 512, 2048, 8)
    big = parse_model_args("layerwise_coordination_wmt_en_de_big")
    assert (big.layers, big.embed_dim, big.ffn_embed_dim, big.attention_heads) == (14, 1024, 2048, 16)


def inputs(seed=0, src_len=6, tgt_len=5):
    generator = torch.Generator().manual_seed(seed)
    src = torch.randint(4, 60, (2, src_len), generator=generator)
    prev = torch.randint(4, 60, (2, tgt_len), generator=generator)
    return src, torch.full((2,), src_len), prev


def target_states(model, src, lengths, prev):
    features, extra = model.decoder(prev, encoder_out=model.encoder(src, lengths), features_only=True)
    return features


@pytest.mark.parametrize("flags", [[], ["--no-mixed-attention"], ["--no-layer-sharing"]])
def test_a_target_position_never_sees_a_later_target_position(flags):
    model = tiny(*flags)
    src, lengths, prev = inputs()
    before = target_states(model, src, lengths, prev)
    changed = prev.clone()
    changed[:, 3] = (changed[:, 3] + 7) % 56 + 4
    after = target_states(model, src, lengths, changed)
    assert torch.allclose(before[:, :3], after[:, :3], atol=1e-6)
    assert not torch.allclose(before[:, 3:], after[:, 3:], atol=1e-4)


@pytest.mark.parametrize("flags", [[], ["--no-mixed-attention"]])
def test_every_target_position_sees_every_source_position(flags):
    model = tiny(*flags)
    src, lengths, prev = inputs()
    before = target_states(model, src, lengths, prev)
    for position in range(src.size(1)):
        changed = src.clone()
        changed[:, position] = (changed[:, position] + 5) % 56 + 4
        after = target_states(model, changed, lengths, prev)
        assert ((before - after).abs().amax(dim=-1) > 1e-5).all(), position  # every target position moves


def test_a_source_position_never_sees_a_target_position():
    """The source keys and values every decoder layer attends to are the same whatever the target; the
    decoder does not write back into the source states it reads."""
    model = tiny()
    src, lengths, prev = inputs()
    read = []
    for layer in model.decoder.layers:
        def recording(x, source_memory, *args, decode=layer.decode, **kwargs):
            read.append(source_memory)
            return decode(x, source_memory, *args, **kwargs)
        layer.decode = recording
    encoder_out, other_target = model.encoder(src, lengths), (prev + 7) % 56 + 4
    for target in (prev, other_target):
        model.decoder(target, encoder_out=encoder_out)
    layers = len(model.decoder.layers)
    assert len(read) == 2 * layers and not torch.equal(prev, other_target)
    for first, second in zip(read[:layers], read[layers:]):
        assert all(torch.equal(a, b) for a, b in zip(first, second))
    saved = [state.clone() for state in encoder_out["encoder_states"]]
    model.decoder(prev, encoder_out=encoder_out)
    assert all(torch.equal(a, b) for a, b in zip(saved, encoder_out["encoder_states"]))


def test_source_padding_is_masked_on_the_target_side():
    model = tiny()
    src, lengths, prev = inputs()
    padded = torch.cat([torch.full((2, 3), model.encoder.padding_idx), src], dim=1)  # left padding
    alone = target_states(model, src, lengths, prev)
    with_pads = target_states(model, padded, lengths, prev)
    assert torch.allclose(alone, with_pads, atol=1e-5)


def test_mixed_attention_is_one_softmax_over_source_and_target():
    model = tiny()
    src, lengths, prev = inputs()
    _, extra = model.decoder(prev, encoder_out=model.encoder(src, lengths), alignment_layer=1)
    weights = extra["mixed_attn"][0]
    assert weights.shape == (2, 5, 6 + 5)
    assert torch.allclose(weights.sum(-1), torch.ones(2, 5), atol=1e-5)
    target_part = weights[:, :, 6:]
    assert torch.all(target_part.triu(diagonal=1) == 0)  # no later target position
    assert torch.all(weights[:, :, :6] > 0)  # every source position
    assert torch.equal(extra["attn"][0], weights[:, :, :6])


def test_positions_restart_at_zero_for_the_target():
    tokens = torch.tensor([[1, 1, 7, 8, 9], [7, 8, 9, 10, 11]])
    assert positions_from_zero(tokens, padding_idx=1).tolist() == [[0, 0, 0, 1, 2], [0, 1, 2, 3, 4]]
    assert sinusoidal_positions(torch.tensor(0), 4).tolist() == [0.0, 1.0, 0.0, 1.0]
    embedding = tiny().encoder.embedding
    source = embedding(torch.tensor([[7]]), 0)
    target = embedding(torch.tensor([[7]]), 1)
    # to float rounding: the sums that cancel are of order 1 (allclose's default atol 1e-8 failed 1 draw in 8)
    torch.testing.assert_close(target - source, (embedding.language.weight[1] - embedding.language.weight[0])[None, None],
                               rtol=0, atol=1e-6)


def test_language_embedding_separates_the_sides_and_the_ablations_remove_parts():
    plain = tiny("--no-language-embedding", "--no-position-embedding")
    assert plain.encoder.embedding.language is None
    x = plain.encoder.embedding(torch.tensor([[7, 7]]), 0)
    assert torch.equal(x[0, 0], x[0, 1])  # no positions: the same token is the same vector


def test_decoding_projects_the_source_once_per_sentence():
    model = tiny()
    src, lengths, _ = inputs(src_len=8)
    calls = []
    for layer in model.decoder.layers:
        layer.attention.k_proj.register_forward_hook(lambda module, args, out: calls.append(args[0].shape[1]))
    generator = SequenceGenerator([model], model.decoder.dictionary, beam_size=3, max_len_b=5, min_len=5)
    generator.forward({"net_input": {"src_tokens": src, "src_lengths": lengths}})
    # per layer: the encoder's source pass (8 positions) for layers 1..N-1, the decoder's one
    # source projection (8), then one target position per step; never the source again
    source_length_calls = [length for length in calls if length == 8]
    assert len(source_length_calls) == (3 - 1) + 3
    assert all(length in (1, 8) for length in calls)


def test_a_separate_vocabulary_is_refused():
    with pytest.raises(ValueError, match="requires a joined dictionary: binarise with fairseq-preprocess --joined-dictionary"):
        build_model("layerwise_coordination", *TINY, joined=False)


@pytest.mark.parametrize("flags,message", [
    (["--layers", "0"], "--layers must be a positive integer, got '0'"),
    (["--embed-dim", "-4"], "--embed-dim must be a positive integer, got '-4'"),
])
def test_bad_sizes(capsys, flags, message):
    with pytest.raises(SystemExit):
        parse_model_args("layerwise_coordination", *flags)
    assert message in capsys.readouterr().err


def test_heads_must_divide_the_width():
    with pytest.raises(ValueError, match="--embed-dim 16 is not divisible by --attention-heads 3"):
        build_model("layerwise_coordination", *TINY, "--attention-heads", "3", joined=True)


def test_separate_source_layers_need_two_layers_or_more():
    """--layers 1 --no-layer-sharing trained with no source layer at all."""
    flags = list(TINY)
    flags[flags.index("--layers") + 1] = "1"
    with pytest.raises(ValueError, match="--no-layer-sharing .* needs --layers 2 or more; --layers is 1"):
        build_model("layerwise_coordination", *flags, "--no-layer-sharing", joined=True)
    build_model("layerwise_coordination", *flags, joined=True)  # sharing its one layer is a model
