"""Bad flags get a clear error naming the flag, the value and what is allowed."""

from types import SimpleNamespace

import pytest

from fusion_fairseq.models import FusionTransformerModel
from fusion_fairseq.models.fusion_args import check_fusion_args
from model_building import build_model, dictionary_of_size, parse_model_args


def cli_error(capsys, *flags):
    with pytest.raises(SystemExit) as exit_info:
        parse_model_args("fusion_transformer", *flags)
    assert exit_info.value.code == 2
    return capsys.readouterr().err


def test_unknown_fusion_name(capsys):
    err = cli_error(capsys, "--fuse-encoder", "max")
    assert "argument --fuse-encoder: invalid choice: 'max'" in err
    assert "none, avg, fnn, sa" in err or "'none', 'avg', 'fnn', 'sa'" in err


@pytest.mark.parametrize("flag", ["--fusion-hops", "--fusion-attn-dim", "--fusion-ffn-dim"])
@pytest.mark.parametrize("value", ["0", "-3", "two"])
def test_non_positive_sizes(capsys, flag, value):
    err = cli_error(capsys, flag, value)
    assert f"{flag} must be a positive integer, got '{value}'" in err


def test_fusion_dropout_out_of_range(capsys):
    assert "--fusion-dropout must be in [0, 1), got '1.5'" in cli_error(capsys, "--fusion-dropout", "1.5")


def valid_args(**changes):
    args = parse_model_args("mlrf_iwslt_de_en")
    vars(args).update(changes)
    return args


@pytest.mark.parametrize(
    "changes,message",
    [
        ({"fuse_decoder": "median"}, "--fuse-decoder got 'median'; allowed: none, avg, fnn, sa"),
        ({"fusion_hops": 0}, "--fusion-hops must be a positive integer, got 0"),
        ({"fusion_attn_dim": -1}, "--fusion-attn-dim must be a positive integer, got -1"),
        ({"fusion_ffn_dim": 2.5}, "--fusion-ffn-dim must be a positive integer, got 2.5"),
        ({"encoder_layerdrop": 0.2}, "--encoder-layerdrop/--decoder-layerdrop must be 0"),
        ({"fuse_encoder": "sa", "decoder_embed_dim": 128}, r"--encoder-embed-dim \(256\) == --decoder-embed-dim \(128\)"),
        ({"surface_fusion": "hard", "adaptive_softmax_cutoff": "2000,4000"},
         "--surface-fusion hard projects .* --adaptive-softmax-cutoff 2000,4000 replaces it"),
    ],
)
def test_configurations_built_in_code_are_checked_too(changes, message):
    with pytest.raises(ValueError, match=message):
        check_fusion_args(valid_args(**changes))


def test_build_model_rejects_a_bad_configuration():
    task = SimpleNamespace(source_dictionary=dictionary_of_size(10), target_dictionary=dictionary_of_size(10))
    with pytest.raises(ValueError, match="--fusion-hops must be a positive integer, got 0"):
        FusionTransformerModel.build_model(valid_args(fusion_hops=0), task)


def test_share_all_embeddings_needs_a_joined_dictionary():
    with pytest.raises(ValueError, match="--share-all-embeddings requires a joined dictionary"):
        build_model("mlrf_iwslt_de_en", "--share-all-embeddings")
    shared = build_model("mlrf_iwslt_de_en", "--share-all-embeddings", joined=True)
    assert shared.encoder.embed_tokens is shared.decoder.embed_tokens
