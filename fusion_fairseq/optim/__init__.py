"""fairseq optimizers of the plugin; importing this package registers them."""

from . import adam_with_overrides  # noqa: F401
