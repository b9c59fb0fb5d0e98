"""The plugin's one error class for bad configuration values."""


class ConfigurationError(ValueError):
    """A flag, override or stored value the plugin refuses, named with what is allowed; it prints as one line
    (``checkpoint_safety``). A ``ValueError``, so that code catching fairseq's configuration errors catches it."""
