"""Every change the plugin makes to fairseq, torch or the Python process when it is imported, in
one list. Each is idempotent (the plugin may be imported twice, as ``fusion_fairseq`` and under
``--user-dir``'s directory name) and has a test that fails without it: the table in docs/safety.md
("What importing the plugin changes") gives each one's reason, upstream issue and test.
"""

from . import checkpoint_safety, config_fields, fairseq_fixes

CHANGES = (
    checkpoint_safety.read_checkpoints_safely,
    checkpoint_safety.check_loaded_configurations,
    config_fields.check_model_configs,
    checkpoint_safety.print_configuration_errors_in_one_line,
    fairseq_fixes.keep_last_partial_batch,
    fairseq_fixes.train_in_cpu_processes,
    fairseq_fixes.train_bf16_without_tpu,
    fairseq_fixes.resume_with_the_batches_of_an_unbroken_run,
)


def apply_all() -> None:
    for change in CHANGES:
        change()
