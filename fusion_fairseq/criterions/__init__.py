"""fairseq criteria of the plugin; importing this package registers them."""

from . import label_smoothed_cross_entropy_with_layer_diversity  # noqa: F401
