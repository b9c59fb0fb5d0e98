"""fairseq models of the plugin; importing this package registers them."""

from .fusion_transformer import FusionTransformerModel  # noqa: F401
from .layerwise_coordination import LayerwiseCoordinationModel  # noqa: F401
from .dense_fconv import DenseFConvModel  # noqa: F401
from .dense_transformer import DenseTransformerModel  # noqa: F401
