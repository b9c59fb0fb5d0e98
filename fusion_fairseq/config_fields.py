"""What fairseq's configuration dataclasses lack, as field metadata: a field made by :func:`option` adds the
values it accepts, the rule deriving its default, whether it is structural and which feature reads it, from
which the checks, defaults, idle-flag warnings and structural list derive (docs/models.md, "Flags")."""

import argparse
import dataclasses
import difflib
import functools
import inspect
import logging
import re
import sys
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence

from fairseq.dataclass import FairseqDataclass
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
    choices: Optional[Sequence[str]] = None
    number: bool = False
    check: Optional[Callable[[Any], Optional[str]]] = None  # the message for an accepted value still wrong

    def error(self, flag: str, value, shown: str) -> Optional[str]:
        if self.number and (not isinstance(value, (int, float)) or isinstance(value, bool)):
            message = f"must be a number {self.description}"
        elif self.accepts(value):
            return self.check(value) if self.check else None
        else:
            message = f"must be {self.description}" if self.number else self.description
        return f"{flag} {message}, got {shown}" if flag else f"{message}, got {shown}"


def real(low: float, high: float, *, low_included: bool = True, high_included: bool = False,
         check: Optional[Callable[[Any], Optional[str]]] = None) -> Values:
    def inside(value):
        return (low < value or low_included and value == low) and (value < high or high_included and value == high)

    if high == float("inf"):
        text = f">= {low:g}" if low_included else f"> {low:g}"
    else:
        text = f"in {'[' if low_included else '('}{low:g}, {high:g}{']' if high_included else ')'}"
    return Values(text, inside, float, number=True, check=check)


def choice(options: Sequence[str]) -> Values:
    return Values(f"must be one of {', '.join(options)}", lambda value: value in options, str, tuple(options))


POSITIVE_INT = Values("must be a positive integer", lambda value: type(value) is int and value > 0, int)
NON_NEGATIVE_INT = Values("must be an integer >= 0", lambda value: type(value) is int and value >= 0, int)
INTEGER = Values("must be an integer", lambda value: type(value) is int, int)
SWITCH = Values("is a switch: True or False", lambda value: isinstance(value, bool))
PROBABILITY = real(0.0, 1.0)


@dataclass(frozen=True)
class Feature:
    """A part of a model; the flags it reads do nothing when ``present(args)`` is false, which
    ``absence(args)`` explains by the configuration (e.g. "--surface-fusion is none")."""

    present: Callable[[argparse.Namespace], bool]
    absence: Callable[[argparse.Namespace], str]


def flag_feature(name: str, present: Callable[[Any], bool] = lambda value: value not in ("none", False), *,
                 sides: bool = False) -> Feature:
    """The feature that flag ``name`` (``sides``: ``--NAME-encoder`` or ``--NAME-decoder``) switches on where
    ``present(value)``."""
    names, verb = ((f"{name}_encoder", f"{name}_decoder"), "are") if sides else ((name,), "is")
    return Feature(lambda args: any(present(getattr(args, flag)) for flag in names), lambda args: (
        f"{'/'.join(map(flag_of, names))} {verb} {'/'.join(str(getattr(args, flag)) for flag in names)}"))


def option(default=None, help: str = "", values: Optional[Values] = None, *, metavar: Optional[str] = None,
           derive: Optional[Callable[[argparse.Namespace], Any]] = None, structural: bool = False,
           read_by: Optional[Feature] = None, idle_reason: str = "", declared_by_fairseq: bool = False):
    """A configuration field. ``derive(args)``: its default from other flags; ``structural``: a checkpoint
    fixes it; ``read_by`` and ``idle_reason``: a warning when it is set and the feature is absent;
    ``declared_by_fairseq``: the flag and its default are fairseq's, the field only adds the check of its values."""
    metadata = dict(help=help, values=values, metavar=metavar, derive=derive, structural=structural,
                    read_by=read_by, idle_reason=idle_reason, declared_by_fairseq=declared_by_fairseq)
    return dataclasses.field(default=default, metadata=metadata)


def flag_of(name: str) -> str:
    return "--" + name.replace("_", "-")


def _options(config):
    """The fields made by :func:`option` (fairseq's own fields carry fairseq's metadata only)."""
    return [field for field in dataclasses.fields(config) if "values" in field.metadata]


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


def add_flags(parser, config) -> None:
    """fairseq's flags for ``config`` without defaults (the architecture fills what the user leaves unset),
    each own flag's text checked against its field's values."""
    gen_parser_from_dataclass(parser, config(), delete_default=True)
    actions = {action.dest: action for action in parser._actions}
    for field in _options(config):
        meta, action = field.metadata, actions[field.name]
        if meta["declared_by_fairseq"]:
            continue
        if meta["values"].choices:
            action.choices = meta["values"].choices
        elif meta["values"] is not SWITCH:
            action.type = argparse_type(meta["values"], flag_of(field.name))
            action.metavar = meta["metavar"]


class FlagsOfConfig:
    """A model mixin: ``add_args`` adds the base model's flags, then its registered dataclass's (:func:`add_flags`)."""

    @classmethod
    def add_args(cls, parser):
        super().add_args(parser)
        add_flags(parser, getattr(cls, "__dataclass"))  # set by fairseq's register_model


def flat_fields(config, checks: Optional[dict] = None, prefix: str = "") -> list:
    """``(name, type, field)`` of fairseq's nested ``config`` (``TransformerConfig``) under its flat legacy
    names (``encoder.embed_dim`` as ``encoder_embed_dim``), for ``dataclasses.make_dataclass``; ``checks``:
    {flat name: :class:`Values`} of the fields whose values are checked (:func:`option`, declared by fairseq)."""
    checks, flat = checks or {}, []
    for field in dataclasses.fields(config):
        name = prefix + field.name
        if field.name.startswith("_"):
            continue
        if inspect.isclass(field.type) and issubclass(field.type, FairseqDataclass):
            flat += flat_fields(field.type, checks, name + "_")
            continue
        default = field.default if field.default_factory is dataclasses.MISSING else field.default_factory()
        if isinstance(default, str):  # ${model.decoder.embed_dim}: the sibling field decoder_embed_dim
            default = re.sub(r"\$\{model\.(\w+)\.(\w+)\}", r"${.\1_\2}", default)
        flat.append((name, field.type, option(default, field.metadata["help"], checks[name], declared_by_fairseq=True)
                     if name in checks else dataclasses.field(default=default, metadata=field.metadata)))
    return flat


def as_namespace(cfg) -> argparse.Namespace:
    """A model configuration (Namespace, fairseq's DictConfig or dataclass) as a Namespace."""
    if isinstance(cfg, argparse.Namespace):
        return cfg
    if OmegaConf.is_config(cfg):
        return argparse.Namespace(**OmegaConf.to_container(cfg, resolve=True, enum_to_str=True))
    return argparse.Namespace(**vars(cfg))


def require_mergeable_model_config(config, cfg, remove_missing: bool = False) -> None:
    """Refuse to merge the plugin model dataclass ``config`` with ``cfg`` (a hydra config's ``model``) when
    ``cfg`` has a field ``config`` lacks, or names a preset and leaves fields out, which fairseq's merge
    would fill with the model's defaults before the preset could fill them with its own. A checkpoint's
    configuration (``remove_missing``) may hold fields that no longer exist: fairseq drops them."""
    from fairseq.models import ARCH_MODEL_NAME_REGISTRY

    if remove_missing or not _options(config):
        return  # a checkpoint's, or not the plugin's
    name, known = cfg.get("_name"), [field.name for field in dataclasses.fields(config)]
    for key in cfg:
        if key not in known:
            close = difflib.get_close_matches(key, known, n=1)
            hint = f"did you mean {close[0]}? " if close else ""
            raise ConfigurationError(f"model.{key} is no field of {name}: {hint}(the fields are the flags of "
                                     f"fairseq-train --arch {name}, with _ for -)")
    model = ARCH_MODEL_NAME_REGISTRY.get(name, name)
    left_out = [key for key in known if key not in cfg]
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


def fill_defaults(args, config) -> None:
    """Give every own field the user left unset (absent or None) its default, in field order (a derived
    default may read fields above it)."""
    for field in _options(config):
        if getattr(args, field.name, None) is None and not field.metadata["declared_by_fairseq"]:
            derive = field.metadata["derive"]
            setattr(args, field.name, derive(args) if derive else field.default)


def set_defaults(args, **defaults) -> None:
    """A preset's defaults: each flag the user left unset takes the preset's value."""
    for name, value in defaults.items():
        if getattr(args, name, None) is None:
            setattr(args, name, value)


def check_values(args, config, name: Callable[[str], str] = flag_of) -> None:
    """Raise :class:`ConfigurationError` for the first field (in field order) whose value its flag does not accept;
    ``name(field)`` names it (a hydra config's: ``model.FIELD``)."""
    for field in _options(config):
        meta = field.metadata
        if meta["values"] is None or not hasattr(args, field.name):
            continue
        value = getattr(args, field.name)
        if value is None and field.default is None and meta["derive"] is None:
            continue  # None is this field's "off"
        message = meta["values"].error(name(field.name), value, repr(value))
        if message:
            raise ConfigurationError(message)


def structural_fields(config) -> tuple:
    return tuple(field.name for field in dataclasses.fields(config) if field.metadata.get("structural"))


def idle_flags(args, config) -> list:
    """The fields read by an absent feature that the user set (a value other than the architecture's own,
    or typed on the command line), each with the reason. A checkpoint's configuration holds every flag, at
    the architecture's value where the user gave none: no warning then. The architecture's own value comes
    from running it (``_name``, else ``arch``, else the model that registered ``config``) on a copy of
    ``args`` without the flag, so that a preset's own value (e.g. mlrf_nist_zh_en's independent W1) is
    never taken for the user's."""
    from fairseq.models import ARCH_CONFIG_REGISTRY, MODEL_DATACLASS_REGISTRY

    idle = []
    for field in _options(config):
        feature, flag = field.metadata["read_by"], flag_of(field.name)
        if feature is None or feature.present(args):
            continue
        value = getattr(args, field.name)
        typed = any(word == flag or word.startswith(flag + "=") for word in sys.argv[1:])  # then the user's choice
        arch = getattr(args, "_name", None) or getattr(args, "arch", None) or next(
            model for model, registered in MODEL_DATACLASS_REGISTRY.items()
            if registered.__qualname__ == config.__qualname__)
        probe = argparse.Namespace(**{name: setting for name, setting in vars(args).items() if name != field.name})
        ARCH_CONFIG_REGISTRY[arch](probe)
        if value == getattr(probe, field.name) and not typed:
            continue
        given = flag if isinstance(value, bool) else f"{flag} {value}"
        idle.append(f"{given}: {field.metadata['idle_reason']}, and {feature.absence(args)}")
    return idle


def warn_idle_flags(args, config) -> None:
    """Warnings, not errors: a configuration with an idle flag still means what it says, and
    checkpoints trained with one must keep loading."""
    for text in idle_flags(args, config):
        logger.warning("flag without effect: %s", text)
