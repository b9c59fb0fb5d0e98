"""One layer of the layer-wise coordination stack (He et al., NeurIPS 2018, Sec. 3, Figure 1)."""

from typing import Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from fairseq.modules.fairseq_dropout import FairseqDropout

from .mixed_attention import MixedAttention


class CoordinationLayer(nn.Module):
    """Attention and feed-forward sub-layers (residual + LayerNorm, post- or pre-norm) used by
    the source side (:meth:`encode`) and, with sharing, by the target side (:meth:`decode`) of
    the same depth.

    ``decode`` takes the projected source memory of the layer below and the projected target
    memory of earlier positions (for incremental decoding), and returns the new positions'
    projected target memory for the caller to keep.

    ``mixed=False`` is the "w/o mixed attention" ablation (Table 3): a causal self-attention
    over the target, then an attention over the source, as two sub-layers. Reading: the paper
    does not say whether the two have their own parameters; here they share this layer's one
    attention (the same projections) and its LayerNorm, so that the ablation keeps the
    parameter count of Table 3 (19.07M in every row); separate ones would add an attention
    and a LayerNorm per layer.
    """

    def __init__(self, embed_dim: int, ffn_dim: int, num_heads: int, dropout: float = 0.0,
                 attention_dropout: float = 0.0, activation_dropout: float = 0.0, normalize_before: bool = False,
                 mixed: bool = True):
        super().__init__()
        self.attention = MixedAttention(embed_dim, num_heads, attention_dropout)
        self.attention_layer_norm = nn.LayerNorm(embed_dim)
        self.fc1 = nn.Linear(embed_dim, ffn_dim)
        self.fc2 = nn.Linear(ffn_dim, embed_dim)
        self.final_layer_norm = nn.LayerNorm(embed_dim)
        self.dropout_module = FairseqDropout(dropout, module_name=type(self).__name__)
        self.activation_dropout_module = FairseqDropout(activation_dropout, module_name=type(self).__name__)
        self.normalize_before = normalize_before
        self.mixed = mixed

    def attention_input(self, x: Tensor) -> Tensor:
        """What the attention reads from a state of the layer below (normalised in pre-norm)."""
        return self.attention_layer_norm(x) if self.normalize_before else x

    def project_memory(self, x: Tensor) -> Tuple[Tensor, Tensor]:
        """Projected keys and values of the states ``x`` of the layer below."""
        memory = self.attention_input(x)
        return self.attention.project_memory(memory, memory)

    def residual(self, x: Tensor, update: Tensor, layer_norm: nn.LayerNorm) -> Tensor:
        x = x + self.dropout_module(update)
        return x if self.normalize_before else layer_norm(x)

    def feed_forward(self, x: Tensor) -> Tensor:
        h = self.final_layer_norm(x) if self.normalize_before else x
        h = self.activation_dropout_module(F.relu(self.fc1(h)))
        return self.residual(x, self.fc2(h), self.final_layer_norm)

    def encode(self, x: Tensor, allowed: Optional[Tensor]) -> Tensor:
        """Source positions attend to source positions only."""
        keys, values = self.project_memory(x)
        attended, _ = self.attention(self.attention_input(x), keys, values, allowed)
        return self.feed_forward(self.residual(x, attended, self.attention_layer_norm))

    def decode(self, x: Tensor, source_memory: Tuple[Tensor, Tensor], source_allowed: Tensor,
               past_target_memory: Optional[Tuple[Tensor, Tensor]], target_allowed: Optional[Tensor],
               need_weights: bool = False):
        """Target positions ``x`` ``(batch, new, D)``. ``source_allowed`` ``(batch, 1, 1, src)``;
        ``target_allowed`` ``(1 or batch, 1, new, past + new)`` or None (every past position:
        incremental decoding of one new position).
        Returns (output, new target memory (keys, values) of these positions, weights or None)."""
        new_keys, new_values = self.project_memory(x)
        target_keys, target_values = new_keys, new_values
        if past_target_memory is not None:
            target_keys = torch.cat([past_target_memory[0], new_keys], dim=2)
            target_values = torch.cat([past_target_memory[1], new_values], dim=2)
        if target_allowed is None:
            target_allowed = torch.ones(1, 1, x.size(1), target_keys.size(2), dtype=torch.bool, device=x.device)
        query = self.attention_input(x)
        source_keys, source_values = source_memory
        if self.mixed:
            # Eq. 3: one softmax over [source ; target up to itself]
            attended, weights = self.attention.attend_blocks(query, [
                (source_keys, source_values, source_allowed),
                (target_keys, target_values, target_allowed),
            ], need_weights)
        else:
            attended, _ = self.attention(query, target_keys, target_values, target_allowed)
            x = self.residual(x, attended, self.attention_layer_norm)
            attended, weights = self.attention(self.attention_input(x), source_keys, source_values, source_allowed,
                                               need_weights)
        x = self.residual(x, attended, self.attention_layer_norm)
        return self.feed_forward(x), (new_keys, new_values), weights

