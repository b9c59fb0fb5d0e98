"""Pure ``nn.Module`` building blocks, one concept per file; no fairseq argument parsing here."""

from .average_fusion import AverageFusion
from .feedforward_fusion import FeedForward, FeedForwardFusion
from .layer_fusion import FUSION_FUNCTIONS, LayerFusion, build_layer_fusion
from .multihop_attention_fusion import MultiHopAttentionFusion

__all__ = [
    "AverageFusion",
    "FeedForward",
    "FeedForwardFusion",
    "FUSION_FUNCTIONS",
    "LayerFusion",
    "MultiHopAttentionFusion",
    "build_layer_fusion",
]
