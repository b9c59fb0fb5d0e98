"""fairseq models of the plugin; importing this package registers them, with the criterion, optimizer and
learning-rate scheduler they train with (fairseq's ``--user-dir`` imports it; so may a script or notebook)."""

from fusion_fairseq import criterions, global_changes, lr_schedulers, optim  # noqa: F401  (registration)

global_changes.apply_all()  # the few changes fairseq needs to run the plugin: docs/safety.md

from .fusion_transformer import FusionTransformerModel  # noqa: E402,F401
from .layerwise_coordination import LayerwiseCoordinationModel  # noqa: E402,F401
from .dense_fconv import DenseFConvModel  # noqa: E402,F401
from .dense_transformer import DenseTransformerModel  # noqa: E402,F401
