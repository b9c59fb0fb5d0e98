"""fusion-fairseq: layer-fusion methods for sequence-to-sequence Transformers as a fairseq plugin.

Load with ``--user-dir $(fusion-fairseq-user-dir)`` or ``import fusion_fairseq``.
"""

from . import checkpoint_safety

checkpoint_safety.allow_fairseq_checkpoint_types()
checkpoint_safety.read_weights_only()
checkpoint_safety.record_checkpoint_loads()
checkpoint_safety.check_loaded_configurations()
checkpoint_safety.print_plugin_errors_in_one_line()

from . import fairseq_fixes  # noqa: E402,F401  (last partial batch, #5036; training in CPU processes)

from . import criterions, lr_schedulers, models  # noqa: E402,F401  (registration side effects)

__version__ = "0.1.0"
