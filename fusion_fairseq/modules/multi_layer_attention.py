"""Multi-layer attention of Dou et al. (EMNLP 2018), Sec. 3.1.2, Eq. 8, Figure 3."""

from typing import Dict, List, Optional

from torch import Tensor, nn
from fairseq.modules import MultiheadAttention

from .aggregation_node import AggregationNode


class MultiLayerSelfAttention(MultiheadAttention):
    """Self-attention of layer l that also attends to the k-1 layers below its input:

        C^l_{-1} = ATT(Q^l, K^{l-1}, V^{l-1})    (this module's own attention, as in fairseq)
        C^l_{-i} = ATT(Q^l, K^{l-i}, V^{l-i})    i = 2..k, each with a separate attention model
        C^l      = AGG(C^l_{-1}, ..., C^l_{-k})  (the aggregation node of Eq. 7)

    It is a drop-in ``self_attn`` of fairseq's encoder / decoder layers (same parameter names
    for the ordinary attention, so vanilla checkpoints load into it). Those layers call
    ``self_attn(query, key, value, ...)`` with no room for further inputs, so the layer hands the
    lower layers' states over with :meth:`attend_lower_layers` right before running fairseq's
    forward (also when activation checkpointing recomputes the layer in backward, see
    ``models.multi_layer_attention_layers``).
    The separate attention models are fairseq attentions with their own incremental state: in
    incremental decoding each keeps the keys/values of the lower layer's past positions, like the
    ordinary self-attention does.
    Reading: the query of every C^l_{-i} is the layer's input (Q^l), padding and causal masks are
    those of the ordinary self-attention, and the attention function of AGG follows
    ``--aggregation-fn`` / ``--aggregation-residual``.
    """

    def __init__(self, embed_dim: int, num_heads: int, num_lower_layers: int, aggregation_hidden_dim: int,
                 dropout: float = 0.0, aggregation_function: str = "sigmoid", aggregation_residual: str = "all"):
        super().__init__(embed_dim, num_heads, dropout=dropout, self_attention=True)
        self.lower_attentions = nn.ModuleList(
            MultiheadAttention(embed_dim, num_heads, dropout=dropout) for _ in range(num_lower_layers))
        self.aggregate = AggregationNode(
            num_lower_layers + 1, embed_dim, aggregation_hidden_dim, aggregation_function, aggregation_residual,
            top_input=0, num_heads=num_heads)
        self.lower_states: Optional[List[Tensor]] = None

    def attend_lower_layers(self, states: List[Tensor]):
        """``states``: H^{l-2}, ..., H^{l-k} (nearest first), each ``T x B x C`` like the query."""
        if len(states) != len(self.lower_attentions):
            raise ValueError(f"multi-layer attention expects {len(self.lower_attentions)} lower layers, got {len(states)}")
        self.lower_states = states

    def forward(self, query: Tensor, key: Optional[Tensor], value: Optional[Tensor],
                key_padding_mask: Optional[Tensor] = None,
                incremental_state: Optional[Dict[str, Dict[str, Optional[Tensor]]]] = None,
                need_weights: bool = True, static_kv: bool = False, attn_mask: Optional[Tensor] = None,
                before_softmax: bool = False, need_head_weights: bool = False):
        if self.lower_states is None:
            raise RuntimeError("MultiLayerSelfAttention needs attend_lower_layers(states) before each call")
        lower_states, self.lower_states = self.lower_states, None
        own, weights = super().forward(query, key, value, key_padding_mask, incremental_state, need_weights,
                                       static_kv, attn_mask, before_softmax, need_head_weights)
        lower = [attention(query, state, state, key_padding_mask=key_padding_mask, incremental_state=incremental_state,
                           need_weights=False, attn_mask=attn_mask)[0]
                 for attention, state in zip(self.lower_attentions, lower_states)]
        return self.aggregate(own, *lower), weights
