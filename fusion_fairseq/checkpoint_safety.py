"""Loading untrusted checkpoints and configurations safely.

* torch's safe unpickler reads fairseq checkpoints (below);
* configuration strings fairseq would ``eval()`` are parsed as literals first
  (:func:`parse_config_literal`, :func:`require_literal_transformer_config`);
* a checkpoint's stored task and criterion configuration is checked the same way when the file is
  read (:func:`require_literal_task_and_criterion`), and the pretrained-embedding files its model
  configuration names are forgotten (:func:`forget_embedding_files`);
* hub models read or fetch no file that only the checkpoint names (:func:`checkpoint_file_settings`);
* only fairseq-train's --finetune-from-model may start parameters a checkpoint file lacks
  (:func:`may_start_parameters_fresh`), and --model-overrides cannot change the structure a
  checkpoint was trained with (:func:`structural_override_errors`);
* the plugin's configuration errors print as one line (:func:`print_configuration_errors_in_one_line`).

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
import pickle
import re
import sys
import typing

import torch
from omegaconf import DictConfig, ListConfig
from omegaconf.base import ContainerMetadata, Metadata
from omegaconf.nodes import AnyNode, BooleanNode, FloatNode, IntegerNode, StringNode

from .errors import ConfigurationError

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


class _TorchReadingWeightsOnly:
    """torch as fairseq's ``checkpoint_utils`` sees it: the same module, except that ``load``
    always unpickles with ``weights_only=True``. fairseq's main branch passes
    ``weights_only=False`` (since "Pt2.6 compatibility", #5611), which would bypass the
    allow-list above and run a crafted pickle; ve-fairseq 0.12.3 passes nothing. ``load`` also
    reports, in one line naming the file, a refused global and a state fairseq cannot use
    (:func:`require_model_parameters`) before fairseq reads it."""

    def __getattr__(self, name):
        return getattr(torch, name)

    @staticmethod
    def load(file, *args, **kwargs):
        path = getattr(file, "name", file)
        try:
            state = torch.load(file, *args, **{**kwargs, "weights_only": True})
        except pickle.UnpicklingError as error:
            refused = re.search(r"Unsupported global: GLOBAL [\w.]+", str(error))
            if refused is None:  # a damaged file
                raise
            raise CheckpointContentError(f"{path}: cannot read the checkpoint safely ({refused.group(0)}): a fairseq "
                                         "checkpoint holds tensors and configuration types only") from None
        require_model_parameters(state, path)
        return state


class CheckpointContentError(ConfigurationError):
    """A checkpoint file fairseq cannot use as it is (one line naming it)."""


def require_model_parameters(state, path):
    """A :class:`CheckpointContentError` unless ``state`` has a ``model`` dict of real tensors that hold data."""
    if not isinstance(state, dict) or not isinstance(state.get("model"), dict):
        raise CheckpointContentError(f"{path}: cannot read the checkpoint: it has no 'model' entry of parameters "
                                     "(not a fairseq checkpoint of a model)")
    for name, tensor in state["model"].items():
        if not isinstance(tensor, torch.Tensor) or tensor.is_meta or tensor.is_complex():
            what = (type(tensor).__name__ if not isinstance(tensor, torch.Tensor)
                    else "a meta tensor, without data" if tensor.is_meta else f"a complex tensor ({tensor.dtype})")
            raise CheckpointContentError(f"{path}: cannot read the checkpoint: parameter {name} is {what}; a "
                                         "model's parameters are real tensors with data")


def read_weights_only():
    """Let every ``torch.load`` in fairseq's ``checkpoint_utils`` (its reader of checkpoint
    files) read weights only, whatever fairseq passes (idempotent)."""
    from fairseq import checkpoint_utils

    if not isinstance(checkpoint_utils.torch, _TorchReadingWeightsOnly):
        checkpoint_utils.torch = _TorchReadingWeightsOnly()


# --------------------------------------------------------------------------------------------
# configuration strings are parsed, never evaluated
# --------------------------------------------------------------------------------------------
# fairseq evaluates some configuration strings with ``eval()`` while building a model: the
# ConvS2S layer specs (``fconv``), ``adaptive_softmax_cutoff`` (``utils.eval_str_list`` in the
# Transformer decoder) and ``xformers_att_config`` (``utils.eval_str_dict`` in every
# ``MultiheadAttention``). A checkpoint stores these strings, so a crafted one would run code on
# load. The plugin's models parse them with :func:`parse_config_literal` first and refuse
# anything that is not a literal.

# A layer spec such as "[(128, 3)] * 9 + [(256, 3)] * 4" repeats lists; this bounds the number of
# items of the whole value (those of nested tuples, lists and dicts included, each repetition and
# concatenation counted), so that a crafted count cannot exhaust memory or time.
MAX_LIST_LENGTH = 10_000
_LITERAL_CONSTANTS = (int, float, str, bool, type(None))


class ConfigLiteralError(ConfigurationError):
    """A configuration string that is not a plain literal."""


def parse_config_literal(text, flag: str):
    """The value of configuration string ``text`` (the value of ``flag``), read without running
    any code: numbers, strings, booleans, ``None``, tuples, lists and dicts of them, a leading
    minus sign, and fairseq's list arithmetic ``[...] * N`` and ``[...] + [...]``, with at most
    :data:`MAX_LIST_LENGTH` items in all. Anything else (names, calls, attributes, comprehensions,
    lambdas) raises :class:`ConfigLiteralError` naming the flag and the text. Non-strings are
    returned as they are."""
    if not isinstance(text, str):
        return text
    try:
        return _literal(ast.parse(text.strip(), mode="eval").body, flag, text)[0]
    except SyntaxError:
        raise ConfigLiteralError(_literal_error(flag, text, "it does not parse")) from None
    except RecursionError:  # "[0]+[0]+..." thousands of terms long
        raise ConfigLiteralError(_literal_error(flag, text, "it is nested too deeply")) from None


def _literal_error(flag, text, why):
    shown = repr(text) if len(text) <= 200 else f"{text[:200]!r}... ({len(text)} characters)"
    return (f"{flag} {shown} is not a literal ({why}); allowed: numbers, strings, tuples, lists and "
            f"dicts of them, and list repetition/concatenation such as [(512, 3)] * 4 + [(1024, 3)], "
            f"at most {MAX_LIST_LENGTH} items in all")


def _too_many_items(flag, text):
    return ConfigLiteralError(_literal_error(
        flag, text, f"only list + list and list * N giving at most {MAX_LIST_LENGTH} items are allowed"))


def _literal(node, flag, text):
    """``(value, items)`` of ``node``: ``items`` counts the elements of its tuples, lists and dicts."""
    if isinstance(node, ast.Constant) and isinstance(node.value, _LITERAL_CONSTANTS):
        return node.value, 0
    if isinstance(node, (ast.Tuple, ast.List)):
        parts = [_literal(item, flag, text) for item in node.elts]
        values = [value for value, _ in parts]
        return _bounded(tuple(values) if isinstance(node, ast.Tuple) else values,
                        len(parts) + sum(items for _, items in parts), flag, text)
    if isinstance(node, ast.Dict) and None not in node.keys:
        keys = [_literal(key, flag, text) for key in node.keys]
        values = [_literal(value, flag, text) for value in node.values]
        for key, _ in keys:
            _require_hashable(key, flag, text)
        return _bounded({key: value for (key, _), (value, _) in zip(keys, values)},
                        len(keys) + sum(items for _, items in keys + values), flag, text)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        operand, _ = _literal(node.operand, flag, text)
        if isinstance(operand, (int, float)) and not isinstance(operand, bool):
            return (-operand if isinstance(node.op, ast.USub) else operand), 0
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Mult)):
        return _sequence_arithmetic(node, flag, text)
    raise ConfigLiteralError(_literal_error(flag, text, f"it contains {type(node).__name__}"))


def _require_hashable(key, flag, text):
    try:
        hash(key)
    except TypeError:
        raise ConfigLiteralError(_literal_error(flag, text, f"the dict key {key!r} is not hashable")) from None


def _bounded(value, items, flag, text):
    if items > MAX_LIST_LENGTH:
        raise _too_many_items(flag, text)
    return value, items


def _sequence_arithmetic(node, flag, text):
    (left, left_items), (right, right_items) = _literal(node.left, flag, text), _literal(node.right, flag, text)
    if isinstance(node.op, ast.Add) and isinstance(left, (list, tuple)) and type(left) is type(right):
        return _bounded(left, left_items + right_items, flag, text)[0] + right, left_items + right_items
    if isinstance(node.op, ast.Mult):
        (sequence, items), count = ((left, left_items), right) if isinstance(left, (list, tuple)) \
            else ((right, right_items), left)
        if isinstance(sequence, (list, tuple)) and type(count) is int and count >= 0:
            return _bounded(sequence, items * count, flag, text)[0] * count, items * count
    raise _too_many_items(flag, text)


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


class MissingParametersError(ConfigurationError):
    """A checkpoint lacks parameters of the model's configuration outside fine-tuning."""


def missing_parameters_error(names, what: str) -> MissingParametersError:
    return MissingParametersError(
        f"the checkpoint has no {what} parameters but this configuration needs {len(names)}: "
        f"{', '.join(sorted(names))}; only fairseq-train --finetune-from-model may start them fresh "
        "(load the checkpoint with the configuration it was trained with, e.g. without --model-overrides "
        "that switch fusion on, or train into an empty --save-dir)"
    )


# --------------------------------------------------------------------------------------------
# a checkpoint's task and criterion configuration is checked when it is read
# --------------------------------------------------------------------------------------------
# Loading a checkpoint without a task (fairseq-validate, hub models' from_pretrained, the
# analysis scripts) builds the task stored in it, and fairseq-validate also builds its stored
# criterion. fairseq's tasks and criteria eval() some of their configuration strings while they
# are built, whatever the model's architecture:
#   left_pad_source, left_pad_target   ``utils.eval_bool`` in multilingual_translation (and
#                                      semisupervised_translation), online_backtranslation and
#                                      translation_multi_simple_epoch (MultilingualDatasetManager)
#   feature_encoder_spec               ``eval`` in audio_pretraining's RawAudioDataset
#   wer_args                           ``eval`` in the ctc criterion
# ``checkpoint_utils.load_checkpoint_to_cpu`` is fairseq's one reader of checkpoint files (every
# loader looks it up in ``checkpoint_utils`` when it calls it), so the plugin checks every state
# it returns: each of these fields, in the stored ``cfg.task`` / ``cfg.criterion`` (omegaconf
# nodes or Namespaces) and in a legacy flat ``args`` Namespace, must be a literal (True or False
# for the booleans), which fairseq's eval turns into the same value without running code. A field
# a task does not have is checked all the same: an honest configuration holds literals there.

EVALUATED_FIELDS = {
    "task": {"left_pad_source": bool, "left_pad_target": bool, "feature_encoder_spec": object},
    "criterion": {"wer_args": object},
}
_ABSENT = object()


def stored_value(section, field: str):
    """``field`` of a stored configuration section (a Namespace, an omegaconf node or a dict);
    ``_ABSENT`` when the section has no such field or its interpolation does not resolve (then
    fairseq cannot read it either)."""
    from omegaconf.errors import OmegaConfBaseException

    if isinstance(section, argparse.Namespace):
        return getattr(section, field, _ABSENT)
    if not isinstance(section, (dict, DictConfig)) or field not in section:
        return _ABSENT
    try:
        return section[field]
    except OmegaConfBaseException:
        return _ABSENT


def stored_sections(state):
    """``(name, section)`` of the task and criterion configuration stored in a checkpoint state:
    the ``cfg`` sections and, for a legacy checkpoint, its flat ``args`` as both."""
    args = state.get("args")
    if isinstance(args, argparse.Namespace):
        yield from (("task", args), ("criterion", args))
    cfg = state.get("cfg")
    for name in EVALUATED_FIELDS:
        section = stored_value(cfg, name)
        if section is not _ABSENT and section is not None:
            yield name, section


def require_literal_task_and_criterion(state, path):
    """Raise :class:`ConfigLiteralError` naming ``path`` and the field for any field of
    :data:`EVALUATED_FIELDS` in ``state`` that fairseq would evaluate to anything but a literal."""
    if not isinstance(state, dict):
        return
    for name, section in stored_sections(state):
        for field, kind in EVALUATED_FIELDS[name].items():
            value = stored_value(section, field)
            if isinstance(value, str):
                _require_literal_field(value, kind, f"checkpoint {path}: {name} {field}", name)


def _require_literal_field(text, kind, where, built):
    evaluated = f"fairseq would evaluate it when building the {built}"
    try:
        value = parse_config_literal(text, where)
    except ConfigLiteralError as error:
        value = error
    if kind is bool and not isinstance(value, bool):
        raise ConfigLiteralError(f"{where} {text!r} is not True or False; {evaluated}")
    if isinstance(value, ConfigLiteralError):
        raise ConfigLiteralError(f"{value}; {evaluated}")


# --------------------------------------------------------------------------------------------
# --model-overrides cannot change the structure a checkpoint was trained with
# --------------------------------------------------------------------------------------------
# A fusion configuration switched on at load whose parameters the checkpoint lacks fails (above),
# but several of the plugin's flags change the model without adding a parameter (a dense
# connection with its LayerNorm, the aggregation residuals, attention heads, ...): fairseq's
# strict load passes and the model computes another function. So, in loads through
# ``load_model_ensemble_and_task`` (fairseq-generate, -interactive, -validate, hub models, the
# analysis scripts: never fine-tuning, whose model is built from the command line and whose load
# takes no overrides), an override may set a structural flag (:func:`structural_flags`) only when the
# checkpoint's stored model configuration lacks that field (saved before the flag existed: the
# model's own checks then name the value it needs, e.g. ``dense_connection``, ``summary_layer``,
# ``residual_dim``) or holds the same value. Flags that tune a trained model (dropouts,
# SurfaceFusion's lambda and tau, DropConnect) and the analysis flag ``mask_encoder_layer`` stay
# free. The refusal comes after the load itself, so an override that needs parameters the
# checkpoint lacks still fails naming them.

class StructuralOverrideError(ConfigurationError):
    """--model-overrides changes a structural flag against the checkpoint's configuration."""


_structure_conflicts = contextvars.ContextVar("fusion_fairseq_structure_conflicts", default=None)
# while fairseq-train resumes (loads a checkpoint other than its --finetune-from-model start):
# (the command line's model configuration, the conflicts found)
_resumed_with = contextvars.ContextVar("fusion_fairseq_resumed_with", default=None)


def stored_model_config(state):
    """The model configuration of a checkpoint state: legacy ``args`` or ``cfg.model``."""
    args = state.get("args")
    return args if args is not None else stored_value(state.get("cfg"), "model")


# fairseq builds the model that ``_name`` names, else the one ``arch`` (--arch) names: an override
# of either is compared with the architecture the checkpoint was trained with.
ARCHITECTURE_FIELDS = ("_name", "arch")


def architecture(model_config):
    """The architecture fairseq builds from ``model_config``: its ``_name``, else its ``arch``."""
    for field in ARCHITECTURE_FIELDS:
        value = stored_value(model_config, field)
        if isinstance(value, str):
            return value
    return None


def structural_flags(model_config):
    """The structural fields of the plugin model whose architecture ``model_config`` names (those
    its registered dataclass marks ``structural``, see ``fusion_fairseq.config_fields``); none for
    fairseq's own models."""
    from fairseq.models import ARCH_MODEL_NAME_REGISTRY, MODEL_DATACLASS_REGISTRY
    from fusion_fairseq.config_fields import structural_fields

    config = MODEL_DATACLASS_REGISTRY.get(ARCH_MODEL_NAME_REGISTRY.get(architecture(model_config)))
    return structural_fields(config) if config is not None else ()


# fairseq's own flags that fix the function a trained model computes, for every architecture: its
# sizes, and heads, activation, LayerNorm placement, embedding scale and sharing, which change no
# parameter's name or shape (fairseq's strict load passes and the scores change).
FAIRSEQ_STRUCTURAL_FIELDS = tuple(f"{side}_{name}" for side in ("encoder", "decoder") for name in (
    "layers", "embed_dim", "ffn_embed_dim", "attention_heads", "normalize_before", "learned_pos")) + (
    "decoder_output_dim", "decoder_input_dim", "decoder_out_embed_dim", "activation_fn", "no_scale_embedding",
    "layernorm_embedding", "no_token_positional_embeddings", "share_all_embeddings",
    "share_decoder_input_output_embed", "cross_self_attention", "no_decoder_final_norm", "adaptive_softmax_cutoff")


def structure(model_config):
    """The structural configuration: ``{"arch": architecture, flag: value}`` for the model's
    :func:`structural_flags` and :data:`FAIRSEQ_STRUCTURAL_FIELDS` (``_ABSENT`` where the
    configuration lacks the field)."""
    return {"arch": architecture(model_config),
            **{flag: stored_value(model_config, flag)
               for flag in (*FAIRSEQ_STRUCTURAL_FIELDS, *structural_flags(model_config))}}


def structural_differences(config, other):
    """``(field, value, other value)`` for the architecture and each structural field that both
    model configurations hold, with different values."""
    mine, theirs = structure(config), structure(other)
    return [(field, mine[field], theirs[field]) for field in mine
            if mine[field] is not _ABSENT and theirs.get(field, _ABSENT) is not _ABSENT
            and not _same_value(theirs[field], mine[field])]


def structural_override_errors(path, stored_config, overrides):
    """A :class:`StructuralOverrideError` for each override of the architecture or of a
    structural flag that the stored configuration holds with another value."""
    trained = structure(stored_config)
    errors = []
    for flag, value in overrides.items():
        field = "arch" if flag in ARCHITECTURE_FIELDS else flag
        if trained.get(field, _ABSENT) is _ABSENT or _same_value(value, trained[field]):
            continue
        errors.append(StructuralOverrideError(
            f"--model-overrides sets {flag} {value!r} but checkpoint {path} was trained with {field} "
            f"{trained[field]!r}: a structural flag cannot change at load (the model would compute another "
            "function); load it without that override, or start a model of the new configuration from it with "
            "fairseq-train --finetune-from-model"
        ))
    return errors


def _same_value(override, trained):
    """Equal, or equal as text (--model-overrides may hand in '2' for 2)."""
    return override == trained or str(override) == str(trained)


def structural_resume_errors(path, stored_config, command_line_config):
    """A :class:`StructuralOverrideError` for the architecture and each structural flag that
    fairseq-train's command line gives another value than the checkpoint it resumes from was
    trained with (a flag either configuration lacks is compared only through the architecture:
    same architecture, same flags, except in a checkpoint saved before a flag existed)."""
    return [StructuralOverrideError(
        f"fairseq-train resumes from {path}, trained with {flag} {trained!r}, but the command line gives "
        f"{flag} {given!r}: a structural flag cannot change when training resumes; train into another "
        "--save-dir, or start a model of the new configuration from it with --finetune-from-model"
    ) for flag, trained, given in structural_differences(stored_config, command_line_config)]


# A model built from a checkpoint's configuration (every load but fairseq-train's, whose model is
# built from its command line) would read the pretrained embeddings that configuration names
# (fairseq's ``parse_embedding``, in the Transformer's and ConvS2S's build_model): any file, a FIFO
# that blocks for ever, /dev/zero that fills memory. The checkpoint's own weights replace them, so
# the reader forgets those paths before anything is built from the state.
EMBEDDING_FILE_FIELDS = ("encoder_embed_path", "decoder_embed_path")


def forget_embedding_files(state):
    """Set the pretrained-embedding paths of ``state``'s model configuration to None: the flat
    fields of its ``args`` and ``cfg.model``, and the ``embed_path`` of nested encoder/decoder configs."""
    if not isinstance(state, dict):
        return
    for config in (state.get("args"), stored_value(state.get("cfg"), "model")):
        places = [(config, field) for field in EMBEDDING_FILE_FIELDS]
        places += [(stored_value(config, side), "embed_path") for side in ("encoder", "decoder")]
        for section, field in places:
            if stored_value(section, field) not in (_ABSENT, None):
                if isinstance(section, argparse.Namespace):
                    setattr(section, field, None)
                else:
                    section[field] = None


def require_known_architecture(state, path):
    """A :class:`CheckpointContentError` unless fairseq knows the architecture of ``state``
    (fairseq fails deep in its registries otherwise) and, for the plugin's, the configuration asks
    for no LayerDrop pruning (``encoder_layers_to_keep``/``decoder_layers_to_keep``), which
    fairseq applies to the parameters but the plugin's models do not build."""
    from fairseq.models import ARCH_MODEL_REGISTRY, MODEL_REGISTRY

    config = stored_model_config(state)
    name = architecture(config)
    if name not in MODEL_REGISTRY and name not in ARCH_MODEL_REGISTRY:
        raise CheckpointContentError(f"{path}: the checkpoint's architecture {name!r} is not one fairseq knows; pass "
                                     "the --user-dir that registers it, or give a checkpoint of a registered one")
    for field in ("encoder_layers_to_keep", "decoder_layers_to_keep"):
        if structural_flags(config) and stored_value(config, field) not in (_ABSENT, None, ""):
            raise CheckpointContentError(
                f"{path}: {field} {stored_value(config, field)!r} (fairseq's LayerDrop pruning) is not supported by "
                f"the plugin's architecture {name}; load the checkpoint without it")


def _checked_reader(read):
    """fairseq's ``load_checkpoint_to_cpu`` (``read``) checking each state it returns."""
    @functools.wraps(read)
    def load_checkpoint_to_cpu(path, arg_overrides=None, load_on_all_ranks=False):
        state = read(path, arg_overrides, load_on_all_ranks)
        require_known_architecture(state, path)
        require_literal_task_and_criterion(state, path)
        forget_embedding_files(state)
        conflicts = _structure_conflicts.get()
        if conflicts is not None and arg_overrides and isinstance(state, dict):
            if {*structure(stored_model_config(state)), *ARCHITECTURE_FIELDS} & set(arg_overrides):
                # the state holds the overridden values: read the stored ones (only for such overrides)
                stored = stored_model_config(read(path, None, load_on_all_ranks))
                conflicts.extend(structural_override_errors(path, stored, arg_overrides))
        resumed = _resumed_with.get()
        if resumed is not None and isinstance(state, dict):
            command_line_config, resume_conflicts = resumed
            resume_conflicts.extend(structural_resume_errors(path, stored_model_config(state), command_line_config))
        return state

    load_checkpoint_to_cpu.checks_loaded_configurations = True
    return load_checkpoint_to_cpu


def raise_first_conflict_instead(error, conflicts):
    """A structural change found before the load failed (e.g. in fairseq's strict load of the
    parameters that another fusion function has) is the reason to report, in one line; the
    plugin's own errors (:class:`MissingParametersError` naming the parameters) stay as they are."""
    if conflicts and configuration_error(error) is None:
        raise conflicts[0] from None


def _refusing_structural_overrides(load):
    """fairseq's ``load_model_ensemble_and_task`` (``load``), raising the first structural
    override found by the reader once the load itself went through, and in a hub load the first
    setting that reads or fetches a file named by the checkpoint (see below)."""
    @functools.wraps(load)
    def load_model_ensemble_and_task(filenames, arg_overrides=None, *args, **kwargs):
        conflicts = []
        token = _structure_conflicts.set(conflicts)
        try:
            loaded = load(filenames, arg_overrides, *args, **kwargs)
        except Exception as error:
            raise_first_conflict_instead(error, conflicts)
            raise
        finally:
            _structure_conflicts.reset(token)
        if _hub_load.get():
            conflicts.extend(checkpoint_file_setting_errors(filenames[0], loaded[1], arg_overrides or {}))
        if conflicts:
            raise conflicts[0]
        return loaded

    return load_model_ensemble_and_task


def _refusing_structural_changes_on_resume(load_checkpoint):
    """fairseq-train's ``load_checkpoint`` (``load_checkpoint``), raising the first structural
    flag that its command line changes against the checkpoint it resumes from. The model is
    built from the command line, so a flag that adds no parameter would otherwise change the
    model silently. Fine-tuning (:func:`starts_from_pretrained_model`) is exempt: it starts a
    new configuration on purpose."""
    @functools.wraps(load_checkpoint)
    def wrapper(cfg, trainer, **passthrough_args):
        conflicts = []
        resuming = not starts_from_pretrained_model(cfg, trainer)
        token = _resumed_with.set((trainer.cfg.model, conflicts) if resuming else None)
        try:
            loaded = load_checkpoint(cfg, trainer, **passthrough_args)
        except Exception as error:
            raise_first_conflict_instead(error, conflicts)
            raise
        finally:
            _resumed_with.reset(token)
        if conflicts:
            raise conflicts[0]
        return loaded

    return wrapper


# --------------------------------------------------------------------------------------------
# hub models read and fetch only the files the user names
# --------------------------------------------------------------------------------------------
# ``from_pretrained`` loads the checkpoint's configuration with its keyword arguments (and the BPE
# files fairseq finds in the model directory) as overrides, then builds the BPE of that
# configuration, which reads or downloads the files it names (gpt2's are URLs), and reads the
# alignment dictionary of ``generation.replace_unk`` (``GeneratorHubInterface``). So in a hub load
# a BPE is built only when the keywords name it, each of its settings comes from the keywords or
# is that BPE's default, and a replace_unk path comes from the keywords; a setting that only the
# checkpoint gives is refused before anything is read. (fairseq's tokenizers read no files.)

_hub_load = contextvars.ContextVar("fusion_fairseq_hub_load", default=False)


class CheckpointFileSettingError(ConfigurationError):
    """A hub load would read or fetch a file that the checkpoint, not the user, names."""


def checkpoint_file_settings(cfg, overrides):
    """The settings of the loaded configuration ``cfg`` that read or fetch files and that
    ``overrides`` (the keywords of ``from_pretrained``) do not give."""
    from fairseq.registry import REGISTRIES

    found = []
    bpe = stored_value(cfg, "bpe")
    if bpe not in (_ABSENT, None):
        name = stored_value(bpe, "_name")
        if overrides.get("bpe") != name:
            found.append(f"bpe {name!r}")
        else:
            defaults = REGISTRIES["bpe"]["dataclass_registry"][name]()
            found += [f"bpe {field} {stored_value(bpe, field)!r}" for field in bpe
                      if field != "_name" and field not in overrides
                      and stored_value(bpe, field) != getattr(defaults, field, _ABSENT)]
    replace_unk = stored_value(stored_value(cfg, "generation"), "replace_unk")
    if isinstance(replace_unk, str) and replace_unk and "replace_unk" not in overrides:
        found.append(f"generation replace_unk {replace_unk!r}")
    return found


def checkpoint_file_setting_errors(path, cfg, overrides):
    return [CheckpointFileSettingError(
        f"from_pretrained: checkpoint {path} sets {setting}, which would read or fetch a file the checkpoint names; "
        "pass the BPE and its files yourself (e.g. bpe='subword_nmt', bpe_codes=PATH) and replace_unk=PATH if you "
        "want one, or load a checkpoint without them") for setting in checkpoint_file_settings(cfg, overrides)]


def _marking_hub_loads(from_pretrained):
    """fairseq's ``hub_utils.from_pretrained``, telling the loader that it loads for the hub."""
    @functools.wraps(from_pretrained)
    def wrapper(*args, **kwargs):
        token = _hub_load.set(True)
        try:
            return from_pretrained(*args, **kwargs)
        finally:
            _hub_load.reset(token)

    return wrapper


def check_loaded_configurations():
    """Wrap ``checkpoint_utils.load_checkpoint_to_cpu``, ``load_model_ensemble_and_task``,
    ``load_checkpoint`` and ``hub_utils.from_pretrained`` as described in the sections above.
    Idempotent; honest checkpoints load as before."""
    from fairseq import checkpoint_utils, hub_utils

    if getattr(checkpoint_utils.load_checkpoint_to_cpu, "checks_loaded_configurations", False):
        return
    checkpoint_utils.load_checkpoint_to_cpu = _checked_reader(checkpoint_utils.load_checkpoint_to_cpu)
    checkpoint_utils.load_model_ensemble_and_task = _refusing_structural_overrides(
        checkpoint_utils.load_model_ensemble_and_task)
    checkpoint_utils.load_checkpoint = _refusing_structural_changes_on_resume(checkpoint_utils.load_checkpoint)
    hub_utils.from_pretrained = _marking_hub_loads(hub_utils.from_pretrained)


# --------------------------------------------------------------------------------------------
# configuration errors print as one line
# --------------------------------------------------------------------------------------------
# Flag values argparse cannot check alone (combinations, values read from a checkpoint or from
# --model-overrides) are checked while the model is built, after fairseq's parser is done. They
# raise ConfigurationError with a complete message, which an uncaught one prints as argparse's
# errors do: "PROG: error: MESSAGE", exit status 1, also when fairseq re-raised it as another
# exception. Every other exception, a ValueError of the plugin's own code included, keeps
# Python's traceback.


def configuration_error(error):
    """``error`` or the exception it was raised while handling (fairseq's trainer re-raises a
    failed load as "Cannot load model parameters from checkpoint ..."), whichever is a
    :class:`ConfigurationError`; None if neither is."""
    for candidate in (error, error.__cause__ or error.__context__):
        if isinstance(candidate, ConfigurationError):
            return candidate
    return None


def print_configuration_errors_in_one_line():
    """Install the ``sys.excepthook`` described above (idempotent; chains the previous hook)."""
    previous = sys.excepthook
    if getattr(previous, "prints_configuration_errors_in_one_line", False):
        return

    def excepthook(kind, error, traceback):
        cause = configuration_error(error)
        if cause is None:
            previous(kind, error, traceback)
            return
        message = str(cause) if cause is error else f"{error}: {cause}"
        sys.stderr.write(f"{os.path.basename(sys.argv[0] or 'python')}: error: {' '.join(message.splitlines())}\n")

    excepthook.prints_configuration_errors_in_one_line = True
    sys.excepthook = excepthook
