"""fairseq's Transformer encoder and decoder, exposing their layer stacks to the fusion points of the plugin
(see :class:`FusionTransformerEncoder` and :class:`FusionTransformerDecoder`)."""

from typing import Any, Callable, Dict, List, Optional, Tuple

import torch
from torch import Tensor, nn
from fairseq.distributed import fsdp_wrap
from fairseq.models.transformer import TransformerConfig, TransformerDecoder, TransformerEncoder
from fairseq.modules.checkpoint_activations import checkpoint_wrapper

from fusion_fairseq.modules import LayerAttention, LayerFusion, SurfaceFusion
from fusion_fairseq.modules.layer_aggregation import PlainStack

from .multi_layer_attention_layers import MultiLayerAttentionSublayers

IncrementalState = Dict[str, Dict[str, Optional[Tensor]]]
#: ``build_layer(cfg, index)`` (the decoder's: ``build_layer(cfg, index, no_encoder_attn)``): layer ``index``
#: of a stack whose layers are not fairseq's own (``fusion_transformer.build_side_layer``)
BuildLayer = Callable[..., nn.Module]


def wrapped_like_fairseq(layer: nn.Module, cfg) -> nn.Module:
    """``layer`` under fairseq's activation checkpointing (unless it checkpoints itself) and FSDP
    wrapping, as fairseq's layer builders do."""
    if cfg.checkpoint_activations and not getattr(layer, "checkpoints_itself", False):
        layer = checkpoint_wrapper(layer, offload_to_cpu=cfg.offload_activations)
    return fsdp_wrap(layer, min_num_params=0 if cfg.checkpoint_activations else cfg.min_params_to_wrap)


def run_layer(layer: nn.Module, states: List[Tensor], *args, **kwargs):
    """``layer(*args, **kwargs)``; a layer with multi-layer attention also reads the stack's states
    [H^0, ..., H^{l-1}] up to its input."""
    if isinstance(layer, MultiLayerAttentionSublayers):
        return layer(*args, lower_states=states, **kwargs)
    return layer(*args, **kwargs)


def fused_output(stack, top: Tensor, states: List[Tensor], need_weights: bool):
    """fairseq's final LayerNorm on the output ``top`` of the stack [h0, ..., hL], then ``stack.output_fusion``
    (if any) over [h0, ..., hL] with hL that normalised output: in a pre-norm stack fairseq's final LayerNorm
    follows the last layer's raw output, which fairseq records. Returns (output, fusion weights or None)."""
    if stack.layer_norm is not None:
        top = stack.layer_norm(top)
    if stack.output_fusion is None:
        return top, None
    return stack.output_fusion(states[:-1] + [top], need_weights=need_weights)


class FusionTransformerEncoder(TransformerEncoder):
    """fairseq's Transformer encoder, plus ``aggregation``, the wiring of the layer stack (Dou et al.
    2018, DenseFormer, hyper-connections, MUDDFormer; :class:`PlainStack` is fairseq's own);
    ``build_layer``: the stack's layers when they are not fairseq's (:data:`BuildLayer`: MUDDFormer's
    block, hyper-connected layers, multi-layer attention); ``output_fusion``: the
    memory for the decoder is phi(h0, ..., hL) (MLRF Fig. 1b); ``keep_layer_states``: always return
    every layer's output (``encoder_states``, which layer attention reads)."""

    def __init__(self, args, dictionary, embed_tokens, output_fusion: Optional[LayerFusion] = None,
                 keep_layer_states: bool = False, aggregation: Optional[PlainStack] = None,
                 build_layer: Optional[BuildLayer] = None):
        self.build_layer, self.layers_built = build_layer, 0  # read by build_encoder_layer, in fairseq's __init__
        super().__init__(args, dictionary, embed_tokens)
        self.output_fusion = output_fusion
        self.keep_layer_states = keep_layer_states
        self.aggregation = aggregation if aggregation is not None else PlainStack(len(self.layers))

    def build_encoder_layer(self, args):
        """fairseq's layer, or ``build_layer``'s; fairseq builds them in order."""
        if self.build_layer is None:
            return super().build_encoder_layer(args)
        cfg = TransformerConfig.from_namespace(args)
        index, self.layers_built = self.layers_built, self.layers_built + 1
        return wrapped_like_fairseq(self.build_layer(cfg, index), cfg)

    def forward_scriptable(self, src_tokens, src_lengths: Optional[Tensor] = None, return_all_hiddens: bool = False,
                           token_embeddings: Optional[Tensor] = None, fusion_weights: bool = False):
        """fairseq's encoder, with the layer stack wired by ``self.aggregation`` and its output fused by
        ``self.output_fusion``; ``fusion_weights``: also return the weights of self-attention fusion."""
        padding_mask = src_tokens.eq(self.padding_idx)
        layer_padding_mask = padding_mask if padding_mask.any() else None
        x, encoder_embedding = self.forward_embedding(src_tokens, token_embeddings)
        if layer_padding_mask is not None:
            x = x * (1 - padding_mask.unsqueeze(-1).type_as(x))

        def apply_layer(index: int, layer_input: Tensor, states: List[Tensor]) -> Tensor:
            return run_layer(self.layers[index], states, layer_input, encoder_padding_mask=layer_padding_mask)

        top, states = self.aggregation.run(x.transpose(0, 1), apply_layer)
        top, weights = fused_output(self, top, states, fusion_weights)
        out = {
            "encoder_out": [top],  # T x B x C
            "encoder_padding_mask": [padding_mask],  # B x T
            "encoder_embedding": [encoder_embedding],  # B x T x C, no positions
            "encoder_states": states if return_all_hiddens or self.keep_layer_states else [],  # [h0, ..., hL]
            "fc_results": [],
            "src_tokens": [],
            "src_lengths": [src_tokens.ne(self.padding_idx).sum(dim=1, dtype=torch.int32).reshape(-1, 1)],
        }
        return {**out, "fusion_weights": weights} if fusion_weights else out

    def fusion_weights(self, src_tokens, src_lengths: Optional[Tensor] = None) -> Optional[Tensor]:
        """Hop-by-layer attention of self-attention fusion, ``(src_len, batch, nhop, layers)``, for analysis."""
        return self.forward_scriptable(src_tokens, src_lengths, fusion_weights=True)["fusion_weights"]


class FusionTransformerDecoder(TransformerDecoder):
    """fairseq's Transformer decoder, plus (the first two combine the states of one position, so
    incremental decoding stays exact):

    ``aggregation``, ``build_layer``: the wiring of the layer stack and its layers (see the encoder).

    ``output_fusion``: prediction reads phi(z0_j, ..., zL_j) (MLRF Eq. 3); with self-attention fusion
    ``extra["fusion_attn"]`` holds the hop-by-layer weights ``(batch, tgt_len, nhop, layers)``.

    ``layer_attention``: decoder layer m attends to its own memory S_m instead of X_N, built at the
    first decoding step only (fairseq's encoder-decoder attention then caches its keys and values).

    ``surface_fusion``: the output is the fused log-score Phi over the vocabulary, which
    :meth:`get_normalized_probs` returns as is, for the criterion and the generator.
    """

    def __init__(self, args, dictionary, embed_tokens, output_fusion: Optional[LayerFusion] = None,
                 layer_attention: Optional[LayerAttention] = None, surface_fusion: Optional[SurfaceFusion] = None,
                 aggregation: Optional[PlainStack] = None, no_encoder_attn=False, output_projection=None,
                 build_layer: Optional[BuildLayer] = None):
        self.build_layer, self.layers_built = build_layer, 0  # read by build_decoder_layer, in fairseq's __init__
        super().__init__(args, dictionary, embed_tokens, no_encoder_attn, output_projection)
        self.output_fusion = output_fusion
        self.layer_attention = layer_attention
        self.surface_fusion = surface_fusion
        self.aggregation = aggregation if aggregation is not None else PlainStack(len(self.layers))

    def build_decoder_layer(self, args, no_encoder_attn=False):
        """fairseq's layer, or ``build_layer``'s; fairseq builds them in order."""
        if self.build_layer is None:
            return super().build_decoder_layer(args, no_encoder_attn)
        cfg = TransformerConfig.from_namespace(args)
        index, self.layers_built = self.layers_built, self.layers_built + 1
        return wrapped_like_fairseq(self.build_layer(cfg, index, no_encoder_attn), cfg)

    def forward(self, prev_output_tokens, encoder_out: Optional[Dict[str, List[Tensor]]] = None,
                incremental_state: Optional[IncrementalState] = None, features_only: bool = False,
                src_lengths: Optional[Any] = None, return_all_hiddens: bool = False, **alignment):
        """fairseq's; ``alignment``: ``full_context_alignment``, ``alignment_layer``, ``alignment_heads``."""
        features, extra = self.extract_features(prev_output_tokens, encoder_out, incremental_state, **alignment)
        if features_only:
            return features, extra
        if self.surface_fusion is None:
            return self.output_layer(features), extra
        return self.surface_fusion(features, encoder_out, self.output_layer, incremental_state), extra

    def get_normalized_probs(self, net_output, log_probs: bool, sample: Optional[Dict[str, Tensor]] = None):
        if self.surface_fusion is None:
            return super().get_normalized_probs(net_output, log_probs, sample)
        fused_log_scores = net_output[0].float()
        return fused_log_scores if log_probs else fused_log_scores.exp()

    def extract_features_scriptable(self, prev_output_tokens, encoder_out: Optional[Dict[str, List[Tensor]]],
                                    incremental_state: Optional[IncrementalState] = None,
                                    full_context_alignment: bool = False, alignment_layer: Optional[int] = None,
                                    alignment_heads: Optional[int] = None):
        """fairseq's decoder stack, wired by ``self.aggregation``, with a source memory chosen per
        layer (:meth:`layer_memories`), its output fused by ``self.output_fusion``."""
        if alignment_layer is None:
            alignment_layer = self.num_layers - 1
        top_memory = encoder_out["encoder_out"][0] if encoder_out and encoder_out["encoder_out"] else None
        memory_padding_mask = (encoder_out["encoder_padding_mask"][0]
                               if encoder_out and encoder_out["encoder_padding_mask"] else None)
        memories = self.layer_memories(encoder_out, incremental_state)

        positions = None  # the embeddings of the (new) target positions, as fairseq's decoder computes them
        if self.embed_positions is not None:
            positions = self.embed_positions(prev_output_tokens, incremental_state=incremental_state)
        if incremental_state is not None:
            prev_output_tokens = prev_output_tokens[:, -1:]
            if positions is not None:
                positions = positions[:, -1:]
        prev_output_tokens = prev_output_tokens.contiguous()
        x = self.embed_scale * self.embed_tokens(prev_output_tokens)
        if self.quant_noise is not None:
            x = self.quant_noise(x)
        if self.project_in_dim is not None:
            x = self.project_in_dim(x)
        if positions is not None:
            x += positions
        if self.layernorm_embedding is not None:
            x = self.layernorm_embedding(x)
        x = self.dropout_module(x).transpose(0, 1)
        pads = prev_output_tokens.eq(self.padding_idx)
        self_attn_padding_mask = pads if self.cross_self_attention or pads.any() else None
        alignment: Dict[str, Tensor] = {}

        def apply_layer(index: int, layer_input: Tensor, states: List[Tensor]) -> Tensor:
            causal = incremental_state is None and not full_context_alignment
            self_attn_mask = self.buffered_future_mask(layer_input) if causal else None
            output, layer_attn, _ = self.run_layer(
                index, states, layer_input, top_memory if memories is None else memories[index],
                memory_padding_mask, incremental_state, self_attn_mask=self_attn_mask,
                self_attn_padding_mask=self_attn_padding_mask, need_attn=bool(index == alignment_layer),
                need_head_weights=bool(index == alignment_layer))
            if layer_attn is not None and index == alignment_layer:  # averaged over its first alignment_heads
                attn = layer_attn.float().to(output)
                alignment["attn"] = (attn if alignment_heads is None else attn[:alignment_heads]).mean(dim=0)
            return output

        x, inner_states = self.run_stack(x, apply_layer)
        extra = {"attn": [alignment.get("attn")], "inner_states": inner_states}
        x, weights = fused_output(self, x, inner_states, need_weights=True)  # x is hL: no aggregation beside fusion
        if self.output_fusion is not None:
            extra["fusion_attn"] = None if weights is None else weights.transpose(0, 1)
        x = x.transpose(0, 1)  # T x B x C -> B x T x C
        if self.project_out_dim is not None:
            x = self.project_out_dim(x)
        return x, extra

    def run_stack(self, x: Tensor, apply_layer) -> Tuple[Tensor, List[Tensor]]:
        """The stack's output and its states [H^0, ..., H^L]; ``apply_layer(index, layer_input, states)``."""
        return self.aggregation.run(x, apply_layer)

    def run_layer(self, index: int, states: List[Tensor], *args, **kwargs):
        return run_layer(self.layers[index], states, *args, **kwargs)

    def layer_memories(self, encoder_out: Optional[Dict[str, List[Tensor]]],
                       incremental_state: Optional[IncrementalState]) -> Optional[Tensor]:
        """S_1..S_M ``(M, src_len, batch, C)`` from layer attention, or ``None`` when every layer
        reads the top encoder output, or after the first step of incremental decoding, whose source
        attention caches the layers' projected keys and values (the memories would be unused)."""
        if self.layer_attention is None or encoder_out is None:
            return None
        if incremental_state is not None:
            if self.get_incremental_state(incremental_state, "layer_memories") is not None:
                return None
            self.set_incremental_state(incremental_state, "layer_memories", {})  # read by the steps after this one
        word_embeddings = encoder_out["encoder_embedding"][0].transpose(0, 1)  # X_0: no positions
        layer_outputs = encoder_out["encoder_states"][1:-1] + encoder_out["encoder_out"]  # X_N: the normalised output
        return self.layer_attention([word_embeddings] + layer_outputs)
