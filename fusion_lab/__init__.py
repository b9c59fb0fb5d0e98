"""The laboratory beside the plugin: the main job (quickstart), the corpus pipeline, the synthetic
corpus, the speed benchmark, the quality comparison and the helpers the analysis scripts share.

fairseq's ``--user-dir`` imports the plugin (``fusion_fairseq``: models, modules, criterion,
scheduler, optimizer) and nothing here; this package uses the plugin as a user of fairseq would.
"""
