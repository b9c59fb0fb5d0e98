"""Loading untrusted checkpoints and configurations safely, one section per property of docs/safety.md
(what holds, and why)."""

import argparse
import ast
import collections
import contextvars
import dataclasses
import enum
import functools
import itertools
import logging
import os
import pickle
import re
import typing

import torch
from omegaconf import DictConfig, ListConfig
from omegaconf.base import ContainerMetadata, Metadata
from omegaconf.errors import OmegaConfBaseException
from omegaconf.nodes import AnyNode, BooleanNode, FloatNode, IntegerNode, StringNode

from .errors import ConfigurationError

logger = logging.getLogger(__name__)

# types, no callables: configuration containers and the types omegaconf metadata names (``ref_type`` ...)
FAIRSEQ_CHECKPOINT_TYPES = (argparse.Namespace, collections.defaultdict, typing.Any, dict, list, int, float, bool,
                            str, DictConfig, ListConfig, ContainerMetadata, Metadata, AnyNode, BooleanNode,
                            FloatNode, IntegerNode, StringNode)


class CheckpointContentError(ConfigurationError):
    """A checkpoint file fairseq cannot use as it is (one line naming it)."""


class _TorchReadingWeightsOnly:
    """torch for fairseq's ``checkpoint_utils``, whose ``load`` always passes ``weights_only=True``: fairseq's
    main branch passes False (#5611), which would run a crafted pickle."""

    def __getattr__(self, name):
        return getattr(torch, name)

    @staticmethod
    def load(file, *args, **kwargs):
        path = getattr(file, "name", file)
        try:
            state = torch.load(file, *args, **{**kwargs, "weights_only": True})
        except pickle.UnpicklingError as error:
            # torch words a global of a module it blocks (posix, for os.system) otherwise than one it does not allow
            refused = re.search(r"GLOBAL ([\w.]+)", str(error))
            if refused is None:
                raise damaged_file_error(path, error) from None
            raise CheckpointContentError(f"{path}: cannot read the checkpoint safely (Unsupported global: GLOBAL "
                                         f"{refused.group(1)}): a fairseq checkpoint holds tensors and configuration "
                                         "types only") from None
        except (EOFError, RuntimeError) as error:  # RuntimeError: torch's zip reader
            raise damaged_file_error(path, error) from None
        if not isinstance(state, dict) or not isinstance(state.get("model"), dict):
            raise CheckpointContentError(f"{path}: cannot read the checkpoint: it has no 'model' entry of parameters "
                                         "(not a fairseq checkpoint of a model)")
        for name, tensor in state["model"].items():
            what = (type(tensor).__name__ if not isinstance(tensor, torch.Tensor)
                    else "a meta tensor, without data" if tensor.is_meta
                    else f"a complex tensor ({tensor.dtype})" if tensor.is_complex() else None)
            if what:
                raise CheckpointContentError(f"{path}: cannot read the checkpoint: parameter {name} is {what}; a "
                                             "model's parameters are real tensors with data")
        require_model_configuration(state, path)
        return state


def require_model_configuration(state, path):
    """fairseq builds the model from the legacy ``args`` (a Namespace) or else ``cfg.model``; a checkpoint with
    neither failed inside fairseq's upgrade of the state (``cfg.model = None``: a TypeError) or named no
    architecture."""
    args, cfg = state.get("args"), state.get("cfg")
    if args is not None and not isinstance(args, argparse.Namespace):
        raise CheckpointContentError(f"{path}: cannot read the checkpoint: its legacy 'args' is a "
                                     f"{type(args).__name__}, not the argparse.Namespace fairseq stores there")
    model = stored_value(cfg, "model")
    if args is None and not isinstance(model, (dict, DictConfig, argparse.Namespace)):
        held = "no 'cfg'" if cfg is None else "no 'cfg.model'" if model in (_ABSENT, None) \
            else f"a cfg.model of type {type(model).__name__}"
        raise CheckpointContentError(f"{path}: cannot read the checkpoint: it stores no model configuration (no legacy "
                                     f"'args', and {held}); fairseq builds the model from one of them")


def read_checkpoint_state(path):
    """The state stored in checkpoint ``path``, read weights-only and checked as fairseq's reader is made to check
    it (a file it cannot use is a one-line :class:`CheckpointContentError`); fairseq's upgrades not applied, and
    fairseq's own reader left as it is (only torch's allow-list gains fairseq's configuration types)."""
    torch.serialization.add_safe_globals(list(FAIRSEQ_CHECKPOINT_TYPES))
    return _TorchReadingWeightsOnly.load(path, map_location="cpu")


def damaged_file_error(path, error: Exception) -> CheckpointContentError:
    """A file torch cannot read weights-only that carries no refused global: empty, cut short, no pickle, or a pickle
    opcode outside the weights-only set; named in one line with torch's reason (its unpickler's, where it gives one)."""
    text = str(error)
    found = re.search(r"Unsupported operand \S+", text)
    lines = text.strip().splitlines()
    reason = found.group(0) if found else lines[0] if lines else "the file is empty or cut short"
    return CheckpointContentError(f"{path}: cannot read the checkpoint, the file is damaged or not a fairseq checkpoint "
                                  f"({type(error).__name__}: {reason})")


def read_checkpoints_safely():
    """Allow-list :data:`FAIRSEQ_CHECKPOINT_TYPES` and the placeholders of the tensors in the checkpoint that rank 0
    broadcasts when a training resumes on several ranks; make fairseq's reader read weights only (idempotent)."""
    from fairseq import checkpoint_utils
    from fairseq.distributed.utils import _TensorPlaceholder

    torch.serialization.add_safe_globals([*FAIRSEQ_CHECKPOINT_TYPES, _TensorPlaceholder])
    if not isinstance(checkpoint_utils.torch, _TorchReadingWeightsOnly):
        checkpoint_utils.torch = _TorchReadingWeightsOnly()


# --- configuration strings are parsed, never evaluated ----------------------------------------
# fairseq eval()s the ConvS2S layer specs, ``adaptive_softmax_cutoff`` and ``xformers_att_config``
# while building a model. Items are bounded over the whole value (each repetition and concatenation
# counted), so that a crafted "[0] * 10**12" cannot exhaust memory.
MAX_LIST_LENGTH = 10_000
_LITERAL_CONSTANTS = (int, float, str, bool, type(None))
_TOO_MANY = f"only list + list and list * N giving at most {MAX_LIST_LENGTH} items are allowed"


def shown(text: str) -> str:
    """``text`` quoted for a one-line message, its first 200 characters where it is longer."""
    return repr(text) if len(text) <= 200 else f"{text[:200]!r}... ({len(text)} characters)"


def parse_config_literal(text, flag: str):
    """The value of configuration string ``text`` (of ``flag``), read without running code: literals, a
    leading sign and fairseq's ``[...] * N + [...]``; else a ``ConfigurationError``. Bytes are refused
    (``eval`` runs them as it runs a string); other non-strings are returned as they are."""
    if isinstance(text, (bytes, bytearray)):
        raise ConfigurationError(f"{flag} holds {type(text).__name__}, not a literal string; allowed: numbers, "
                                 "strings, tuples, lists and dicts of them")
    if not isinstance(text, str):
        return text

    def refuse(why):
        return ConfigurationError(
            f"{flag} {shown(text)} is not a literal ({why}); allowed: numbers, strings, tuples, lists and dicts of "
            f"them, and list repetition/concatenation such as [(512, 3)] * 4 + [(1024, 3)], at most {MAX_LIST_LENGTH} "
            "items in all")

    try:
        return _literal(ast.parse(text.strip(), mode="eval").body, refuse)[0]
    except SyntaxError:
        raise refuse("it does not parse") from None
    except RecursionError:  # "[0]+[0]+..." thousands of terms long
        raise refuse("it is nested too deeply") from None


def _literal(node, refuse):
    """``(value, items)`` of ``node``: ``items`` counts the elements of its tuples, lists and dicts."""
    def bounded(items):
        if items > MAX_LIST_LENGTH:
            raise refuse(_TOO_MANY)
        return items

    if isinstance(node, ast.Constant) and isinstance(node.value, _LITERAL_CONSTANTS):
        return node.value, 0
    if isinstance(node, (ast.Tuple, ast.List)):
        parts = [_literal(child, refuse) for child in node.elts]
        items = bounded(len(parts) + sum(count for _, count in parts))
        values = [value for value, _ in parts]
        return (tuple(values) if isinstance(node, ast.Tuple) else values), items
    if isinstance(node, ast.Dict) and None not in node.keys:  # an entry counts once, not as a key and a value
        (keys, key_items), (values, value_items) = (_literal(ast.Tuple(node.keys), refuse),
                                                    _literal(ast.List(node.values), refuse))
        for key in keys:
            try:
                hash(key)
            except TypeError:
                raise refuse(f"the dict key {key!r} is not hashable") from None
        return dict(zip(keys, values)), bounded(key_items + value_items - len(keys))
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        operand, _ = _literal(node.operand, refuse)
        if isinstance(operand, (int, float)) and not isinstance(operand, bool):
            return (-operand if isinstance(node.op, ast.USub) else operand), 0
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Mult)):
        (left, left_items), (right, right_items) = _literal(node.left, refuse), _literal(node.right, refuse)
        if isinstance(node.op, ast.Add) and isinstance(left, (list, tuple)) and type(left) is type(right):
            return left + right, bounded(left_items + right_items)
        sequence, items, count = (left, left_items, right) if isinstance(left, (list, tuple)) \
            else (right, right_items, left)
        if isinstance(node.op, ast.Mult) and isinstance(sequence, (list, tuple)) and type(count) is int \
                and count >= 0:
            items = bounded(items * count)  # before the repetition
            return sequence * count, items
        raise refuse(_TOO_MANY)
    raise refuse(f"it contains {type(node).__name__}")


def require_literal_transformer_config(args):
    """Check the strings fairseq's Transformer evaluates while building (flat or in the nested
    ``encoder`` / ``decoder`` configs) before it does: literals, so its ``eval`` runs no code."""
    from fairseq.models.transformer import TransformerConfig

    cfg = TransformerConfig.from_namespace(args)
    for flag, value in (("--adaptive-softmax-cutoff", cfg.adaptive_softmax_cutoff),
                        ("--encoder-xformers-att-config", cfg.encoder.xformers_att_config),
                        ("--decoder-xformers-att-config", cfg.decoder.xformers_att_config)):
        parse_config_literal(value, flag)


# --- a checkpoint's evaluated configuration is checked when it is read -------------------------
# A load without a task builds the stored task (and fairseq-validate the stored criterion), which
# eval() these fields: left_pad_* (multilingual tasks' ``utils.eval_bool``), feature_encoder_spec
# (audio_pretraining) and wer_args (the ctc criterion); any task's field must hold a literal. The
# model fields are every one that fairseq 0.12.3's own models eval() while building (ConvS2S and its
# language model and self-attention variant, lightconv, transformer_lm, wav2vec, HuBERT, the
# pipeline-parallel Transformer, the Transformer's cutoff and xformers configs), checked whatever the
# architecture so that a checkpoint of fairseq's own models runs no code either.

EVALUATED_FIELDS = {
    "task": {"left_pad_source": bool, "left_pad_target": bool, "feature_encoder_spec": object},
    "criterion": {"wer_args": object},
    "model": dict.fromkeys((
        "adaptive_input_cutoff", "adaptive_softmax_cutoff", "character_filters", "conv_aggregator_layers",
        "conv_feature_layers", "decoder_attention", "decoder_layers", "downsample", "encoder_attention",
        "encoder_layers", "gated_attention", "override_encoder_layers", "pipeline_balance", "pipeline_devices",
        "pipeline_encoder_balance", "pipeline_encoder_devices", "pipeline_decoder_balance",
        "pipeline_decoder_devices", "pretrained", "project_input", "self_attention", "xformers_att_config",
        "encoder_xformers_att_config", "decoder_xformers_att_config"), object),
}
_ABSENT = object()


def stored_value(section, field: str):
    """``field`` of a stored Namespace, omegaconf node or dict; ``_ABSENT`` when it has none or its
    interpolation does not resolve (then fairseq cannot read it either)."""
    if isinstance(section, argparse.Namespace):
        section = vars(section)
    try:
        return section[field] if isinstance(section, (dict, DictConfig)) and field in section else _ABSENT
    except OmegaConfBaseException:
        return _ABSENT


def evaluated_sections(state, name: str) -> list:
    """Where a checkpoint stores the configuration of its ``name`` (task, criterion, model): the legacy flat
    ``args`` and the ``cfg`` section, and for the model their nested ``encoder`` / ``decoder`` configs."""
    sections = [state.get("args"), stored_value(state.get("cfg"), name)]
    if name == "model":
        sections += [stored_value(section, side) for section in sections for side in ("encoder", "decoder")]
    return sections


def require_literal_evaluated_fields(state, path):
    """Refuse, naming ``path`` and the field, a field of :data:`EVALUATED_FIELDS` that is not a literal."""
    for name, fields in EVALUATED_FIELDS.items():
        evaluated = f"fairseq would evaluate it when building the {name}"
        for section, (field, kind) in itertools.product(evaluated_sections(state, name), fields.items()):
            text, where = stored_value(section, field), f"checkpoint {path}: {name} {field}"
            if kind is object and isinstance(text, str) and not text.strip():
                continue  # "" is a default (HuBERT's override_encoder_layers), left unevaluated or failing to parse
            try:
                value = parse_config_literal(text, where)
            except ConfigurationError as error:
                value = error
            if kind is bool and isinstance(text, str) and not isinstance(value, bool):
                raise CheckpointContentError(f"{where} {shown(text)} is not True or False; {evaluated}")
            if isinstance(value, ConfigurationError):
                raise CheckpointContentError(f"{value}; {evaluated}")


# A model built from a checkpoint would read the pretrained embeddings it names (any file, a FIFO,
# /dev/zero), which its own weights replace anyway: the reader forgets those paths.
EMBEDDING_FILE_FIELDS = ("encoder_embed_path", "decoder_embed_path")


def forget_embedding_files(state):
    """The embedding paths of ``args`` / ``cfg.model`` and of their nested encoder/decoder set to None."""
    for config in (state.get("args"), stored_value(state.get("cfg"), "model")):
        places = [(config, field) for field in EMBEDDING_FILE_FIELDS]
        places += [(stored_value(config, side), "embed_path") for side in ("encoder", "decoder")]
        for section, field in places:
            if stored_value(section, field) not in (_ABSENT, None):
                (vars(section) if isinstance(section, argparse.Namespace) else section)[field] = None


# --- the structure a checkpoint was trained with ---------------------------------------------
# Structural flags (attention heads, a dense connection, ...) may change no parameter's name or shape,
# so fairseq's strict load passes and the model computes another function: an override or a resumed
# training may give one only the stored value, or where the stored configuration lacks the field
# (saved before the flag existed). The refusal comes after the load, so that missing parameters are
# named first.

def stored_model_config(state):
    """The model configuration of a checkpoint state: legacy ``args`` or ``cfg.model``."""
    args = state.get("args")
    return args if args is not None else stored_value(state.get("cfg"), "model")


# fairseq builds the model ``_name`` names, else the one ``arch`` names
ARCHITECTURE_FIELDS = ("_name", "arch")


def architecture(model_config):
    names = [stored_value(model_config, field) for field in ARCHITECTURE_FIELDS]
    return next((name for name in names if isinstance(name, str)), None)


def structural_flags(model_config):
    """The fields a plugin architecture's dataclass marks structural (``config_fields.flag``); none for fairseq's."""
    from fairseq.models import ARCH_MODEL_NAME_REGISTRY, MODEL_DATACLASS_REGISTRY

    from .config_fields import structural_fields

    config = MODEL_DATACLASS_REGISTRY.get(ARCH_MODEL_NAME_REGISTRY.get(architecture(model_config)))
    return structural_fields(config) if config is not None else ()


# fairseq's own flags that fix the function a trained model computes, for every architecture
FAIRSEQ_STRUCTURAL_FIELDS = tuple(f"{side}_{name}" for side in ("encoder", "decoder") for name in (
    "layers", "embed_dim", "ffn_embed_dim", "attention_heads", "normalize_before", "learned_pos")) + (
    "decoder_output_dim", "decoder_input_dim", "decoder_out_embed_dim", "activation_fn", "no_scale_embedding",
    "layernorm_embedding", "no_token_positional_embeddings", "share_all_embeddings",
    "share_decoder_input_output_embed", "cross_self_attention", "no_decoder_final_norm", "adaptive_softmax_cutoff")


def structure(model_config):
    """``{"arch": architecture, field: value or _ABSENT}`` of the fairseq and plugin structural fields; a choice
    as its string (a command line's configuration holds fairseq's ``ChoiceEnum`` members, whose repr is unquoted)."""
    values = {flag: stored_value(model_config, flag)
              for flag in (*FAIRSEQ_STRUCTURAL_FIELDS, *structural_flags(model_config))}
    return {"arch": architecture(model_config),
            **{flag: value.value if isinstance(value, enum.Enum) else value for flag, value in values.items()}}


def _same_value(override, trained):
    return override == trained or str(override) == str(trained)  # --model-overrides may hand in '2' for 2


def structural_differences(config, other):
    """``(field, value, other value)`` for each structural field both configurations hold, differently."""
    mine, theirs = structure(config), structure(other)
    return [(field, mine[field], theirs[field]) for field in mine
            if mine[field] is not _ABSENT and theirs.get(field, _ABSENT) is not _ABSENT
            and not _same_value(theirs[field], mine[field])]


def structural_override_errors(path, stored_config, overrides):
    """A ``ConfigurationError`` for each override of a structural field (or the architecture)
    that the stored configuration holds with another value."""
    trained = structure(stored_config)
    fields = {flag: "arch" if flag in ARCHITECTURE_FIELDS else flag for flag in overrides}
    return [ConfigurationError(
        f"--model-overrides sets {flag} {value!r} but checkpoint {path} was trained with {fields[flag]} "
        f"{trained[fields[flag]]!r}: a structural flag cannot change at load (the model would compute another "
        "function); load it without that override, or start a model of the new configuration from it with "
        "fairseq-train --finetune-from-model"
    ) for flag, value in overrides.items()
        if trained.get(fields[flag], _ABSENT) is not _ABSENT and not _same_value(value, trained[fields[flag]])]


def require_known_architecture(state, path):
    """Refuse an architecture fairseq does not know (it fails deep in its registries otherwise) and, for
    the plugin's, LayerDrop pruning (``*_layers_to_keep``), which their models do not build, and a configuration
    without one of their structural fields: fairseq stores every field, so the checkpoint is older than the flag
    (of an unreleased version of the plugin) or damaged, and the flag's default today may compute another
    function (dense aggregation was ``--dense-connection literal`` before the flag, ``layernorm`` by default now).
    fairseq's ``--model-overrides`` set only the fields a configuration stores, so they cannot supply it."""
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
    missing = [field for field in structural_flags(config) if stored_value(config, field) is _ABSENT]
    if missing:
        raise CheckpointContentError(
            f"{path}: the checkpoint's configuration of {name} stores no {', '.join(missing)}: it is older than "
            "these flags (an unreleased version of the plugin) or damaged, and their defaults today may compute "
            "another function than the one trained; it cannot be loaded as trained")


# --- what a checkpoint holds fits its model -----------------------------------------------------
# Weights that are NaN or infinite load and fail later (the sequence generator's assertions) or not at all
# (fairseq-validate reports a NaN loss and exits 0); weights of another shape, missing or extra fail fairseq's
# strict load, whose 25-line traceback is read here for the first parameter it names.

def require_finite_weights(state, path):
    for name, tensor in state["model"].items():
        if tensor.is_floating_point():
            bad = tensor.numel() - int(torch.isfinite(tensor).sum())
            if bad:
                raise CheckpointContentError(
                    f"{path}: parameter {name} holds {bad} NaN or infinite value{'s' * (bad > 1)} of {tensor.numel()}; "
                    "a model's weights are finite numbers (a training that diverged, or an edited file)")


# torch's strict load_state_dict: (its words for a parameter, what they mean), the most telling first
_STRICT_LOAD_FAULTS = (
    (re.compile(r"size mismatch for ([\w.]+): copying a param with shape torch\.Size\((\[[\d, ]*\])\) from "
                r"checkpoint, the shape in current model is torch\.Size\((\[[\d, ]*\])\)"),
     "has shape {1} in the checkpoint but {2} in {model}"),
    (re.compile(r'Missing key\(s\) in state_dict: "([\w.]+)"'), "is missing from the checkpoint"),
    (re.compile(r'Unexpected key\(s\) in state_dict: "([\w.]+)"'),
     "is not a parameter of {model}"),
)


def unfit_weights_error(error, path, fine_tuning=False):
    """For torch's strict-load error (or the error fairseq's trainer raised while handling it), a one-line
    ``CheckpointContentError`` naming ``path`` and the first parameter that does not fit; else None. Fine-tuning
    loads the checkpoint's weights into the command line's model, which is then what they do not fit."""
    model = "the command line's model" if fine_tuning else "the model its configuration builds"
    for candidate in (error, error.__cause__ or error.__context__):
        text = str(candidate) if isinstance(candidate, RuntimeError) else ""
        if path is None or not text.startswith("Error(s) in loading state_dict"):
            continue
        for pattern, meaning in _STRICT_LOAD_FAULTS:
            found = pattern.search(text)
            if found:
                what = meaning.format(*found.groups(), model=model)
                why = ("--finetune-from-model starts fresh only the fusion parameters the checkpoint lacks; every "
                       "other parameter must match the checkpoint's" if fine_tuning else
                       "the checkpoint does not hold the weights of the configuration it stores")
                return CheckpointContentError(f"{path}: parameter {found.group(1)} {what}; {why}")
    return None


def misfit_value_error(error, path, overrides):
    """For omegaconf's refusal of a value while fairseq merges a checkpoint's model configuration into the model's
    dataclass (``denseformer_dilation`` 'x', ``adaptive_softmax_cutoff`` '5,10' where a list is due: a 60-line
    traceback), a one-line ``CheckpointContentError`` naming ``path``, the field, its value and its type; else None."""
    key = getattr(error, "key", None)
    if path is None or not isinstance(error, OmegaConfBaseException) or key is None:
        return None
    fields = {field.name: field.type for field in dataclasses.fields(error.object_type)} \
        if dataclasses.is_dataclass(error.object_type) else {}
    kind = fields.get(key)
    allowed = "" if kind is None else f" of type {type_name(kind)}"
    source = "given by --model-overrides" if key in (overrides or {}) else "as stored"
    reason = str(error.msg).strip().splitlines()[0]
    return CheckpointContentError(f"checkpoint {path}: {key} {error.value!r} ({source}) is not a value{allowed} "
                                  f"(omegaconf: {reason})")


def type_name(kind) -> str:
    """A dataclass field's type as its annotation reads: ``int``, ``Optional[List[int]]``."""
    return kind.__name__ if isinstance(kind, type) else str(kind).replace("typing.", "")


def missing_adaptive_softmax_error(error, path):
    """fairseq's ``AdaptiveSoftmax`` refuses a state without its ``version`` buffer (a configuration that sets
    ``adaptive_softmax_cutoff`` over weights trained without one) in words naming neither the file nor the
    parameter: a one-line ``CheckpointContentError`` naming both; else None."""
    if path is None or type(error) is not Exception or str(error) != "This version of the model is no longer supported":
        return None
    frame = error.__traceback__
    while frame.tb_next is not None:  # the innermost frame is AdaptiveSoftmax.upgrade_state_dict_named
        frame = frame.tb_next
    name = frame.tb_frame.f_locals.get("version_name", "adaptive_softmax.version")
    return CheckpointContentError(
        f"{path}: parameter {name} is missing from the checkpoint: its configuration builds an adaptive softmax "
        "(adaptive_softmax_cutoff) and it holds none; the checkpoint does not hold the weights of the configuration "
        "it stores")


def file_named_error(error, path):
    """The plugin's refusal of the configuration a checkpoint stores (a value its flag does not allow, a missing
    fusion parameter) names the flag: with ``checkpoint PATH:`` before it where it does not name the file."""
    if path is None or type(error) is not ConfigurationError or str(path) in str(error):
        return None
    return ConfigurationError(f"checkpoint {path}: {error}")


def one_line_load_error(error, load):
    """A failed load's error as one line naming the file it read, or None where ``error`` is already one."""
    return (unfit_weights_error(error, load.read, load.fine_tuning)
            or misfit_value_error(error, load.read, load.overrides)
            or missing_adaptive_softmax_error(error, load.read) or file_named_error(error, load.read))


# --- why fairseq loads a checkpoint ------------------------------------------------------------
# fairseq's two entry points, ``load_checkpoint`` (fairseq-train) and ``load_model_ensemble_and_task``
# (everything else), both call the reader ``load_checkpoint_to_cpu``, which cannot see why it loads: each
# entry point records its load. Only fine-tuning (Dou et al. start aggregation from a vanilla model) starts
# the parameters a checkpoint lacks fresh; every other load is fairseq's strict one.

class _Load:
    def __init__(self, fine_tuning=False, resumed_with=None, hub=False, read=None, overrides=None, model=None):
        self.fine_tuning, self.hub, self.overrides = fine_tuning, hub, overrides
        self.resumed_with = resumed_with  # the command line's model configuration of a training (fairseq-train)
        self.model = model  # fine-tuning: the model the checkpoint initialises
        self.conflicts = []  # structural changes found by the reader
        self.read = read  # the checkpoint file the reader read last (else the one the entry point was given)


_load = contextvars.ContextVar("fusion_fairseq_load", default=None)


def _training_load(cfg, trainer, **kwargs):
    fine_tuning = starts_from_pretrained_model(cfg, trainer)
    return _Load(fine_tuning=fine_tuning, resumed_with=trainer.cfg.model,
                 model=trainer.get_model() if fine_tuning else None)


def starts_from_pretrained_model(cfg, trainer) -> bool:
    """fairseq's rule (``load_checkpoint``): --finetune-from-model is read only on a first launch: the default
    --restore-file, no --continue-once, no checkpoint_last.pt in --save-dir."""
    if cfg.finetune_from_model is None or cfg.restore_file != "checkpoint_last.pt" \
            or getattr(cfg, "continue_once", None) is not None:
        return False
    return not os.path.exists(os.path.join(cfg.save_dir, f"checkpoint_last{trainer.checkpoint_suffix}.pt"))


def start_missing_parameters_fresh(state, model):
    """Fine-tuning ``model`` from a checkpoint that holds none of the parameters its fusion adds (a vanilla
    Transformer's, ``model.parameter_starts_fresh``): those keep their fresh values, every other one is loaded.
    A checkpoint holding some of them is left to the strict load."""
    starts_fresh = getattr(model, "parameter_starts_fresh", None)
    if starts_fresh is None or any(starts_fresh(name) for name in state["model"]):
        return
    fresh = {name: value.clone() for name, value in model.state_dict().items() if starts_fresh(name)}
    if fresh:
        logger.info("the checkpoint has no fusion parameters (a vanilla transformer's): %d fusion tensors keep "
                    "their fresh initialisation", len(fresh))
        state["model"].update(fresh)


def _checked_reader(read):
    """fairseq's ``load_checkpoint_to_cpu`` (``read``) checking each state it returns."""
    @functools.wraps(read)
    def load_checkpoint_to_cpu(path, arg_overrides=None, load_on_all_ranks=False):
        state = read(path, arg_overrides, load_on_all_ranks)
        require_known_architecture(state, path)
        require_finite_weights(state, path)
        require_literal_evaluated_fields(state, path)
        forget_embedding_files(state)
        load = _load.get()
        if load:
            load.read = path
        if load and load.model is not None:
            start_missing_parameters_fresh(state, load.model)
        if load and arg_overrides and \
                {*structure(stored_model_config(state)), *ARCHITECTURE_FIELDS} & set(arg_overrides):
            # the state holds the overridden values: read the stored ones (only for such overrides)
            stored = stored_model_config(read(path, None, load_on_all_ranks))
            load.conflicts.extend(structural_override_errors(path, stored, arg_overrides))
        if load and load.resumed_with is not None and not load.fine_tuning:  # fine-tuning changes it on purpose
            load.conflicts.extend(ConfigurationError(
                f"fairseq-train resumes from {path}, trained with {flag} {trained!r}, but the command line gives "
                f"{flag} {given!r}: a structural flag cannot change when training resumes; train into another "
                "--save-dir, or start a model of the new configuration from it with --finetune-from-model"
            ) for flag, trained, given in structural_differences(stored_model_config(state), load.resumed_with))
        return state

    load_checkpoint_to_cpu.checks_loaded_configurations = True
    return load_checkpoint_to_cpu


FAIRSEQ_LOAD_FAILURE = re.compile(r"Cannot load model parameters from checkpoint (.+); please ensure")


def read_what_rank_0_read(error):
    """In a training of several processes fairseq reads the checkpoint on rank 0 only and sends the others its
    state: a process that read nothing reads the file fairseq's error names once its load has failed, so that it
    too finds a structural change and names it (else the launcher showed whichever rank's error came first)."""
    from fairseq import checkpoint_utils

    found = FAIRSEQ_LOAD_FAILURE.match(str(error))
    if found and os.path.isfile(found.group(1)):
        checkpoint_utils.load_checkpoint_to_cpu(found.group(1))  # the checked reader records what it finds


def _recording(entry_point, describe=None, after=None):
    """``entry_point`` run with the :class:`_Load` ``describe(*args, **kwargs)`` (else a plain one) recorded. The first
    structural change found, or error ``after(loaded, *args, **kwargs)`` finds, is raised, also instead of the error
    of a load it made fail unless that error is the plugin's own (the error of missing parameters names them)."""
    @functools.wraps(entry_point)
    def wrapper(*args, **kwargs):
        load = describe(*args, **kwargs) if describe else _Load()
        token = _load.set(load)
        try:
            loaded = entry_point(*args, **kwargs)
        except Exception as error:
            if load.read is None and load.resumed_with is not None:
                read_what_rank_0_read(error)
            if load.conflicts and configuration_error(error) is None:
                raise load.conflicts[0] from None
            refusal = one_line_load_error(error, load)
            if refusal is not None:
                raise refusal from None
            raise
        finally:
            _load.reset(token)
        if after:
            load.conflicts.extend(after(loaded, *args, **kwargs))
        if load.conflicts:
            raise load.conflicts[0]
        return loaded

    return wrapper


# --- hub models read and fetch only the files the user names ----------------------------------
# ``from_pretrained`` builds the loaded configuration's BPE, which reads or downloads its files, and
# reads the ``generation.replace_unk`` dictionary: such a setting must come from the keywords (or be
# the BPE's default). fairseq's tokenizers read no files.

def _hub_file_setting_errors(loaded, filenames, arg_overrides=None, *args, **kwargs):
    """In a hub load (``from_pretrained``'s, recorded around this one), an error for each setting of the loaded
    configuration that reads or fetches files and that the keywords (``arg_overrides``) do not give."""
    from fairseq.registry import REGISTRIES

    if not getattr(_load.get(), "hub", False):
        return []
    cfg, overrides, found = loaded[1], arg_overrides or {}, []
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
    return [ConfigurationError(
        f"from_pretrained: checkpoint {filenames[0]} sets {setting}, which would read or fetch a file the checkpoint "
        "names; pass the BPE and its files yourself (e.g. bpe='subword_nmt', bpe_codes=PATH) and replace_unk=PATH if "
        "you want one, or load a checkpoint without them"
    ) for setting in found]


def _ensemble_load(filenames=(), arg_overrides=None, *args, **kwargs):
    """A load of ``filenames`` (the analysis scripts hand in the state they read: then no reader names the file)."""
    return _Load(read=next(iter(filenames), None), overrides=arg_overrides)


def check_loaded_configurations():
    """Wrap fairseq's reader, its two entry points and ``from_pretrained`` (idempotent). ``load_model_ensemble``
    and the CLIs look the functions up in ``checkpoint_utils`` when they call them."""
    from fairseq import checkpoint_utils, hub_utils

    if getattr(checkpoint_utils.load_checkpoint_to_cpu, "checks_loaded_configurations", False):
        return
    checkpoint_utils.load_checkpoint_to_cpu = _checked_reader(checkpoint_utils.load_checkpoint_to_cpu)
    checkpoint_utils.load_model_ensemble_and_task = _recording(checkpoint_utils.load_model_ensemble_and_task,
                                                               _ensemble_load, after=_hub_file_setting_errors)
    checkpoint_utils.load_checkpoint = _recording(checkpoint_utils.load_checkpoint, _training_load)
    hub_utils.from_pretrained = _recording(hub_utils.from_pretrained, lambda *args, **kwargs: _Load(hub=True))


# --- the plugin's error behind one fairseq re-raised ----------------------------------------------

def configuration_error(error):
    """``error`` or the one it was raised while handling (fairseq's trainer re-raises a failed load),
    whichever is a :class:`ConfigurationError`; else None."""
    candidates = (error, error.__cause__ or error.__context__)
    return next((candidate for candidate in candidates if isinstance(candidate, ConfigurationError)), None)
