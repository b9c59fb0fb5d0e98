"""fairseq's ``--user-dir`` for fusion-fairseq (``fusion-fairseq-user-dir`` prints its path): importing it
registers the plugin's models, criterion, optimizer and learning-rate scheduler (``fusion_fairseq.models``).

It is a package of its own because fairseq imports a ``--user-dir`` only when no module of its name is
imported yet: a process that imported ``fusion_fairseq`` or one of its helpers (``fusion_fairseq.cli``)
before parsing would otherwise skip it and register nothing.
"""

import os

import fusion_fairseq

_beside = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "fusion_fairseq")
_imported = os.path.dirname(os.path.abspath(fusion_fairseq.__file__))
if os.path.realpath(_imported) != os.path.realpath(_beside):
    raise ImportError(f"--user-dir {os.path.dirname(os.path.abspath(__file__))} registers the plugin at {_beside}, "
                      f"but this Python imported fusion_fairseq from {_imported}: pass the --user-dir that "
                      "fusion-fairseq-user-dir prints, or install the copy you want (pip install -e its checkout)")

import fusion_fairseq.models  # noqa: E402,F401  (registers)
