"""A flag is one field of its model's configuration dataclass: parser, checks, defaults, idle-flag
warnings and the structural list all come from it."""

import argparse
import dataclasses
from dataclasses import dataclass
from typing import Optional

import pytest
from fairseq.dataclass import FairseqDataclass
from fairseq.models import ARCH_MODEL_REGISTRY, MODEL_DATACLASS_REGISTRY

import fusion_fairseq  # noqa: F401  (registers the models)
from fusion_fairseq.checkpoint_safety import structural_flags
from fusion_fairseq.errors import ConfigurationError
from fusion_fairseq.config_fields import (
    POSITIVE_INT,
    PROBABILITY,
    SWITCH,
    Feature,
    add_flags,
    argparse_type,
    check_values,
    choice,
    fill_defaults,
    idle_flags,
    option,
    structural_fields,
)
from fusion_fairseq.tools.common import positive_int
from model_building import parse_model_args

PLUGIN_MODELS = ["fusion_transformer", "dense_transformer", "dense_fconv", "layerwise_coordination"]
WIDE = Feature(lambda args: args.kind == "wide", lambda args: f"--kind is {args.kind}")


@dataclass
class ToyConfig(FairseqDataclass):
    dropout: float = option(0.1, "dropout", PROBABILITY, declared_by_fairseq=True)
    kind: str = option("narrow", "the kind", choice(("narrow", "wide")), structural=True)
    width: int = option(None, "the width", POSITIVE_INT, metavar="N", derive=lambda args: 2 * args.size,
                        read_by=WIDE, idle_reason="only wide models have a width")
    gate: bool = option(False, "a switch", SWITCH, structural=True)
    layer: Optional[int] = option(None, "an optional layer", POSITIVE_INT)


def toy_parser():
    parser = argparse.ArgumentParser(argument_default=argparse.SUPPRESS)
    parser.add_argument("--dropout", type=float)  # fairseq's own flag, declared by fairseq
    add_flags(parser, ToyConfig)
    return parser


def test_one_field_gives_the_flag_its_check_and_its_default():
    args = toy_parser().parse_args(["--kind", "wide", "--gate"])
    assert vars(args) == {"kind": "wide", "gate": True}  # absent flags stay unset (fairseq's SUPPRESS)
    args.size = 8
    fill_defaults(args, ToyConfig)
    assert (args.width, args.layer) == (16, None) and not hasattr(args, "dropout")  # fairseq fills its own
    check_values(args, ToyConfig)


def test_the_parser_names_the_flag_and_the_text(capsys):
    with pytest.raises(SystemExit):
        toy_parser().parse_args(["--width", "two"])
    assert "--width must be a positive integer, got 'two'" in capsys.readouterr().err


@pytest.mark.parametrize("parse_type", [positive_int, argparse_type(POSITIVE_INT)], ids=["tools", "models"])
def test_the_tools_flags_accept_what_the_models_flags_accept(parse_type, capsys):
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=parse_type)
    assert parser.parse_args(["--steps", "3"]).steps == 3
    for text in ("0", "-2", "1.5", "x"):
        with pytest.raises(SystemExit):
            parser.parse_args(["--steps", text])
        assert f"argument --steps: must be a positive integer, got '{text}'" in capsys.readouterr().err


@pytest.mark.parametrize("field,value,message", [
    ("dropout", 1.0, "--dropout must be in [0, 1), got 1.0"),
    ("kind", "tall", "--kind must be one of narrow, wide, got 'tall'"),
    ("width", "16", "--width must be a positive integer, got '16'"),
    ("gate", "yes", "--gate is a switch: True or False, got 'yes'"),
    ("width", None, "--width must be a positive integer, got None"),  # derived: None is no value
])
def test_values_built_in_code_get_the_same_one_line_errors(field, value, message):
    args = argparse.Namespace(dropout=0.1, kind="wide", width=16, gate=False, layer=None)
    setattr(args, field, value)
    with pytest.raises(ConfigurationError) as error:
        check_values(args, ToyConfig)
    assert str(error.value) == message


def test_idle_flags_come_from_the_field(monkeypatch):
    from fairseq.models import ARCH_CONFIG_REGISTRY

    monkeypatch.setitem(ARCH_CONFIG_REGISTRY, "toy", lambda args: fill_defaults(args, ToyConfig))
    args = argparse.Namespace(arch="toy", size=8, kind="narrow", width=5, gate=False, layer=None)
    assert idle_flags(args, ToyConfig) == ["--width 5: only wide models have a width, and --kind is narrow"]
    args.width = 16  # the architecture's own value
    assert idle_flags(args, ToyConfig) == []


def test_structural_fields_are_marked_in_the_config():
    assert structural_fields(ToyConfig) == ("kind", "gate")


@pytest.mark.parametrize("model", PLUGIN_MODELS)
def test_every_own_field_of_a_model_is_a_flag_with_help(model):
    config = MODEL_DATACLASS_REGISTRY[model]
    parser = argparse.ArgumentParser(argument_default=argparse.SUPPRESS)
    ARCH_MODEL_REGISTRY[model].add_args(parser)
    options = {action.dest: action for action in parser._actions}
    for field in dataclasses.fields(config):
        if not field.metadata.get("declared_by_fairseq", True):
            assert options[field.name].help, field.name
            assert options[field.name].option_strings == ["--" + field.name.replace("_", "-")]


@pytest.mark.parametrize("model", PLUGIN_MODELS)
def test_checkpoint_safety_reads_the_structural_fields_of_the_config(model):
    args = parse_model_args(model)
    assert structural_flags(vars(args)) == structural_fields(MODEL_DATACLASS_REGISTRY[model])
    assert "fuse_encoder" in structural_flags({"arch": "mlrf_iwslt_de_en"})
    assert structural_flags({"arch": "transformer"}) == ()  # fairseq's own model
