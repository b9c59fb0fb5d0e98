"""Checkpoints saved before a model change load as the function they were trained as, or are
refused with a one-line error naming the ``--model-overrides`` that loads them.

* MLRF FNN fusion reads the shared layer embedding of Eq. 4 since it was added to Table 4's
  ablation; an FNN fusion saved before has no layer embedding of its own.
* DenseNMT's residual sides (``--no-dense-encoder`` / ``--no-dense-decoder``) take
  ``--residual-dim`` since that flag exists; before, they took the layer sizes.
"""

import logging

import pytest
import torch
from fairseq import checkpoint_utils, tasks

from conftest import TINY_MLRF_FLAGS, USER_DIR, run_cli, saved_without_config_field
from fusion_fairseq.checkpoint_safety import MissingParametersError

TINY_TRANSFORMER = TINY_MLRF_FLAGS[:16]  # its dimensions, without the fusion flags
TINY_FCONV = ["--encoder-embed-dim", "16", "--decoder-embed-dim", "16", "--decoder-out-embed-dim", "16",
              "--encoder-layers", "[(8, 3)] * 2", "--decoder-layers", "[(8, 3)] * 2"]
TABLE = "output_fusion.function.layer_embedding.weight"


def train_log(data_bin, save_dir, arch, *flags, updates=2):
    result = run_cli(
        "fairseq_cli.train", data_bin, "--user-dir", USER_DIR, "--arch", arch, *flags,
        "--optimizer", "adam", "--lr", "0.003", "--max-tokens", "1000", "--max-update", str(updates),
        "--save-dir", save_dir, "--no-progress-bar", "--seed", "1", "--no-epoch-checkpoints",
    )
    return result.stdout + result.stderr


def train(data_bin, save_dir, arch, *flags):
    train_log(data_bin, save_dir, arch, *flags)
    return f"{save_dir}/checkpoint_last.pt"


@pytest.fixture(scope="module")
def vanilla_checkpoint(tiny_data_bin, tmp_path_factory):
    """A ``fusion_transformer`` with no fusion: its file is the frame of the checkpoints below."""
    return train(tiny_data_bin, str(tmp_path_factory.mktemp("vanilla")), "fusion_transformer", *TINY_TRANSFORMER)


def save_with_model(frame_checkpoint, path, state_dict, **model_config):
    """``frame_checkpoint`` with ``state_dict`` and its model configuration updated by ``model_config``."""
    state = torch.load(frame_checkpoint)
    vars(state["cfg"]["model"]).update(model_config)
    state["model"] = state_dict
    torch.save(state, path)
    return str(path)


def build_from(frame_checkpoint, **model_config):
    """A freshly initialised model of ``frame_checkpoint``'s configuration updated by ``model_config``."""
    cfg = checkpoint_utils.load_checkpoint_to_cpu(frame_checkpoint, arg_overrides=model_config)["cfg"]
    torch.manual_seed(0)
    return tasks.setup_task(cfg.task).build_model(cfg.model)


def translate_scores(model):
    torch.manual_seed(1)
    src = torch.randint(4, 20, (3, 7))
    prev = torch.randint(4, 20, (3, 5))
    return model.eval()(src, torch.full((3,), 7), prev)[0]


def fnn_sides(model_config):
    return [side for side in ("encoder", "decoder") if model_config.get(f"fuse_{side}") == "fnn"]


def saved_before_fnn_read_the_layer_embedding(model, model_config):
    """The state dict the same model had when FNN fusion read no layer embedding: no table under the
    FNN's names, and self-attention fusion's table with the rows of its own side, h0..hL."""
    state_dict = model.state_dict()
    for side in fnn_sides(model_config):
        del state_dict[f"{side}.{TABLE}"]
    for side in ("encoder", "decoder"):
        if model_config.get(f"fuse_{side}") == "sa":
            rows = model_config.get(f"{side}_layers", 2) + 1
            state_dict[f"{side}.{TABLE}"] = state_dict[f"{side}.{TABLE}"][:rows].clone()
    return state_dict


def as_it_was_trained(model, model_config):
    """``model`` with its FNN fusions reading no layer embedding, as they were trained."""
    for side in fnn_sides(model_config):
        getattr(model, side).output_fusion.function.layer_embedding = None
    return model


MLRF_CONFIGURATIONS = {
    "Enc-FNN": {"fuse_encoder": "fnn", "fuse_decoder": "none"},
    "Dec-FNN": {"fuse_encoder": "none", "fuse_decoder": "fnn"},
    "Both-FNN": {"fuse_encoder": "fnn", "fuse_decoder": "fnn"},
    "Both-FNN-SA": {"fuse_encoder": "fnn", "fuse_decoder": "sa"},
    "Both-FNN-SA, deeper encoder": {"fuse_encoder": "fnn", "fuse_decoder": "sa", "encoder_layers": 3},
    "Enc-SA Dec-FNN, deeper decoder": {"fuse_encoder": "sa", "fuse_decoder": "fnn", "decoder_layers": 3},
}


@pytest.mark.parametrize("name", MLRF_CONFIGURATIONS)
def test_an_fnn_fusion_saved_without_layer_embedding_loads_as_trained(vanilla_checkpoint, tmp_path, caplog, name):
    config = MLRF_CONFIGURATIONS[name]
    trained = build_from(vanilla_checkpoint, **config)
    expected = translate_scores(as_it_was_trained(build_from(vanilla_checkpoint, **config), config))
    old = save_with_model(vanilla_checkpoint, tmp_path / "old.pt",
                          saved_before_fnn_read_the_layer_embedding(trained, config), **config)

    with caplog.at_level(logging.WARNING, logger="fusion_fairseq"):
        models, _ = checkpoint_utils.load_model_ensemble([old])
    assert torch.equal(translate_scores(models[0]), expected)
    warning = " ".join(record.getMessage() for record in caplog.records)
    assert all(f"{side}.{TABLE}" in warning for side in fnn_sides(config))
    assert "the function it was trained as" in warning

    resaved = save_with_model(vanilla_checkpoint, tmp_path / "resaved.pt", models[0].state_dict(), **config)
    reloaded, _ = checkpoint_utils.load_model_ensemble([resaved])
    assert torch.equal(translate_scores(reloaded[0]), expected)


@pytest.mark.parametrize("name", ["Enc-FNN", "Dec-FNN", "Both-FNN"])
def test_an_old_fnn_fusion_computes_what_a_zero_layer_embedding_does(vanilla_checkpoint, tmp_path, caplog, name):
    config = MLRF_CONFIGURATIONS[name]
    model = build_from(vanilla_checkpoint, **config)
    old = save_with_model(vanilla_checkpoint, tmp_path / "old.pt",
                          saved_before_fnn_read_the_layer_embedding(model, config), **config)
    with caplog.at_level(logging.WARNING, logger="fusion_fairseq"):
        models, _ = checkpoint_utils.load_model_ensemble([old])
    assert "as if it were zeros: the function it was trained as" in caplog.text
    assert not any("layer_embedding" in key for key in models[0].state_dict())  # the parameters it was saved with

    zeroed = build_from(vanilla_checkpoint, **config)
    with torch.no_grad():
        getattr(zeroed, fnn_sides(config)[0]).output_fusion.function.layer_embedding.weight.zero_()
    assert torch.equal(translate_scores(models[0]), translate_scores(zeroed))


def test_training_resumes_from_an_fnn_fusion_saved_without_layer_embedding(tiny_data_bin, tmp_path):
    """Enc-FNN trained with no layer embedding has the parameters an FNN fusion had before it read
    one, and with its stored --fusion-no-layer-embedding switched off, the configuration such a
    checkpoint holds; fairseq-train resumes from its checkpoint_last.pt, optimizer state included."""
    flags = [*TINY_TRANSFORMER, "--fuse-encoder", "fnn"]
    last = train(tiny_data_bin, str(tmp_path), "fusion_transformer", *flags, "--fusion-no-layer-embedding")
    state = torch.load(last)
    vars(state["cfg"]["model"])["fusion_no_layer_embedding"] = False
    torch.save(state, last)
    log = train_log(tiny_data_bin, str(tmp_path), "fusion_transformer", *flags, updates=4)
    assert f"checkpoint has no encoder.{TABLE}" in log
    assert torch.load(tmp_path / "checkpoint_last.pt")["optimizer_history"][-1]["num_updates"] == 4


def test_a_new_fnn_checkpoint_keeps_its_layer_embedding(vanilla_checkpoint, tmp_path):
    config = MLRF_CONFIGURATIONS["Both-FNN-SA"]
    model = build_from(vanilla_checkpoint, **config)
    new = save_with_model(vanilla_checkpoint, tmp_path / "new.pt", model.state_dict(), **config)
    models, _ = checkpoint_utils.load_model_ensemble([new])
    assert torch.equal(translate_scores(models[0]), translate_scores(model))
    encoder, decoder = (getattr(models[0], side).output_fusion.function for side in ("encoder", "decoder"))
    assert encoder.layer_embedding is decoder.layer_embedding


def test_a_vanilla_checkpoint_with_fnn_fusion_switched_on_is_still_refused(vanilla_checkpoint):
    with pytest.raises(MissingParametersError,
                       match=r"the checkpoint has no fusion parameters .*encoder\.output_fusion\."):
        checkpoint_utils.load_model_ensemble([vanilla_checkpoint], arg_overrides={"fuse_encoder": "fnn"})


def test_fnn_fusion_switched_on_beside_a_saved_fusion_is_not_filled_in(vanilla_checkpoint, tmp_path):
    """Dec-SA saved, Enc-FNN asked for at load: the FNN's own weights are missing, so nothing is
    filled and the strict load names them."""
    dec_sa = {"fuse_encoder": "none", "fuse_decoder": "sa"}
    saved = save_with_model(vanilla_checkpoint, tmp_path / "dec_sa.pt",
                            build_from(vanilla_checkpoint, **dec_sa).state_dict(), **dec_sa)
    with pytest.raises(RuntimeError, match=r"encoder\.output_fusion\.function\.ffn\.fc1\.weight"):
        checkpoint_utils.load_model_ensemble([saved], arg_overrides={"fuse_encoder": "fnn"})


# --- DenseNMT: a residual side from before --residual-dim -----------------------------------

@pytest.fixture(scope="module")
def narrow_residual_decoder_checkpoint(tiny_data_bin, tmp_path_factory):
    """DenseENC (``--no-dense-decoder``) as saved before ``--residual-dim``: the residual decoder
    has the layer size (8), and the stored configuration has no ``residual_dim``."""
    save_dir = tmp_path_factory.mktemp("dense_enc_old")
    trained = train(tiny_data_bin, str(save_dir), "dense_fconv_iwslt_de_en", *TINY_FCONV, "--no-dense-decoder",
                    "--residual-dim", "8")
    return saved_without_config_field(trained, "residual_dim", save_dir / "old.pt")


def test_a_narrow_residual_side_is_refused_naming_the_override(narrow_residual_decoder_checkpoint):
    with pytest.raises(ValueError) as error:
        checkpoint_utils.load_model_ensemble([narrow_residual_decoder_checkpoint])
    message = str(error.value)
    assert message.startswith("--residual-dim 256: the checkpoint's residual decoder has layers of width 8, "
                              "this model's 256")
    assert message.endswith("--model-overrides \"{'residual_dim': 8}\"") and "\n" not in message


@pytest.mark.parametrize("residual_dim", [8, None])  # the width named, or the layer sizes
def test_a_narrow_residual_side_loads_with_the_override(narrow_residual_decoder_checkpoint, residual_dim):
    models, _ = checkpoint_utils.load_model_ensemble([narrow_residual_decoder_checkpoint],
                                                     arg_overrides={"residual_dim": residual_dim})
    saved = torch.load(narrow_residual_decoder_checkpoint)["model"]
    assert all(torch.equal(saved[key], value) for key, value in models[0].state_dict().items())


def test_a_residual_encoder_of_another_width_is_refused_naming_the_width():
    from model_building import build_model

    old = build_model("dense_fconv_iwslt_de_en", *TINY_FCONV, "--no-dense-encoder", "--residual-dim", "8")
    new = build_model("dense_fconv_iwslt_de_en", *TINY_FCONV, "--no-dense-encoder")
    with pytest.raises(ValueError, match=r"residual encoder has layers of width 8, .*\{'residual_dim': 8\}"):
        new.load_state_dict(old.state_dict())
