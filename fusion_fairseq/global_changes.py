"""The changes loading the plugin makes to fairseq, in one list: each is needed for fairseq to run on the
supported torch, or fixes an upstream bug that changes results, and changes nothing else. ``fusion_fairseq.models``
applies them when it registers the models (``--user-dir`` imports it); each is idempotent (a process may register
the plugin twice, by ``--user-dir`` after ``import fusion_fairseq.models``) and has a test that fails without it:
the table in docs/safety.md ("What loading the plugin changes") gives each one's reason, upstream issue and test.
"""

from . import checkpoint_safety, config_fields, fairseq_fixes

CHANGES = (
    checkpoint_safety.read_checkpoints_safely,
    checkpoint_safety.check_loaded_configurations,
    config_fields.check_model_configs,
    fairseq_fixes.train_in_cpu_processes,
    fairseq_fixes.train_bf16_without_tpu,
    fairseq_fixes.resume_with_the_batches_of_an_unbroken_run,
)


def apply_all() -> None:
    for change in CHANGES:
        change()
