"""The plugin's one error class for bad configuration values."""


class ConfigurationError(ValueError):
    """A flag, override or stored configuration value the plugin refuses. Its message names the
    flag, the value and what is allowed; a command line that ends in one prints only that line
    (``global_changes``), where any other exception keeps its traceback. A ``ValueError``, so that
    code catching fairseq's own configuration errors catches it too."""
