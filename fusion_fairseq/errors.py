"""The plugin's one error class for bad configuration values."""


class ConfigurationError(ValueError):
    """A flag, override or stored value the plugin refuses, in one line naming it, its value and what is allowed.
    A ``ValueError``, so that code catching fairseq's configuration errors catches it."""
