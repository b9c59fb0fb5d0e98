"""Loading untrusted checkpoints and configurations safely.

Since torch 2.6, ``torch.load`` defaults to ``weights_only=True`` and refuses every global that is
not allow-listed, so ``fairseq-generate`` could load no fairseq checkpoint: they store their
configuration as an ``argparse.Namespace`` (legacy ``args`` / ``cfg.model``) or, in older files, as
omegaconf containers. The plugin allow-lists exactly the types found in such files (listed by
``torch.serialization.get_unsafe_globals_in_checkpoint`` on checkpoints of fairseq-train and on
omegaconf-configured ones) and makes fairseq's reader read weights only; any other global, e.g. a
callable smuggled in a crafted pickle, is still refused. Beyond that:

* configuration strings fairseq would ``eval()`` are parsed as literals first, those of a
  checkpoint's stored task and criterion when the file is read;
* the pretrained-embedding files a checkpoint's model configuration names are forgotten;
* hub models read or fetch no file that only the checkpoint names;
* only fairseq-train's --finetune-from-model may start parameters a checkpoint lacks, and neither
  --model-overrides nor a resumed training may change the structure a checkpoint was trained with;
* the plugin's configuration errors print as one line.
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

# types, not callables with side effects: configuration containers and the plain type objects that
# omegaconf metadata refers to as ``ref_type`` / ``object_type`` / ``element_type``
FAIRSEQ_CHECKPOINT_TYPES = (argparse.Namespace, collections.defaultdict, typing.Any, dict, list, int, float, bool,
                            str, DictConfig, ListConfig, ContainerMetadata, Metadata, AnyNode, BooleanNode,
                            FloatNode, IntegerNode, StringNode)


class CheckpointContentError(ConfigurationError):
    """A checkpoint file fairseq cannot use as it is (one line naming it)."""


class _TorchReadingWeightsOnly:
    """torch as fairseq's ``checkpoint_utils`` sees it, except that ``load`` always unpickles with
    ``weights_only=True``: fairseq's main branch passes ``weights_only=False`` (since "Pt2.6
    compatibility", #5611), which would run a crafted pickle; ve-fairseq 0.12.3 passes nothing.
    A refused global, and a state fairseq cannot use, fail in one line naming the file."""

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


def require_model_parameters(state, path):
    """Refuse a state without a ``model`` dict of real tensors that hold data."""
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


def read_checkpoints_safely():
    """Allow-list :data:`FAIRSEQ_CHECKPOINT_TYPES` and make fairseq's reader read weights only (idempotent)."""
    from fairseq import checkpoint_utils

    torch.serialization.add_safe_globals(list(FAIRSEQ_CHECKPOINT_TYPES))
    if not isinstance(checkpoint_utils.torch, _TorchReadingWeightsOnly):
        checkpoint_utils.torch = _TorchReadingWeightsOnly()


# --- configuration strings are parsed, never evaluated ----------------------------------------
# fairseq eval()s some configuration strings while building a model: the ConvS2S layer specs
# (``fconv``), ``adaptive_softmax_cutoff`` (``utils.eval_str_list``) and ``xformers_att_config``
# (``utils.eval_str_dict`` in every ``MultiheadAttention``). A checkpoint stores them, so a
# crafted one would run code on load: the plugin parses them first and refuses non-literals.

# A layer spec such as "[(128, 3)] * 9 + [(256, 3)] * 4" repeats lists: this bounds the items of the
# whole value (nested ones, each repetition and concatenation counted), so that a crafted count
# cannot exhaust memory or time.
MAX_LIST_LENGTH = 10_000
_LITERAL_CONSTANTS = (int, float, str, bool, type(None))
_TOO_MANY = f"only list + list and list * N giving at most {MAX_LIST_LENGTH} items are allowed"


class ConfigLiteralError(ConfigurationError):
    """A configuration string that is not a plain literal."""


def parse_config_literal(text, flag: str):
    """The value of configuration string ``text`` (the value of ``flag``), read without running
    code: numbers, strings, booleans, ``None``, tuples, lists and dicts of them, a leading sign, and
    fairseq's list arithmetic ``[...] * N`` and ``[...] + [...]``, at most :data:`MAX_LIST_LENGTH`
    items in all; anything else raises :class:`ConfigLiteralError`. Non-strings are returned as is."""
    if not isinstance(text, str):
        return text

    def refuse(why):
        shown = repr(text) if len(text) <= 200 else f"{text[:200]!r}... ({len(text)} characters)"
        return ConfigLiteralError(
            f"{flag} {shown} is not a literal ({why}); allowed: numbers, strings, tuples, lists and dicts of them, "
            f"and list repetition/concatenation such as [(512, 3)] * 4 + [(1024, 3)], at most {MAX_LIST_LENGTH} "
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
    if isinstance(node, (ast.Tuple, ast.List)) or isinstance(node, ast.Dict) and None not in node.keys:
        is_dict = isinstance(node, ast.Dict)
        parts = [_literal(child, refuse) for child in (node.keys + node.values if is_dict else node.elts)]
        values = [value for value, _ in parts]
        items = len(parts) // (2 if is_dict else 1) + sum(count for _, count in parts)
        if not is_dict:
            return tuple(values) if isinstance(node, ast.Tuple) else values, bounded(items)
        keys = values[:len(node.keys)]
        for key in keys:
            try:
                hash(key)
            except TypeError:
                raise refuse(f"the dict key {key!r} is not hashable") from None
        return dict(zip(keys, values[len(keys):])), bounded(items)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        operand, _ = _literal(node.operand, refuse)
        if isinstance(operand, (int, float)) and not isinstance(operand, bool):
            return (-operand if isinstance(node.op, ast.USub) else operand), 0
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Mult)):
        (left, left_items), (right, right_items) = _literal(node.left, refuse), _literal(node.right, refuse)
        if isinstance(node.op, ast.Add) and isinstance(left, (list, tuple)) and type(left) is type(right):
            items = bounded(left_items + right_items)
            return left + right, items
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


# --- a checkpoint's task and criterion configuration is checked when it is read ---------------
# Loading a checkpoint without a task (fairseq-validate, hub models, the analysis scripts) builds
# the task stored in it, and fairseq-validate its stored criterion, whose code eval()s some strings
# whatever the architecture:
#   left_pad_source, left_pad_target   ``utils.eval_bool`` in multilingual_translation (and
#                                      semisupervised_translation), online_backtranslation and
#                                      translation_multi_simple_epoch (MultilingualDatasetManager)
#   feature_encoder_spec               ``eval`` in audio_pretraining's RawAudioDataset
#   wer_args                           ``eval`` in the ctc criterion
# ``checkpoint_utils.load_checkpoint_to_cpu`` is fairseq's one reader of checkpoint files, so each
# of these fields in the stored ``cfg.task`` / ``cfg.criterion`` and in a legacy flat ``args`` must be
# a literal (True or False for the booleans) in every state it returns, even in a task that does not
# have the field: an honest configuration holds literals there.

EVALUATED_FIELDS = {
    "task": {"left_pad_source": bool, "left_pad_target": bool, "feature_encoder_spec": object},
    "criterion": {"wer_args": object},
}
_ABSENT = object()


def stored_value(section, field: str):
    """``field`` of a stored configuration section (a Namespace, an omegaconf node or a dict);
    ``_ABSENT`` when it has no such field or its interpolation does not resolve (then fairseq
    cannot read it either)."""
    from omegaconf.errors import OmegaConfBaseException

    if isinstance(section, argparse.Namespace):
        return getattr(section, field, _ABSENT)
    if not isinstance(section, (dict, DictConfig)) or field not in section:
        return _ABSENT
    try:
        return section[field]
    except OmegaConfBaseException:
        return _ABSENT


def require_literal_task_and_criterion(state, path):
    """Refuse, naming ``path`` and the field, any field of :data:`EVALUATED_FIELDS` in ``state``
    that fairseq would evaluate to anything but a literal."""
    args = state.get("args")
    sections = [("task", args), ("criterion", args)] if isinstance(args, argparse.Namespace) else []
    sections += [(name, stored_value(state.get("cfg"), name)) for name in EVALUATED_FIELDS]
    for name, section in sections:
        for field, kind in EVALUATED_FIELDS[name].items():
            text = stored_value(section, field)
            if not isinstance(text, str):
                continue
            where = f"checkpoint {path}: {name} {field}"
            evaluated = f"fairseq would evaluate it when building the {name}"
            try:
                value = parse_config_literal(text, where)
            except ConfigLiteralError as error:
                value = error
            if kind is bool and not isinstance(value, bool):
                raise ConfigLiteralError(f"{where} {text!r} is not True or False; {evaluated}")
            if isinstance(value, ConfigLiteralError):
                raise ConfigLiteralError(f"{value}; {evaluated}")


# A model built from a checkpoint's configuration (every load but fairseq-train's) would read the
# pretrained embeddings it names (fairseq's ``parse_embedding`` in the Transformer's and ConvS2S's
# build_model): any file, a FIFO that blocks for ever, /dev/zero that fills memory. The
# checkpoint's own weights replace them, so the reader forgets those paths first.
EMBEDDING_FILE_FIELDS = ("encoder_embed_path", "decoder_embed_path")


def forget_embedding_files(state):
    """Set the pretrained-embedding paths of the flat ``args`` / ``cfg.model`` and of their nested
    encoder/decoder configs to None."""
    for config in (state.get("args"), stored_value(state.get("cfg"), "model")):
        places = [(config, field) for field in EMBEDDING_FILE_FIELDS]
        places += [(stored_value(config, side), "embed_path") for side in ("encoder", "decoder")]
        for section, field in places:
            if stored_value(section, field) not in (_ABSENT, None):
                if isinstance(section, argparse.Namespace):
                    setattr(section, field, None)
                else:
                    section[field] = None


# --- the structure a checkpoint was trained with ---------------------------------------------
# Several flags change the model without changing any parameter's name or shape (a dense
# connection with its LayerNorm, the aggregation residuals, attention heads, ...): fairseq's strict
# load passes and the model computes another function. So a load through
# ``load_model_ensemble_and_task`` (fairseq-generate, -interactive, -validate, hub models, the
# analysis scripts) may override a structural field only where the checkpoint's stored model
# configuration lacks it (saved before the flag existed: the model's own checks then name the
# value it needs) or holds the same value, and fairseq-train may resume only with the structure
# it was trained with. Tuning flags (dropouts, SurfaceFusion's lambda and tau, DropConnect) and
# the analysis flag ``mask_encoder_layer`` stay free. The refusal comes after the load itself,
# so an override that needs parameters the checkpoint lacks still fails naming them.

class StructuralOverrideError(ConfigurationError):
    """--model-overrides or a resumed training changes a structural flag against the checkpoint."""


def stored_model_config(state):
    """The model configuration of a checkpoint state: legacy ``args`` or ``cfg.model``."""
    args = state.get("args")
    return args if args is not None else stored_value(state.get("cfg"), "model")


# fairseq builds the model ``_name`` names, else the one ``arch`` names
ARCHITECTURE_FIELDS = ("_name", "arch")


def architecture(model_config):
    for field in ARCHITECTURE_FIELDS:
        value = stored_value(model_config, field)
        if isinstance(value, str):
            return value
    return None


def structural_flags(model_config):
    """The fields the registered dataclass of a plugin architecture marks ``structural`` (see
    ``fusion_fairseq.config_fields``); none for fairseq's own models."""
    from fairseq.models import ARCH_MODEL_NAME_REGISTRY, MODEL_DATACLASS_REGISTRY
    from fusion_fairseq.config_fields import structural_fields

    config = MODEL_DATACLASS_REGISTRY.get(ARCH_MODEL_NAME_REGISTRY.get(architecture(model_config)))
    return structural_fields(config) if config is not None else ()


# fairseq's own flags that fix the function a trained model computes, for every architecture: its
# sizes, and heads, activation, LayerNorm placement, embedding scale and sharing, which change no
# parameter's name or shape.
FAIRSEQ_STRUCTURAL_FIELDS = tuple(f"{side}_{name}" for side in ("encoder", "decoder") for name in (
    "layers", "embed_dim", "ffn_embed_dim", "attention_heads", "normalize_before", "learned_pos")) + (
    "decoder_output_dim", "decoder_input_dim", "decoder_out_embed_dim", "activation_fn", "no_scale_embedding",
    "layernorm_embedding", "no_token_positional_embeddings", "share_all_embeddings",
    "share_decoder_input_output_embed", "cross_self_attention", "no_decoder_final_norm", "adaptive_softmax_cutoff")


def structure(model_config):
    """``{"arch": architecture, field: value}`` for :data:`FAIRSEQ_STRUCTURAL_FIELDS` and the
    model's :func:`structural_flags` (``_ABSENT`` where the configuration lacks the field)."""
    return {"arch": architecture(model_config),
            **{flag: stored_value(model_config, flag)
               for flag in (*FAIRSEQ_STRUCTURAL_FIELDS, *structural_flags(model_config))}}


def _same_value(override, trained):
    return override == trained or str(override) == str(trained)  # --model-overrides may hand in '2' for 2


def structural_differences(config, other):
    """``(field, value, other value)`` for each structural field both configurations hold, differently."""
    mine, theirs = structure(config), structure(other)
    return [(field, mine[field], theirs[field]) for field in mine
            if mine[field] is not _ABSENT and theirs.get(field, _ABSENT) is not _ABSENT
            and not _same_value(theirs[field], mine[field])]


def structural_override_errors(path, stored_config, overrides):
    """A :class:`StructuralOverrideError` for each override of a structural field (the architecture
    included) that the stored configuration holds with another value."""
    trained = structure(stored_config)
    fields = {flag: "arch" if flag in ARCHITECTURE_FIELDS else flag for flag in overrides}
    return [StructuralOverrideError(
        f"--model-overrides sets {flag} {value!r} but checkpoint {path} was trained with {fields[flag]} "
        f"{trained[fields[flag]]!r}: a structural flag cannot change at load (the model would compute another "
        "function); load it without that override, or start a model of the new configuration from it with "
        "fairseq-train --finetune-from-model"
    ) for flag, value in overrides.items()
        if trained.get(fields[flag], _ABSENT) is not _ABSENT and not _same_value(value, trained[fields[flag]])]


def structural_resume_errors(path, stored_config, command_line_config):
    return [StructuralOverrideError(
        f"fairseq-train resumes from {path}, trained with {flag} {trained!r}, but the command line gives "
        f"{flag} {given!r}: a structural flag cannot change when training resumes; train into another "
        "--save-dir, or start a model of the new configuration from it with --finetune-from-model"
    ) for flag, trained, given in structural_differences(stored_config, command_line_config)]


def require_known_architecture(state, path):
    """Refuse an architecture fairseq does not know (it fails deep in its registries otherwise) and,
    for the plugin's, LayerDrop pruning (``*_layers_to_keep``), which fairseq applies to the
    parameters but the plugin's models do not build."""
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


# --- why fairseq loads a checkpoint ------------------------------------------------------------
# fairseq loads checkpoint files through two entry points: ``checkpoint_utils.load_checkpoint``
# (fairseq-train: fine-tuning, or resuming from checkpoint_last.pt) and
# ``load_model_ensemble_and_task`` (everything else); both call the reader
# ``load_checkpoint_to_cpu``, and the model hook ``upgrade_state_dict_named``, which cannot see why
# it loads. So each entry point records its load while it runs. Only fine-tuning may start the
# parameters a checkpoint lacks fresh (Dou et al. initialise their aggregation models from a
# trained vanilla model); so may a ``model.load_state_dict(...)`` called in code, which is the
# caller's own initialisation.

class _Load:
    def __init__(self, fine_tuning=False, overrides_checked=False, resumed_with=None, hub=False):
        self.fine_tuning, self.overrides_checked, self.hub = fine_tuning, overrides_checked, hub
        self.resumed_with = resumed_with  # the command line's model configuration of a resumed training
        self.conflicts = []  # structural changes found by the reader


_load = contextvars.ContextVar("fusion_fairseq_load", default=None)


def may_start_parameters_fresh() -> bool:
    """False only inside a load of a checkpoint file that is not fine-tuning."""
    load = _load.get()
    return load is None or load.fine_tuning


def starts_from_pretrained_model(cfg, trainer) -> bool:
    """fairseq's own rule (``checkpoint_utils.load_checkpoint``): --finetune-from-model is read
    only on a first launch, i.e. with the default --restore-file, no --continue-once and no
    checkpoint_last.pt in --save-dir; otherwise training resumes from that checkpoint."""
    if cfg.finetune_from_model is None or cfg.restore_file != "checkpoint_last.pt":
        return False
    if getattr(cfg, "continue_once", None) is not None:
        return False
    return not os.path.exists(os.path.join(cfg.save_dir, f"checkpoint_last{trainer.checkpoint_suffix}.pt"))


class MissingParametersError(ConfigurationError):
    """A checkpoint lacks parameters of the model's configuration outside fine-tuning."""


def missing_parameters_error(names, what: str) -> MissingParametersError:
    return MissingParametersError(
        f"the checkpoint has no {what} parameters but this configuration needs {len(names)}: "
        f"{', '.join(sorted(names))}; only fairseq-train --finetune-from-model may start them fresh "
        "(load the checkpoint with the configuration it was trained with, e.g. without --model-overrides "
        "that switch fusion on, or train into an empty --save-dir)"
    )


def _checked_reader(read):
    """fairseq's ``load_checkpoint_to_cpu`` (``read``) checking each state it returns."""
    @functools.wraps(read)
    def load_checkpoint_to_cpu(path, arg_overrides=None, load_on_all_ranks=False):
        state = read(path, arg_overrides, load_on_all_ranks)
        require_known_architecture(state, path)
        require_literal_task_and_criterion(state, path)
        forget_embedding_files(state)
        load = _load.get()
        if load and load.overrides_checked and arg_overrides and \
                {*structure(stored_model_config(state)), *ARCHITECTURE_FIELDS} & set(arg_overrides):
            # the state holds the overridden values: read the stored ones (only for such overrides)
            stored = stored_model_config(read(path, None, load_on_all_ranks))
            load.conflicts.extend(structural_override_errors(path, stored, arg_overrides))
        if load and load.resumed_with is not None:
            load.conflicts.extend(structural_resume_errors(path, stored_model_config(state), load.resumed_with))
        return state

    load_checkpoint_to_cpu.checks_loaded_configurations = True
    return load_checkpoint_to_cpu


def _recording(entry_point, describe, after=None):
    """``entry_point`` run with the :class:`_Load` ``describe(*args, **kwargs)`` recorded; then the
    first structural change found is raised, instead of the error of a load that failed because of
    it (e.g. fairseq's strict load of the parameters of another fusion function), unless that
    error is the plugin's own (:class:`MissingParametersError` names the parameters)."""
    @functools.wraps(entry_point)
    def wrapper(*args, **kwargs):
        load = describe(*args, **kwargs)
        token = _load.set(load)
        try:
            loaded = entry_point(*args, **kwargs)
        except Exception as error:
            if load.conflicts and configuration_error(error) is None:
                raise load.conflicts[0] from None
            raise
        finally:
            _load.reset(token)
        if after:
            load.conflicts.extend(after(load, loaded, *args, **kwargs))
        if load.conflicts:
            raise load.conflicts[0]
        return loaded

    return wrapper


def _training_load(cfg, trainer, **passthrough_args):
    """fairseq-train's model is built from its command line: fine-tuning starts a new configuration
    on purpose, but resuming with another structure would change the model silently."""
    fine_tuning = starts_from_pretrained_model(cfg, trainer)
    return _Load(fine_tuning=fine_tuning, resumed_with=None if fine_tuning else trainer.cfg.model)


# --- hub models read and fetch only the files the user names ----------------------------------
# ``from_pretrained`` loads the checkpoint's configuration with its keyword arguments as overrides,
# then builds the BPE of that configuration, which reads or downloads the files it names (gpt2's
# are URLs), and reads the alignment dictionary of ``generation.replace_unk``. So in a hub load a
# BPE is built only when the keywords name it, each of its settings comes from the keywords or is
# that BPE's default, and a replace_unk path comes from the keywords; a setting that only the
# checkpoint gives is refused before anything is read. (fairseq's tokenizers read no files.)

class CheckpointFileSettingError(ConfigurationError):
    """A hub load would read or fetch a file that the checkpoint, not the user, names."""


def checkpoint_file_settings(cfg, overrides):
    """The settings of the loaded ``cfg`` that read or fetch files and that ``overrides`` (the
    keywords of ``from_pretrained``) do not give."""
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


def _ensemble_load(*args, **kwargs):
    outer = _load.get()
    return _Load(overrides_checked=True, hub=outer is not None and outer.hub)


def _hub_file_setting_errors(load, loaded, filenames, arg_overrides=None, *args, **kwargs):
    return [] if not load.hub else [CheckpointFileSettingError(
        f"from_pretrained: checkpoint {filenames[0]} sets {setting}, which would read or fetch a file the checkpoint "
        "names; pass the BPE and its files yourself (e.g. bpe='subword_nmt', bpe_codes=PATH) and replace_unk=PATH if "
        "you want one, or load a checkpoint without them"
    ) for setting in checkpoint_file_settings(loaded[1], arg_overrides or {})]


def check_loaded_configurations():
    """Wrap fairseq's reader, its two loading entry points and ``hub_utils.from_pretrained`` as
    described above (idempotent; honest checkpoints load as before). ``load_model_ensemble`` and
    the CLIs look the functions up in ``checkpoint_utils`` when they call them."""
    from fairseq import checkpoint_utils, hub_utils

    if getattr(checkpoint_utils.load_checkpoint_to_cpu, "checks_loaded_configurations", False):
        return
    checkpoint_utils.load_checkpoint_to_cpu = _checked_reader(checkpoint_utils.load_checkpoint_to_cpu)
    checkpoint_utils.load_model_ensemble_and_task = _recording(
        checkpoint_utils.load_model_ensemble_and_task, _ensemble_load, after=_hub_file_setting_errors)
    checkpoint_utils.load_checkpoint = _recording(checkpoint_utils.load_checkpoint, _training_load)
    hub_utils.from_pretrained = _recording(hub_utils.from_pretrained, lambda *args, **kwargs: _Load(hub=True))


# --- configuration errors print as one line ---------------------------------------------------
# Values argparse cannot check alone (combinations, values read from a checkpoint or from
# --model-overrides) are checked while the model is built, after fairseq's parser is done. An
# uncaught ConfigurationError, also one fairseq re-raised as another exception, prints as
# argparse's errors do: "PROG: error: MESSAGE", exit status 1. Every other exception, a ValueError
# of the plugin's own code included, keeps Python's traceback.

def configuration_error(error):
    """``error`` or the exception it was raised while handling (fairseq's trainer re-raises a
    failed load as "Cannot load model parameters from checkpoint ..."), whichever is a
    :class:`ConfigurationError`; None if neither is."""
    for candidate in (error, error.__cause__ or error.__context__):
        if isinstance(candidate, ConfigurationError):
            return candidate
    return None


def print_configuration_errors_in_one_line():
    previous = sys.excepthook
    if getattr(previous, "prints_configuration_errors_in_one_line", False):
        return

    def excepthook(kind, error, traceback):
        cause = configuration_error(error)
        if cause is None:
            return previous(kind, error, traceback)
        message = str(cause) if cause is error else f"{error}: {cause}"
        sys.stderr.write(f"{os.path.basename(sys.argv[0] or 'python')}: error: {' '.join(message.splitlines())}\n")

    excepthook.prints_configuration_errors_in_one_line = True
    sys.excepthook = excepthook
