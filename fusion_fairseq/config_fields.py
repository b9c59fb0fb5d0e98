"""How the plugin's models use fairseq's configuration. Each model's flags are the fields of one
``FairseqDataclass``, each option one field carrying fairseq's metadata (``help``; choices as ``ChoiceEnum``)
and what a type cannot say (:func:`flag`: the values it accepts, whether a checkpoint fixes it), and each
model has one validation function, called by ``build_model``, that checks the values and the combinations
and names idle flags. This module holds the vocabulary that function speaks: what a flag accepts
(:class:`Values`), the one-line errors, and the glue to fairseq's parser and hydra merge (docs/models.md,
"Flags")."""

import argparse
import dataclasses
import difflib
import enum
import functools
import logging
from dataclasses import dataclass
from typing import Any, Callable, Dict, Optional

from fairseq.dataclass.utils import gen_parser_from_dataclass
from omegaconf import OmegaConf

from fusion_fairseq.errors import ConfigurationError

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Values:
    """What a flag accepts; ``convert`` turns command-line text into a value. For a ``number`` range
    (:func:`real`), text that is no number is told so."""

    description: str  # completes "--flag ..., got X", e.g. "must be a positive integer"; a range: "in [0, 1)"
    accepts: Callable[[Any], bool]
    convert: Callable[[str], Any] = str
    number: bool = False

    def error(self, flag: str, value, shown: str) -> Optional[str]:
        if self.number and (not isinstance(value, (int, float)) or isinstance(value, bool)):
            message = f"must be a number {self.description}"
        elif self.accepts(value):
            return None
        else:
            message = f"must be {self.description}" if self.number else self.description
        return f"{flag} {message}, got {shown}" if flag else f"{message}, got {shown}"


def real(low: float, high: float, *, low_included: bool = True, high_included: bool = False) -> Values:
    def inside(value):
        return (low < value or low_included and value == low) and (value < high or high_included and value == high)

    if high == float("inf"):
        text = f">= {low:g}" if low_included else f"> {low:g}"
    else:
        text = f"in {'[' if low_included else '('}{low:g}, {high:g}{']' if high_included else ')'}"
    return Values(text, inside, float, number=True)


def choice(options) -> Values:
    return Values(f"must be one of {', '.join(options)}", lambda value: value in options)


POSITIVE_INT = Values("must be a positive integer", lambda value: type(value) is int and value > 0, int)
NON_NEGATIVE_INT = Values("must be an integer >= 0", lambda value: type(value) is int and value >= 0, int)
INTEGER = Values("must be an integer", lambda value: type(value) is int, int)
SWITCH = Values("is a switch: True or False", lambda value: isinstance(value, bool))
PROBABILITY = real(0.0, 1.0)


def flag(default, help: str, values: Optional[Values] = None, structural: bool = False):
    """A field of a model's configuration: its default and its help, fairseq's metadata, and where a type
    cannot say it (e.g. "positive"), what it accepts; ``structural``: a checkpoint fixes it (the parameters or
    what the model computes with them change), so checkpoint_safety refuses it as an override."""
    metadata = {"help": help}
    if values is not None:
        metadata["values"] = values
    if structural:
        metadata["structural"] = True
    return dataclasses.field(default=default, metadata=metadata)


def structural_fields(config) -> tuple:
    return tuple(field.name for field in dataclasses.fields(config) if field.metadata.get("structural"))


def flag_of(name: str) -> str:
    return "--" + name.replace("_", "-")


def argparse_type(values: Values, flag: str = ""):
    """The argparse ``type`` that accepts ``values``; ``flag`` is named in the message as :func:`check_values` does."""

    def parse(text):
        try:
            value = values.convert(text)
        except ValueError:
            value = text  # the check names it
        message = values.error(flag, value, repr(text))
        if message:
            raise argparse.ArgumentTypeError(message)
        return value

    return parse


def choices_of(field: dataclasses.Field) -> Optional[tuple]:
    """The values of a field typed by fairseq's ``ChoiceEnum``, else None."""
    kind = field.type
    return tuple(member.value for member in kind) if isinstance(kind, type) and issubclass(kind, enum.Enum) else None


def field_values(config) -> Dict[str, Values]:
    """{field: what it accepts} of ``config``, in field order: its ``values`` (:func:`flag`; fairseq's
    dropouts among them), else the plugin's own fields typed by fairseq's ``ChoiceEnum`` or ``bool``."""
    own = {field.name for field in own_fields(config)}
    values = {}
    for field in dataclasses.fields(config):
        options = choices_of(field)
        if "values" in field.metadata:
            values[field.name] = field.metadata["values"]
        elif field.name in own and options is not None:
            values[field.name] = choice(options)
        elif field.name in own and field.type is bool:
            values[field.name] = SWITCH
    return values


class FlagsOfConfig:
    """A model mixin: ``add_args`` adds the base model's flags, then its registered dataclass's, as
    fairseq does, without defaults (the architecture fills what the user leaves unset); an own flag with
    ``values`` has its text checked as it is parsed, naming the flag."""

    @classmethod
    def add_args(cls, parser):
        super().add_args(parser)
        config = getattr(cls, "__dataclass")  # set by fairseq's register_model
        gen_parser_from_dataclass(parser, config(), delete_default=True)
        ranges = {field.name: field.metadata["values"] for field in own_fields(config) if "values" in field.metadata}
        for action in parser._actions:  # fairseq's own flags keep fairseq's parsing
            if action.dest in ranges:
                action.type = argparse_type(ranges[action.dest], flag_of(action.dest))


def as_namespace(cfg) -> argparse.Namespace:
    """A model configuration (Namespace, fairseq's DictConfig or dataclass) as a Namespace."""
    if isinstance(cfg, argparse.Namespace):
        return cfg
    if OmegaConf.is_config(cfg):
        return argparse.Namespace(**OmegaConf.to_container(cfg, resolve=True, enum_to_str=True))
    return argparse.Namespace(**vars(cfg))


def set_defaults(args, **defaults) -> None:
    """A preset's defaults: each flag the user left unset (absent or None) takes the preset's value."""
    for name, value in defaults.items():
        if getattr(args, name, None) is None:
            setattr(args, name, value)


def own_fields(config) -> list:
    """The fields the plugin declares in ``config``: not those of fairseq's classes, nor of a class holding
    fairseq's flags (``fairseqs_flags = True``, e.g. its Transformer's flattened), which fairseq's
    architectures fill and fairseq's parser parses."""
    classes = (config if isinstance(config, type) else type(config)).__mro__
    own = {name for klass in classes if not (klass.__module__.startswith("fairseq") or vars(klass).get("fairseqs_flags"))
           for name in vars(klass).get("__annotations__", {})}
    return [field for field in dataclasses.fields(config) if field.name in own]


def fill_defaults(args, config) -> None:
    """Give every own field of ``config`` the user left unset (absent or None) its dataclass default; a
    default that depends on other flags (None in the dataclass) is the model's to fill after."""
    for field in own_fields(config):
        interpolated = isinstance(field.default, str) and field.default.startswith("${")  # the task's, II(...)
        if getattr(args, field.name, None) is None and not interpolated:
            setattr(args, field.name, field.default)


def field_defaults(config) -> Dict[str, Any]:
    return {field.name: field.default for field in dataclasses.fields(config)}


def check_values(args, config, name: Callable[[str], str] = flag_of, derived=()) -> None:
    """Raise :class:`ConfigurationError` for the first field of ``config`` (in field order) whose value its
    flag does not accept (:func:`field_values`); ``name(field)`` names it (a hydra config's: ``model.FIELD``).
    None is the "off" of a field whose default is None, except for the ``derived`` ones (filled before)."""
    defaults = field_defaults(config)
    for field, values in field_values(config).items():
        if not hasattr(args, field):
            continue
        value = getattr(args, field)
        if value is None and defaults[field] is None and field not in derived:
            continue
        message = values.error(name(field), value, repr(value))
        if message:
            raise ConfigurationError(message)


def warn_idle_flags(args, idle: Dict[str, tuple], defaults: Dict[str, Any]) -> None:
    """Warn about each flag of ``idle`` ({flag: (what it acts on, why that is absent)}, the flags whose feature
    the configuration lacks) set to something other than its default. Warnings, not errors: such a
    configuration still means what it says, and checkpoints trained with one must keep loading."""
    for name, (reason, absence) in idle.items():
        value = getattr(args, name)
        if value != defaults[name]:
            given = flag_of(name) if isinstance(value, bool) else f"{flag_of(name)} {value}"
            logger.warning("flag without effect: %s: %s, and %s", given, reason, absence)


def require_mergeable_model_config(config, cfg, remove_missing: bool = False) -> None:
    """Refuse to merge the plugin model dataclass ``config`` with ``cfg`` (a hydra config's ``model``) when
    ``cfg`` has a field ``config`` lacks, or names a preset and leaves fields out, which fairseq's merge
    would fill with the model's defaults before the preset could fill them with its own. A checkpoint's
    configuration (``remove_missing``) may hold fields that no longer exist: fairseq drops them."""
    from fairseq.models import ARCH_MODEL_NAME_REGISTRY, MODEL_DATACLASS_REGISTRY

    is_model_config = (config if isinstance(config, type) else type(config)) in MODEL_DATACLASS_REGISTRY.values()
    if remove_missing or not is_model_config or not own_fields(config):
        return  # a checkpoint's, a criterion's or scheduler's (fairseq's merge refuses), or not the plugin's
    name, fields = cfg.get("_name"), {field.name: field for field in dataclasses.fields(config)}
    for key in cfg:
        if key not in fields:
            close = difflib.get_close_matches(key, list(fields), n=1)
            hint = f"did you mean {close[0]}? " if close else ""
            raise ConfigurationError(f"model.{key} is no field of {name}: {hint}(the fields are the flags of "
                                     f"fairseq-train --arch {name}, with _ for -)")
        options, value = choices_of(fields[key]), cfg[key]
        if options is not None and value is not None and str(value) not in options:  # else omegaconf's traceback
            raise ConfigurationError(choice(options).error(f"model.{key}", value, repr(value)))
    model = ARCH_MODEL_NAME_REGISTRY.get(name, name)
    left_out = [key for key in fields if key not in cfg]
    if name != model and left_out:
        raise ConfigurationError(
            f"model._name {name} is a preset of {model}, which fills only what the command line leaves unset; a hydra "
            f"config gets {model}'s defaults for the fields it leaves out ({', '.join(left_out[:3])}, ...): name "
            f"_name: {model} and set the preset's fields (examples/hydra/mlrf.yaml)")


def check_model_configs() -> None:
    """Make fairseq's ``merge_with_parent`` (in ``dataclass.utils`` and ``models``) refuse first, in one
    line, a plugin model configuration that :func:`require_mergeable_model_config` refuses."""
    from fairseq import models
    from fairseq.dataclass import utils

    merge_with_parent = utils.merge_with_parent  # which fairseq.models imports
    if getattr(merge_with_parent, "checks_model_configs", False):
        return

    @functools.wraps(merge_with_parent)
    def checking(dc, cfg, remove_missing=False):
        require_mergeable_model_config(dc, cfg, remove_missing)
        return merge_with_parent(dc, cfg, remove_missing)

    checking.checks_model_configs = True
    utils.merge_with_parent = models.merge_with_parent = checking
