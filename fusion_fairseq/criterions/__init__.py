"""fairseq criteria of the plugin (registered on import)."""
