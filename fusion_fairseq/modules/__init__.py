"""Pure ``nn.Module`` building blocks, one concept per file; no fairseq argument parsing here."""

from .aggregation_node import AGGREGATION_FUNCTIONS, AGGREGATION_RESIDUALS, AggregationNode
from .feedforward_fusion import FeedForward, FeedForwardFusion
from .layer_attention import LAYER_ATTENTION_KINDS, LayerAttention
from .layer_aggregation import AGGREGATION_STRATEGIES, build_layer_aggregation, hierarchical_tree
from .layer_fusion import FUSION_FUNCTIONS, AverageFusion, LayerFusion, build_layer_fusion
from .multi_layer_attention import MultiLayerSelfAttention
from .multihop_attention_fusion import MultiHopAttentionFusion
from .surface_attention import SurfaceAttention
from .surface_fusion import SURFACE_FUSION_KINDS, SurfaceFusion, hard_fusion, soft_fusion

