"""Pure ``nn.Module`` building blocks, one concept per file; no fairseq argument parsing here."""

from .aggregation_node import AGGREGATION_FUNCTIONS, AGGREGATION_RESIDUALS, AggregationNode  # noqa: F401
from .feedforward_fusion import FeedForward, FeedForwardFusion  # noqa: F401
from .layer_attention import LAYER_ATTENTION_KINDS, LayerAttention  # noqa: F401
from .layer_aggregation import AGGREGATION_STRATEGIES, build_layer_aggregation, hierarchical_tree  # noqa: F401
from .layer_fusion import FUSION_FUNCTIONS, AverageFusion, LayerFusion, build_layer_fusion  # noqa: F401
from .multi_layer_attention import MultiLayerSelfAttention  # noqa: F401
from .multihop_attention_fusion import MultiHopAttentionFusion  # noqa: F401
from .surface_attention import SurfaceAttention  # noqa: F401
from .surface_fusion import SURFACE_FUSION_KINDS, SurfaceFusion, hard_fusion, soft_fusion  # noqa: F401

