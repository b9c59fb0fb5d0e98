"""fusion-fairseq: layer-fusion methods for sequence-to-sequence Transformers as a fairseq plugin.

Load with ``--user-dir $(fusion-fairseq-user-dir)`` or ``import fusion_fairseq``.
"""

from . import global_changes

global_changes.apply_all()  # every change the plugin makes to fairseq, torch or the process: see that module

from . import criterions, lr_schedulers, models, optim  # noqa: E402,F401  (registration side effects)

__version__ = "0.1.0"
