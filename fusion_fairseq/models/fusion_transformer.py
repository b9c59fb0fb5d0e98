"""The composable layer-fusion Transformer (``--arch fusion_transformer`` and the paper presets).

A subclass of fairseq's ``TransformerModel`` whose encoder and decoder expose their whole layer stack;
fusion plugs in where the stack is read: the encoder's output (MLRF ``--fuse-encoder``), each decoder
layer's source memory (``--layer-attention``, Liu et al. 2021), the decoder's output (MLRF
``--fuse-decoder``), the output distribution (``--surface-fusion``, Liu et al. 2021), and the wiring of
the stacks (``--aggregate-*``, DenseFormer, hyper-connections, MUDDFormer). Any combination the maths allows can be
set at once; combinations that define the same thing twice are refused (``fusion_config.check_fusion_args``).
"""

import argparse
import functools
from typing import Optional

from torch import nn
from fairseq.models import ARCH_CONFIG_REGISTRY
from fairseq.models.transformer import TransformerModel, base_architecture, transformer_iwslt_de_en
from fairseq.models.transformer import transformer_vaswani_wmt_en_de_big

from fusion_fairseq.checkpoint_safety import require_literal_transformer_config
from fusion_fairseq.modules import LayerAttention, SurfaceFusion, build_layer_fusion
from fusion_fairseq.modules.depth_weighted_average import DepthWeightedAverage
from fusion_fairseq.modules.hyper_connection import HyperConnectedStack
from fusion_fairseq.modules.layer_aggregation import build_layer_aggregation
from fusion_fairseq.modules.multiway_dense_connection import MultiwayDynamicDense
from fusion_fairseq.registry import register_model, register_model_architecture

from fusion_fairseq.config_fields import FlagsOfConfig, as_namespace, set_defaults
from .fusion_config import FusionTransformerConfig, check_fusion_args, fill_fusion_defaults, idle_fusion_flags
from .fusion_stacks import BuildLayer, FusionTransformerDecoder, FusionTransformerEncoder
from .hyper_connected_layers import HyperConnectedDecoderLayer, HyperConnectedEncoderLayer
from .multi_layer_attention_layers import build_multi_layer_attention_layer
from .multiway_dense_layers import build_multiway_layer
from fusion_fairseq.errors import ConfigurationError

# Parameter-name fragments that exist only in fusion modules: a vanilla fairseq transformer has
# none of them, and every other parameter of this model has the vanilla model's name.
FUSION_PARAMETER_MARKERS = ("output_fusion.", "aggregation.", "layer_attention.", "surface_fusion.",
                            "self_attn.lower_attentions.", "self_attn.aggregate.", "hyper_connections.")


def is_fusion_parameter(name: str) -> bool:
    return any(marker in name for marker in FUSION_PARAMETER_MARKERS)


def build_shared_layer_embedding(args) -> Optional[nn.Embedding]:
    """The layer embedding E of MLRF Eq. 4, one table for encoder and decoder ("we use a shared layer embedding
    for the encoder and the decoder"), initialised from U(-0.1, 0.1) (Sec. 4.2). Rows cover h0..hL of the
    deepest side that uses self-attention or FNN fusion (Table 4 ablates the layer embedding for Enc-FNN)."""
    sides = [side for side in ("encoder", "decoder") if getattr(args, f"fuse_{side}") in ("sa", "fnn")]
    if not sides or args.fusion_no_layer_embedding:
        return None
    rows = max(getattr(args, f"{side}_layers") for side in sides) + 1
    embedding = nn.Embedding(rows, getattr(args, f"{sides[0]}_embed_dim"))
    nn.init.uniform_(embedding.weight, -0.1, 0.1)
    return embedding


def side_widths(args, side: str):
    return tuple(getattr(args, f"{side}_{name}") for name in ("layers", "embed_dim", "ffn_embed_dim", "attention_heads"))


def build_side_fusion(args, side: str, layer_embedding: Optional[nn.Embedding]):
    layers, embed_dim, _, _ = side_widths(args, side)
    return build_layer_fusion(
        getattr(args, f"fuse_{side}"), layers, embed_dim, args.fusion_attn_dim, args.fusion_ffn_dim, args.fusion_hops,
        not args.fusion_no_embedding_layer, layer_embedding, args.fusion_independent_w1, not args.fusion_no_layernorm,
        args.fusion_dropout)


def build_side_aggregation(args, side: str):
    """The wiring of one side's stack: Dou et al.'s aggregation, DenseFormer's averages, the
    streams of hyper-connections or MUDDFormer's ways (at most one of them, see ``fusion_config``)."""
    layers, embed_dim, ffn_dim, heads = side_widths(args, side)
    if getattr(args, f"denseformer_{side}"):
        return DepthWeightedAverage(layers, args.denseformer_dilation, args.denseformer_period)
    if getattr(args, f"mudd_{side}"):
        return MultiwayDynamicDense(layers, embed_dim, args.mudd_variant)
    if getattr(args, f"hyper_connections_{side}") != "none":
        return HyperConnectedStack(layers, args.hyper_connections_rate)
    return build_layer_aggregation(getattr(args, f"aggregate_{side}"), layers, embed_dim, ffn_dim, args.aggregation_fn,
                                   args.aggregation_residual, heads, args.dense_connection, args.dropout)


def build_side_layer(args, side: str) -> Optional[BuildLayer]:
    """How one side builds its layers when they are not fairseq's own: MUDDFormer's block B', a
    hyper-connected layer, or a layer with multi-layer attention (Dou et al. Eq. 8) from layer k + 1
    on; ``fusion_config`` allows one of them per side."""
    decoder = side == "decoder"
    if getattr(args, f"mudd_{side}"):
        return functools.partial(build_multiway_layer, decoder=decoder)
    kind = getattr(args, f"hyper_connections_{side}")
    if kind != "none":
        return functools.partial(
            HyperConnectedDecoderLayer if decoder else HyperConnectedEncoderLayer, kind=kind,
            rate=args.hyper_connections_rate, sinkhorn_order=args.hyper_connections_sinkhorn_order,
            rescale_outputs=not args.hyper_connections_no_output_rescale,
            decay_static=args.hyper_connections_decay_static)
    if args.multi_layer_attention > 1:
        return functools.partial(
            build_multi_layer_attention_layer, decoder=decoder, num_attended=args.multi_layer_attention,
            aggregation_function=args.aggregation_fn, aggregation_residual=args.aggregation_residual)
    return None


def build_layer_attention(args) -> Optional[LayerAttention]:
    if args.layer_attention == "none":
        return None
    attention = LayerAttention(args.decoder_layers, args.encoder_layers, args.encoder_embed_dim, args.layer_attention,
                               dropconnect=args.layer_attention_dropconnect, embedding_dropout=args.dropout)
    attention.mask_layer(args.mask_encoder_layer)
    return attention


def build_surface_fusion(args) -> Optional[SurfaceFusion]:
    if args.surface_fusion == "none":
        return None
    return SurfaceFusion(
        args.surface_fusion, args.decoder_embed_dim, args.decoder_attention_heads, args.surface_fusion_lambda,
        args.surface_fusion_tau, dropout=args.attention_dropout, variant=args.surface_fusion_variant,
        ffn_dim=args.decoder_ffn_embed_dim, embedding_dropout=args.dropout,
        activation_dropout=args.activation_dropout or getattr(args, "relu_dropout", 0.0))


def build_token_embeddings(model_class, args, task, encoder_dim: int, decoder_dim: int,
                           encoder_path: Optional[str] = None, decoder_path: Optional[str] = None):
    """Source and target embeddings, one table under ``--share-all-embeddings`` or ``--merge-src-tgt-embed`` as in
    fairseq (the latter extends the task's source dictionary by the target's and gives both sides the result)."""
    src_dict, tgt_dict = task.source_dictionary, task.target_dictionary
    shared = "--share-all-embeddings" if args.share_all_embeddings else (
        "--merge-src-tgt-embed" if getattr(args, "merge_src_tgt_embed", False) else None)
    if shared is None:
        return (model_class.build_embedding(args, src_dict, encoder_dim, encoder_path),
                model_class.build_embedding(args, tgt_dict, decoder_dim, decoder_path))
    if args.share_all_embeddings and src_dict != tgt_dict:
        raise ConfigurationError("--share-all-embeddings requires a joined dictionary (fairseq-preprocess --joined-dictionary)")
    if args.encoder_embed_dim != args.decoder_embed_dim:
        raise ConfigurationError(f"{shared} requires --encoder-embed-dim ({args.encoder_embed_dim}) "
                                 f"== --decoder-embed-dim ({args.decoder_embed_dim})")
    if not args.share_all_embeddings:
        src_dict.update(tgt_dict)
        task.src_dict = task.tgt_dict = src_dict
    args.share_decoder_input_output_embed = True
    encoder_embed = model_class.build_embedding(args, src_dict, encoder_dim, encoder_path)
    return encoder_embed, encoder_embed


def architecture_values(args, names) -> dict:
    """{name: the value the architecture of ``args`` gives it where the user sets none} for ``names``: a preset's
    own value, or the default derived from the other flags, so that neither is taken for the user's."""
    unset = argparse.Namespace(**{name: value for name, value in vars(args).items() if name not in names})
    arch = getattr(args, "arch", None) or getattr(args, "_name", None)
    ARCH_CONFIG_REGISTRY.get(arch, fusion_transformer)(unset)
    return {name: getattr(unset, name) for name in names}


@register_model("fusion_transformer", dataclass=FusionTransformerConfig)
class FusionTransformerModel(FlagsOfConfig, TransformerModel):
    """fairseq's Transformer with layer-fusion strategies wired from flags."""

    @classmethod
    def build_model(cls, args, task):
        args = as_namespace(args)
        fusion_transformer(args)
        check_fusion_args(args, architecture_values(args, idle_fusion_flags(args)))
        require_literal_transformer_config(args)  # before fairseq's layers eval() them
        encoder_embed_tokens, decoder_embed_tokens = build_token_embeddings(
            cls, args, task, args.encoder_embed_dim, args.decoder_embed_dim, args.encoder_embed_path,
            args.decoder_embed_path)
        layer_embedding = build_shared_layer_embedding(args)
        # each part built where it is passed: this order fixes every parameter's random start (golden outputs)
        encoder = FusionTransformerEncoder(
            args, task.source_dictionary, encoder_embed_tokens, build_side_fusion(args, "encoder", layer_embedding),
            keep_layer_states=args.layer_attention != "none", aggregation=build_side_aggregation(args, "encoder"),
            build_layer=build_side_layer(args, "encoder"))
        decoder = FusionTransformerDecoder(
            args, task.target_dictionary, decoder_embed_tokens, build_side_fusion(args, "decoder", layer_embedding),
            layer_attention=build_layer_attention(args), surface_fusion=build_surface_fusion(args),
            aggregation=build_side_aggregation(args, "decoder"), no_encoder_attn=getattr(args, "no_cross_attention", False),
            build_layer=build_side_layer(args, "decoder"))
        return cls(args, encoder, decoder)

    def forward(self, src_tokens, src_lengths, prev_output_tokens, return_all_hiddens: bool = True,
                features_only: bool = False, alignment_layer=None, alignment_heads=None):
        """fairseq's forward; the decoder's ``extra`` also carries the encoder's layer stack
        (``encoder_states``: h0..hL, ``src_len x batch x C``; ``encoder_padding_mask``) so that a
        criterion can regularise every layer without a second forward pass."""
        encoder_out = self.encoder(src_tokens, src_lengths=src_lengths, return_all_hiddens=return_all_hiddens)
        decoder_out = self.decoder(prev_output_tokens, encoder_out=encoder_out, features_only=features_only,
                                   alignment_layer=alignment_layer, alignment_heads=alignment_heads,
                                   src_lengths=src_lengths, return_all_hiddens=return_all_hiddens)
        decoder_out[1].update({name: encoder_out[name] for name in ("encoder_states", "encoder_padding_mask")})
        return decoder_out

    @staticmethod
    def parameter_starts_fresh(name: str) -> bool:
        """True for a parameter that a vanilla fairseq transformer lacks: fine-tuning from one
        (``--finetune-from-model``, as Dou et al. 2018 do) loads every other parameter and starts these
        fresh (``checkpoint_safety.start_missing_parameters_fresh``); every other load is strict. In code,
        ``model.load_state_dict(vanilla_state, strict=False)`` does the same."""
        return is_fusion_parameter(name)


@register_model_architecture("fusion_transformer", "fusion_transformer")
def fusion_transformer(args):
    """fairseq's base Transformer dimensions (6+6 layers, d=512, FFN 2048, 8 heads)."""
    base_architecture(args)
    fill_fusion_defaults(args)


@register_model_architecture("fusion_transformer", "muddformer")
def muddformer(args):
    """MUDDFormer (Xiao et al., ICML 2025) on both sides of fairseq's base Transformer (6+6 layers,
    d=512, FFN 2048, 8 heads), pre-norm as the paper's block (Eq. 7)."""
    set_defaults(args, mudd_encoder=True, mudd_decoder=True, encoder_normalize_before=True,
                 decoder_normalize_before=True)
    fusion_transformer(args)


@register_model_architecture("fusion_transformer", "mlrf_iwslt_de_en")
def mlrf_iwslt_de_en(args):
    """MLRF's German-English setting (Sec. 4.2): 3+3 layers, d=256, FFN 1024, da=1024, df=512,
    dropout 0.1, and the best system of Table 2, Both-FNN-SA with 4 hops.
    Reading: the paper gives no head count; 4 heads, as fairseq's IWSLT transformer."""
    set_defaults(args, encoder_layers=3, decoder_layers=3, encoder_embed_dim=256, decoder_embed_dim=256,
                 fuse_encoder="fnn", fuse_decoder="sa", fusion_attn_dim=1024, fusion_ffn_dim=512)
    transformer_iwslt_de_en(args)
    fusion_transformer(args)


@register_model_architecture("fusion_transformer", "mlrf_nist_zh_en")
def mlrf_nist_zh_en(args):
    """MLRF's Chinese-English setting (Sec. 4.2): 6+6 layers, d=512, FFN 2048, with the best
    system of Table 3, Dec-SA (4 hops) + independent W1.
    Paper: Sec. 4.2 gives da = 1024 and df = 512 for the German-English setting (d = 256) only.
    Reading: the IWSLT ratios carried over to d = 512, da = 4d = 2048 and df = 2d = 1024 (the
    defaults of :class:`FusionTransformerConfig`), and fairseq's 8 heads; Table 3 prints no parameter
    counts to check them against."""
    set_defaults(args, fuse_encoder="none", fuse_decoder="sa", fusion_independent_w1=True)
    fusion_transformer(args)


@register_model_architecture("fusion_transformer", "surface_fusion_wmt_en_ro")
def surface_fusion_wmt_en_ro(args):
    """Liu et al. (2021) Ro-En (Appendix Table 4): Transformer base, dropout 0.3, hard
    SurfaceFusion with lambda 0.8 and tau 1 (tau 5 when --surface-fusion soft, as in Sec. 4.1)."""
    set_defaults(args, dropout=0.3, surface_fusion="hard", surface_fusion_lambda=0.8)
    fusion_transformer(args)


@register_model_architecture("fusion_transformer", "surface_fusion_wmt_en_de_big")
def surface_fusion_wmt_en_de_big(args):
    """Liu et al. (2021) En-De (Appendix Table 4): Transformer big, dropout 0.3, hard
    SurfaceFusion with lambda 0.9 and tau 1."""
    transformer_vaswani_wmt_en_de_big(args)
    set_defaults(args, surface_fusion="hard", surface_fusion_lambda=0.9)
    fusion_transformer(args)


@register_model_architecture("fusion_transformer", "fgla_wmt_en_ro")
def fgla_wmt_en_ro(args):
    """Liu et al. (2021) fine-grained layer attention (FGLA) on Ro-En: Transformer base,
    dropout 0.3, DropConnect 0.3 on the layer-attention weights."""
    set_defaults(args, dropout=0.3, layer_attention="fine", layer_attention_dropconnect=0.3)
    fusion_transformer(args)


@register_model_architecture("fusion_transformer", "deeprep_transformer_wmt_en_de")
def deeprep_transformer_wmt_en_de(args):
    """Dou et al. (2018) final system (Table 2 "+ Deep Representations"): Transformer-Base with
    hierarchical aggregation on encoder and decoder (train with the layer-diversity criterion,
    ``--criterion label_smoothed_cross_entropy_with_layer_diversity --diversity-lambda 1.0``)."""
    set_defaults(args, aggregate_encoder="hierarchical", aggregate_decoder="hierarchical")
    fusion_transformer(args)


@register_model_architecture("fusion_transformer", "deeprep_transformer_wmt_en_de_big")
def deeprep_transformer_wmt_en_de_big(args):
    """As ``deeprep_transformer_wmt_en_de`` on Transformer-Big (d=1024, FFN 4096, 16 heads, dropout 0.3)."""
    transformer_vaswani_wmt_en_de_big(args)
    deeprep_transformer_wmt_en_de(args)
