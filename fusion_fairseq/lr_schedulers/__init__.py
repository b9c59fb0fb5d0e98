"""fairseq learning-rate schedulers of the plugin; importing this package registers them."""

from . import shrink_on_validation_increase  # noqa: F401
