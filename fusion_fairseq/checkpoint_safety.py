"""Loading untrusted checkpoints and configurations safely.

* torch's safe unpickler reads fairseq checkpoints (below);
* configuration strings fairseq would ``eval()`` are parsed as literals first
  (:func:`parse_config_literal`, :func:`require_literal_transformer_config`);
* only fairseq-train's --finetune-from-model may start parameters a checkpoint file lacks
  (:func:`may_start_parameters_fresh`);
* the plugin's configuration errors print as one line (:func:`print_plugin_errors_in_one_line`).

Let torch's safe unpickler read fairseq checkpoints without turning safe loading off.

Since torch 2.6, ``torch.load`` defaults to ``weights_only=True``, which refuses every global that
is not allow-listed. fairseq checkpoints store their configuration as an ``argparse.Namespace``
(legacy ``args`` / ``cfg.model``) or, in older files, as omegaconf containers; so
``fairseq-generate`` cannot load any checkpoint. On import, the plugin allow-lists exactly the
types found in such files (listed by ``torch.serialization.get_unsafe_globals_in_checkpoint`` on
checkpoints written by fairseq-train and on omegaconf-configured ones). Any other global, e.g. a
callable smuggled in a crafted pickle, is still refused.
"""

import argparse
import ast
import collections
import contextvars
import functools
import os
import sys
import typing

import torch
from omegaconf import DictConfig, ListConfig
from omegaconf.base import ContainerMetadata, Metadata
from omegaconf.nodes import AnyNode, BooleanNode, FloatNode, IntegerNode, StringNode

# Types (not callables with side effects): configuration containers and the plain type objects
# that omegaconf metadata refers to as ``ref_type`` / ``object_type`` / ``element_type``.
FAIRSEQ_CHECKPOINT_TYPES = (
    argparse.Namespace,
    collections.defaultdict,
    typing.Any,
    dict,
    list,
    int,
    float,
    bool,
    str,
    DictConfig,
    ListConfig,
    ContainerMetadata,
    Metadata,
    AnyNode,
    BooleanNode,
    FloatNode,
    IntegerNode,
    StringNode,
)


def allow_fairseq_checkpoint_types():
    """Add :data:`FAIRSEQ_CHECKPOINT_TYPES` to torch's safe globals (idempotent)."""
    torch.serialization.add_safe_globals(list(FAIRSEQ_CHECKPOINT_TYPES))


# --------------------------------------------------------------------------------------------
# configuration strings are parsed, never evaluated
# --------------------------------------------------------------------------------------------
# fairseq evaluates some configuration strings with ``eval()`` while building a model: the
# ConvS2S layer specs (``fconv``), ``adaptive_softmax_cutoff`` (``utils.eval_str_list`` in the
# Transformer decoder) and ``xformers_att_config`` (``utils.eval_str_dict`` in every
# ``MultiheadAttention``). A checkpoint stores these strings, so a crafted one would run code on
# load. The plugin's models parse them with :func:`parse_config_literal` first and refuse
# anything that is not a literal.

# A layer spec such as "[(128, 3)] * 9 + [(256, 3)] * 4" repeats lists; this bounds the length of
# a repeated list so that a crafted count cannot exhaust memory.
MAX_LIST_LENGTH = 10_000
_LITERAL_CONSTANTS = (int, float, str, bool, type(None))


class ConfigLiteralError(ValueError):
    """A configuration string that is not a plain literal."""


def parse_config_literal(text, flag: str):
    """The value of configuration string ``text`` (the value of ``flag``), read without running
    any code: numbers, strings, booleans, ``None``, tuples, lists and dicts of them, a leading
    minus sign, and fairseq's list arithmetic ``[...] * N`` and ``[...] + [...]``. Anything else
    (names, calls, attributes, comprehensions, lambdas) raises :class:`ConfigLiteralError`
    naming the flag and the text. Non-strings are returned as they are."""
    if not isinstance(text, str):
        return text
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except SyntaxError:
        raise ConfigLiteralError(_literal_error(flag, text, "it does not parse")) from None
    return _literal_value(tree.body, flag, text)


def _literal_error(flag, text, why):
    return (f"{flag} {text!r} is not a literal ({why}); allowed: numbers, strings, tuples, lists and "
            "dicts of them, and list repetition/concatenation such as [(512, 3)] * 4 + [(1024, 3)]")


def _literal_value(node, flag, text):
    if isinstance(node, ast.Constant) and isinstance(node.value, _LITERAL_CONSTANTS):
        return node.value
    if isinstance(node, (ast.Tuple, ast.List)):
        items = [_literal_value(item, flag, text) for item in node.elts]
        return tuple(items) if isinstance(node, ast.Tuple) else items
    if isinstance(node, ast.Dict) and None not in node.keys:
        return {_literal_value(key, flag, text): _literal_value(value, flag, text)
                for key, value in zip(node.keys, node.values)}
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        operand = _literal_value(node.operand, flag, text)
        if isinstance(operand, (int, float)) and not isinstance(operand, bool):
            return -operand if isinstance(node.op, ast.USub) else operand
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Mult)):
        return _sequence_arithmetic(node, flag, text)
    raise ConfigLiteralError(_literal_error(flag, text, f"it contains {type(node).__name__}"))


def _sequence_arithmetic(node, flag, text):
    left, right = _literal_value(node.left, flag, text), _literal_value(node.right, flag, text)
    if isinstance(node.op, ast.Add) and isinstance(left, (list, tuple)) and type(left) is type(right):
        return left + right
    if isinstance(node.op, ast.Mult):
        sequence, count = (left, right) if isinstance(left, (list, tuple)) else (right, left)
        if isinstance(sequence, (list, tuple)) and type(count) is int and 0 <= len(sequence) * count <= MAX_LIST_LENGTH:
            return sequence * count
    raise ConfigLiteralError(_literal_error(
        flag, text, f"only list + list and list * N giving at most {MAX_LIST_LENGTH} items are allowed"))


def require_literal_transformer_config(args):
    """Check the configuration strings fairseq's Transformer code evaluates while building
    (``adaptive_softmax_cutoff``; ``xformers_att_config`` of encoder and decoder, flat or as the
    nested ``encoder`` / ``decoder`` configs) before it does: each must be a literal, so fairseq's
    ``eval`` of it computes the same value and runs no code. Raises :class:`ConfigLiteralError`."""
    from fairseq.models.transformer import TransformerConfig

    cfg = TransformerConfig.from_namespace(args)
    checked = {
        "--adaptive-softmax-cutoff": cfg.adaptive_softmax_cutoff,
        "--encoder-xformers-att-config": cfg.encoder.xformers_att_config,
        "--decoder-xformers-att-config": cfg.decoder.xformers_att_config,
    }
    for flag, value in checked.items():
        parse_config_literal(value, flag)


# --------------------------------------------------------------------------------------------
# only fine-tuning may start parameters fresh
# --------------------------------------------------------------------------------------------
# A model may start parameters a checkpoint file lacks from their fresh initialisation only when
# fairseq-train starts from --finetune-from-model (Dou et al. initialise their aggregation
# models from a trained vanilla model). fairseq's model hook ``upgrade_state_dict_named`` cannot
# see why it is loading, so the two entry points through which fairseq loads checkpoint files
# record it while they run: ``checkpoint_utils.load_checkpoint`` (fairseq-train: fine-tuning, or
# resuming from checkpoint_last.pt) and ``checkpoint_utils.load_model_ensemble_and_task``
# (fairseq-generate, -interactive, -validate, hub models, the analysis scripts). A
# ``model.load_state_dict(...)`` called directly in code is the caller's own initialisation
# and, like fine-tuning, may start the parameters it lacks fresh.

FINE_TUNING, OTHER_CHECKPOINT_LOAD = "fine-tuning", "other checkpoint load"
_checkpoint_load = contextvars.ContextVar("fusion_fairseq_checkpoint_load", default=None)


def may_start_parameters_fresh() -> bool:
    """False only inside a load of a checkpoint file that is not fine-tuning."""
    return _checkpoint_load.get() != OTHER_CHECKPOINT_LOAD


def starts_from_pretrained_model(cfg, trainer) -> bool:
    """fairseq's own rule (``checkpoint_utils.load_checkpoint``): --finetune-from-model is read
    only on a first launch, i.e. with the default --restore-file, no --continue-once and no
    checkpoint_last.pt in --save-dir; otherwise training resumes from that checkpoint."""
    if cfg.finetune_from_model is None or cfg.restore_file != "checkpoint_last.pt":
        return False
    if getattr(cfg, "continue_once", None) is not None:
        return False
    last = os.path.join(cfg.save_dir, f"checkpoint_last{trainer.checkpoint_suffix}.pt")
    return not os.path.exists(last)


def _recording(original, kind_of_load):
    """``original`` run with ``kind_of_load(*args, **kwargs)`` recorded for the model hook."""
    @functools.wraps(original)
    def wrapper(*args, **kwargs):
        token = _checkpoint_load.set(kind_of_load(*args, **kwargs))
        try:
            return original(*args, **kwargs)
        finally:
            _checkpoint_load.reset(token)

    wrapper.records_checkpoint_loads = True
    return wrapper


def _training_load(cfg, trainer, **passthrough_args):
    return FINE_TUNING if starts_from_pretrained_model(cfg, trainer) else OTHER_CHECKPOINT_LOAD


def record_checkpoint_loads():
    """Wrap fairseq's two checkpoint-loading entry points (see above) so that
    :func:`may_start_parameters_fresh` tells the model hook why it is loading. Idempotent; the
    wrapped functions behave as before. ``load_model_ensemble`` and the CLIs look the functions
    up in ``checkpoint_utils`` when they call them, so they reach the wrappers."""
    from fairseq import checkpoint_utils

    if getattr(checkpoint_utils.load_checkpoint, "records_checkpoint_loads", False):
        return
    checkpoint_utils.load_checkpoint = _recording(checkpoint_utils.load_checkpoint, _training_load)
    checkpoint_utils.load_model_ensemble_and_task = _recording(
        checkpoint_utils.load_model_ensemble_and_task, lambda *args, **kwargs: OTHER_CHECKPOINT_LOAD)


class MissingParametersError(ValueError):
    """A checkpoint lacks parameters of the model's configuration outside fine-tuning."""


def missing_parameters_error(names, what: str) -> MissingParametersError:
    return MissingParametersError(
        f"the checkpoint has no {what} parameters but this configuration needs {len(names)}: "
        f"{', '.join(sorted(names))}; only fairseq-train --finetune-from-model may start them fresh "
        "(load the checkpoint with the configuration it was trained with, e.g. without --model-overrides "
        "that switch fusion on, or train into an empty --save-dir)"
    )


# --------------------------------------------------------------------------------------------
# configuration errors print as one line
# --------------------------------------------------------------------------------------------
# Flag values argparse cannot check alone (combinations, values read from a checkpoint or from
# --model-overrides) are checked while the model is built, after fairseq's parser is done; a
# ValueError there would reach the user as a traceback. The plugin's checks raise ValueError
# with a complete message, so an uncaught one raised in the plugin's own code prints as
# argparse's errors do: "PROG: error: MESSAGE", exit status 1, also when fairseq re-raised it as
# another exception. Every other exception (and a
# ValueError raised inside fairseq or torch) keeps Python's traceback.

PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep


def raised_in_plugin(traceback) -> bool:
    """True when the innermost frame of ``traceback`` is in this package's code."""
    if traceback is None:
        return False
    while traceback.tb_next is not None:
        traceback = traceback.tb_next
    return os.path.abspath(traceback.tb_frame.f_code.co_filename).startswith(PACKAGE_DIR)


def plugin_value_error(error):
    """``error`` or the exception it was raised while handling (fairseq's trainer re-raises a
    failed load as "Cannot load model parameters from checkpoint ..."), whichever is a
    ValueError raised in the plugin's code; None if neither is."""
    for candidate in (error, error.__cause__ or error.__context__):
        if isinstance(candidate, ValueError) and raised_in_plugin(candidate.__traceback__):
            return candidate
    return None


def print_plugin_errors_in_one_line():
    """Install the ``sys.excepthook`` described above (idempotent; chains the previous hook)."""
    previous = sys.excepthook
    if getattr(previous, "prints_plugin_errors_in_one_line", False):
        return

    def excepthook(kind, error, traceback):
        cause = plugin_value_error(error)
        if cause is None:
            previous(kind, error, traceback)
            return
        message = str(cause) if cause is error else f"{error}: {cause}"
        sys.stderr.write(f"{os.path.basename(sys.argv[0] or 'python')}: error: {' '.join(message.splitlines())}\n")

    excepthook.prints_plugin_errors_in_one_line = True
    sys.excepthook = excepthook
