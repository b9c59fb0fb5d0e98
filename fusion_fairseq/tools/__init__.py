"""The project's tooling around the plugin: the main job (quickstart), the synthetic corpus, the
speed benchmark, the quality comparison, time to a loss, and the helpers the analysis scripts share.

Nothing here is imported by ``--user-dir``: fairseq loads only the plugin's models, modules and
criteria (``fusion_fairseq/__init__.py``).
"""
