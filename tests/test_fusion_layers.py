"""Layer-level methods of ``fusion_transformer`` (hyper-connections, multi-layer attention, MUDDFormer)
are layer classes, built through fairseq's ``build_encoder_layer`` / ``build_decoder_layer``: no
built layer is altered afterwards, and their parameters keep the names trained checkpoints hold."""

import pytest
from fairseq.modules.transformer_layer import TransformerDecoderLayerBase, TransformerEncoderLayerBase

from fusion_fairseq.models.hyper_connected_layers import HyperConnectedDecoderLayer, HyperConnectedEncoderLayer
from fusion_fairseq.models.multi_layer_attention_layers import (
    MultiLayerAttentionDecoderLayer,
    MultiLayerAttentionEncoderLayer,
)
from fusion_fairseq.models.multiway_dense_layers import MultiwayDecoderLayer, MultiwayEncoderLayer
from model_building import build_model
from conftest import TINY_MLRF_FLAGS

TINY = TINY_MLRF_FLAGS[:16]  # 2+2 layers, d=16, no fusion flags
FOUR_LAYERS = ("--encoder-layers", "4", "--decoder-layers", "4")
FAIRSEQ = (TransformerEncoderLayerBase, TransformerDecoderLayerBase)
HYPER = (HyperConnectedEncoderLayer, HyperConnectedDecoderLayer)
MULTI_LAYER = (MultiLayerAttentionEncoderLayer, MultiLayerAttentionDecoderLayer)


@pytest.mark.parametrize("flags,classes", [
    ((), [FAIRSEQ] * 2),
    (("--hyper-connections-encoder", "static", "--hyper-connections-decoder", "dynamic"), [HYPER] * 2),
    (("--hyper-connections-decoder", "manifold"), [(TransformerEncoderLayerBase, HyperConnectedDecoderLayer)] * 2),
    ((*FOUR_LAYERS, "--multi-layer-attention", "2"), [FAIRSEQ] * 2 + [MULTI_LAYER] * 2),
    ((*FOUR_LAYERS, "--multi-layer-attention", "3", "--checkpoint-activations"), [FAIRSEQ] * 3 + [MULTI_LAYER]),
    (("--mudd-encoder", "--mudd-decoder"), [(MultiwayEncoderLayer, MultiwayDecoderLayer)] * 2),
], ids=["transformer", "hyper-connections", "mhc-decoder", "multi-layer-attention", "mla+checkpointing", "mudd"])
def test_each_layer_is_built_as_its_class(flags, classes):
    model = build_model("fusion_transformer", *TINY, *flags)
    assert [(type(a), type(b)) for a, b in zip(model.encoder.layers, model.decoder.layers)] == classes
    fairseq_checkpointed = "--checkpoint-activations" in flags  # fairseq's wrapper replaces forward of its own layers
    for name, module in model.named_modules():
        if not (fairseq_checkpointed and type(module) in FAIRSEQ):
            assert "forward" not in vars(module), f"{name}: forward replaced after the module was built"


def test_multi_layer_attention_layers_checkpoint_themselves():
    """fairseq's checkpoint wrapper would re-run them without the lower layers' states: they are not wrapped."""
    model = build_model("fusion_transformer", *TINY, *FOUR_LAYERS, "--multi-layer-attention", "2",
                        "--offload-activations")
    layers = list(model.encoder.layers) + list(model.decoder.layers)
    assert [hasattr(layer, "precheckpoint_forward") for layer in layers] == [True, True, False, False] * 2
    assert {layer.checkpointing for layer in layers if isinstance(layer, MULTI_LAYER)} == {(True, True)}


def layer_parameter_names(model, prefix):
    return [name[len(prefix):] for name, _ in model.named_parameters() if name.startswith(prefix)]


PROJECTIONS = [f"{p}_proj.{t}" for p in ("k", "v", "q", "out") for t in ("weight", "bias")]


def test_parameter_names_are_those_of_trained_checkpoints():
    """The names, in order (the optimizer's state follows it), of a layer's parameters, as the
    checkpoints trained so far hold them."""
    hyper = build_model("fusion_transformer", *TINY, "--hyper-connections-encoder", "dynamic")
    connection = ["static_alpha", "static_beta", "dynamic_alpha_fn", "dynamic_alpha_scale", "dynamic_beta_fn",
                  "dynamic_beta_scale", "norm.weight", "norm.bias"]
    assert layer_parameter_names(hyper, "encoder.layers.1.") == [
        *(f"self_attn.{p}" for p in PROJECTIONS), "self_attn_layer_norm.weight", "self_attn_layer_norm.bias",
        "fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias", "final_layer_norm.weight", "final_layer_norm.bias",
        *(f"hyper_connections.{i}.{name}" for i in range(2) for name in connection)]
    multi = build_model("fusion_transformer", *TINY, "--encoder-layers", "3", "--decoder-layers", "3",
                        "--multi-layer-attention", "2")
    assert layer_parameter_names(multi, "decoder.layers.2.") == [
        *(f"self_attn.{p}" for p in PROJECTIONS), *(f"self_attn.lower_attentions.0.{p}" for p in PROJECTIONS),
        *(f"self_attn.aggregate.{name}" for name in ("fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias",
                                                      "layer_norm.weight", "layer_norm.bias")),
        "self_attn_layer_norm.weight", "self_attn_layer_norm.bias", *(f"encoder_attn.{p}" for p in PROJECTIONS),
        "encoder_attn_layer_norm.weight", "encoder_attn_layer_norm.bias", "fc1.weight", "fc1.bias", "fc2.weight",
        "fc2.bias", "final_layer_norm.weight", "final_layer_norm.bias"]
