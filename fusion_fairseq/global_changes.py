"""Every change the plugin makes to fairseq, torch or the Python process when it is imported, in
one list. Each is idempotent (the plugin may be imported twice, as ``fusion_fairseq`` and under
``--user-dir``'s directory name) and has a test that fails without it.

| change | why | upstream | test |
|---|---|---|---|
| fairseq's checkpoint types join torch's safe globals, and fairseq's ``checkpoint_utils`` reads weights only | torch >= 2.6 loads weights only and refuses the ``argparse.Namespace`` / omegaconf objects of every fairseq checkpoint; fairseq's main branch passes ``weights_only=False``, which runs a crafted pickle | pytorch 2.6's ``weights_only`` default; fairseq #5611 | ``test_checkpoint_safety.py`` (``test_safe_loading_holds_when_fairseq_passes_weights_only_false``) |
| fairseq's checkpoint loads record why they load, and loaded configurations are checked | only fine-tuning may start parameters a checkpoint lacks; fairseq ``eval()``s stored strings; overrides could change a trained structure | plugin rule | ``test_crafted_checkpoints.py`` |
| fairseq's ``merge_with_parent`` refuses a plugin model's hydra config with an unknown field or a half-applied preset, in one line | fairseq refuses a misspelt field (``fuse_decodr: sa``) in three lines, and fills a preset's fields with the model's defaults | plugin rule | ``test_config.py`` |
| ``sys.excepthook`` prints a :class:`ConfigurationError` as one line | a refused value is a usage error, not a crash; every other exception keeps its traceback | plugin rule | ``test_plugin_import.py`` |
| ``data_utils.batch_by_size`` keeps the last partial batch | fairseq drops up to ``--required-batch-size-multiple`` - 1 sentences from generation, validation and every epoch | fairseq #5036 | ``test_fairseq_fixes.py`` |
| fairseq's multi-process training runs on the CPU, its ranks meeting on 127.0.0.1 only and ending with ``fairseq-train`` | fairseq counts processes in GPUs: ``--cpu --distributed-world-size 2`` fails or trains nothing; its store listens on every interface, orphaned ranks keep training, bad world sizes, ports and torchrun variables fail late or never | plugin fix of fairseq's ``distributed/utils.py`` | ``test_distributed.py``, ``test_fairseq_fixes.py`` |
| ``--bf16`` trains without a TPU | fairseq sets ``--tpu`` for every ``--bf16`` run and stops where torch_xla is missing | fairseq #4696 | ``test_fairseq_fixes.py`` |
| a resumed training gets the batches of the run it continues | fairseq orders the examples under ``--seed`` + the epoch it resumes at, so sentences of equal length fall into other batches than in the run trained in one go | plugin fix of fairseq's ``FairseqTask.get_batch_iterator`` | ``test_fairseq_fixes.py`` |

The reasons in full are in the docstrings of the functions listed in :data:`CHANGES`.
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
