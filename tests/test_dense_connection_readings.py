"""scripts/dense_connection_readings.py: the scale of Dou et al.'s dense connection (Eq. 4) under each
reading, every model with the vanilla model's weights (examples/deep_representations/README.md)."""

import pytest

from conftest import load_script
from fusion_fairseq.modules.layer_aggregation import DENSE_CONNECTION_READINGS

SMALL = ("--encoder-layers 3 --decoder-layers 3 --encoder-embed-dim 64 --decoder-embed-dim 64 "
         "--encoder-ffn-embed-dim 128 --decoder-ffn-embed-dim 128 --encoder-attention-heads 4 --decoder-attention-heads 4")


def test_every_reading_is_measured_beside_the_vanilla_model(capsys):
    rows = dict(load_script("dense_connection_readings").main(["--model-flags", SMALL]))
    assert list(rows) == ["vanilla", *(f"dense {reading}" for reading in DENSE_CONNECTION_READINGS)]
    # Eq. 4 to the letter and the plain sum add the earlier states unnormalised: the top states grow
    vanilla = rows["vanilla"]["decoder_norm"]
    assert rows["dense literal"]["decoder_norm"] > rows["dense sum"]["decoder_norm"] > 1.5 * vanilla
    assert abs(rows["dense layernorm"]["decoder_norm"] - vanilla) < 0.1 * vanilla  # normalised: vanilla's scale
    out = capsys.readouterr().out
    assert "logit std / vanilla" in out and "dense literal" in out


@pytest.mark.parametrize("flags, message", [("--encoder-layers x", "--encoder-layers"),
                                            ("--encoder-layers '2", "--model-flags: cannot split flags"),
                                            ("--arch transformer", "the architecture is fusion_transformer")])
def test_bad_model_flags_are_one_line_errors(flags, message, capsys):
    """They were tracebacks (fairseq's rejection, shlex's unclosed quote)."""
    with pytest.raises(SystemExit) as exit_info:
        load_script("dense_connection_readings").main(["--model-flags", flags])
    assert exit_info.value.code == 2 and message in capsys.readouterr().err.splitlines()[-1]
