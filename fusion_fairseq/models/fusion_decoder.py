"""Transformer decoder with the fusion points of the plugin (see :class:`FusionTransformerDecoder`)."""

from typing import Any, Dict, List, Optional, Tuple

from torch import Tensor
from fairseq.models.transformer import TransformerDecoder

from fusion_fairseq.modules import LayerAttention, LayerFusion, SurfaceFusion
from fusion_fairseq.modules.layer_aggregation import PlainStack

from .fusion_encoder import stack_with_normalised_top
from .layer_stack import run_layer

IncrementalState = Dict[str, Dict[str, Optional[Tensor]]]


class FusionTransformerDecoder(TransformerDecoder):
    """fairseq's Transformer decoder, plus (the first two combine the states of one position, so
    incremental decoding stays exact):

    ``aggregation``: the wiring of the layer stack (see the encoder).

    ``output_fusion``: prediction reads phi(z0_j, ..., zL_j) (MLRF Eq. 3); with self-attention fusion
    ``extra["fusion_attn"]`` holds the hop-by-layer weights ``(batch, tgt_len, nhop, layers)``.

    ``layer_attention``: decoder layer m attends to its own memory S_m instead of X_N, built at the
    first decoding step only (fairseq's encoder-decoder attention then caches its keys and values).

    ``surface_fusion``: the output is the fused log-score Phi over the vocabulary, which
    :meth:`get_normalized_probs` returns as is, for the criterion and the generator.
    """

    def __init__(self, args, dictionary, embed_tokens, output_fusion: Optional[LayerFusion] = None,
                 layer_attention: Optional[LayerAttention] = None, surface_fusion: Optional[SurfaceFusion] = None,
                 aggregation: Optional[PlainStack] = None, no_encoder_attn=False, output_projection=None):
        super().__init__(args, dictionary, embed_tokens, no_encoder_attn, output_projection)
        self.output_fusion = output_fusion
        self.layer_attention = layer_attention
        self.surface_fusion = surface_fusion
        self.aggregation = aggregation if aggregation is not None else PlainStack(len(self.layers))

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
        self_attn_padding_mask: Optional[Tensor] = None
        if self.cross_self_attention or prev_output_tokens.eq(self.padding_idx).any():
            self_attn_padding_mask = prev_output_tokens.eq(self.padding_idx)
        alignment: Dict[str, Tensor] = {}

        def apply_layer(index: int, layer_input: Tensor, states: List[Tensor]) -> Tensor:
            self_attn_mask = None
            if incremental_state is None and not full_context_alignment:
                self_attn_mask = self.buffered_future_mask(layer_input)
            output, layer_attn, _ = self.run_layer(
                index, states, layer_input, top_memory if memories is None else memories[index],
                memory_padding_mask, incremental_state, self_attn_mask=self_attn_mask,
                self_attn_padding_mask=self_attn_padding_mask, need_attn=bool(index == alignment_layer),
                need_head_weights=bool(index == alignment_layer))
            if layer_attn is not None and index == alignment_layer:
                alignment["attn"] = layer_attn.float().to(output)
            return output

        x, inner_states = self.run_stack(x, apply_layer)
        attn = alignment.get("attn")  # averaged over its heads
        if attn is not None:
            attn = (attn[:alignment_heads] if alignment_heads is not None else attn).mean(dim=0)
        extra = {"attn": [attn], "inner_states": inner_states}
        if self.output_fusion is not None:
            top = self.layer_norm(inner_states[-1]) if self.layer_norm is not None else inner_states[-1]
            x, weights = self.output_fusion(stack_with_normalised_top(inner_states, top), need_weights=True)
            extra["fusion_attn"] = None if weights is None else weights.transpose(0, 1)
        elif self.layer_norm is not None:
            x = self.layer_norm(x)
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
        reads the top encoder output, or when the layers' projected keys/values are cached
        already (incremental decoding after the first step: the memories would be unused)."""
        if self.layer_attention is None or encoder_out is None:
            return None
        cache = {} if incremental_state is None else self.layers[0].encoder_attn._get_input_buffer(incremental_state)
        if "prev_key" in cache:
            return None
        word_embeddings = encoder_out["encoder_embedding"][0].transpose(0, 1)  # X_0: no positions
        layer_outputs = stack_with_normalised_top(encoder_out["encoder_states"], encoder_out["encoder_out"][0])[1:]
        return self.layer_attention([word_embeddings] + layer_outputs)
