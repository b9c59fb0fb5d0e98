"""A flag is one field of its model's fairseq dataclass (help, ChoiceEnum choices, and in its metadata the range
of values it accepts and its structural mark); its idle-flag rule is the model's, read by one validation function."""

import argparse
import dataclasses
import os
import subprocess
import sys
from argparse import Namespace
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Optional

import pytest
import torch
from fairseq import checkpoint_utils
from fairseq.dataclass import ChoiceEnum, FairseqDataclass
from fairseq.models import ARCH_MODEL_REGISTRY, MODEL_DATACLASS_REGISTRY

import fusion_fairseq.models  # noqa: F401  (registers the plugin)
from fusion_fairseq.checkpoint_safety import structural_flags
from fusion_fairseq.errors import ConfigurationError
from fusion_fairseq.config_fields import (
    POSITIVE_INT, PROBABILITY, FlagsOfConfig, argparse_type, check_values, field_values, fill_defaults, flag, own_fields,
    structural_fields, warn_idle_flags,
)
from fusion_lab.common import positive_int
from conftest import USER_DIR
from model_building import dictionary_of_size, parse_model_args

PLUGIN_MODELS = ["fusion_transformer", "dense_transformer", "dense_fconv", "layerwise_coordination"]


@dataclass
class FairseqsFlags(FairseqDataclass):
    fairseqs_flags = True
    dropout: float = field(default=0.1, metadata={"help": "dropout", "values": PROBABILITY})


@dataclass
class ToyConfig(FairseqsFlags):
    kind: ChoiceEnum(("narrow", "wide")) = field(default="narrow", metadata={"help": "the kind"})
    width: Optional[int] = flag(None, "the width", values=POSITIVE_INT, structural=True)
    gate: bool = flag(False, "a switch")
    layer: Optional[int] = flag(None, "an optional layer", values=POSITIVE_INT)


class FairseqsModel:
    @classmethod
    def add_args(cls, parser):
        parser.add_argument("--dropout", type=float)  # fairseq's own flag, declared by fairseq


class ToyModel(FlagsOfConfig, FairseqsModel):
    pass


setattr(ToyModel, "__dataclass", ToyConfig)  # as fairseq's register_model does


def toy_parser():
    parser = argparse.ArgumentParser(argument_default=argparse.SUPPRESS)
    ToyModel.add_args(parser)
    return parser


def test_the_plugins_fields_are_its_own_fairseqs_are_fairseqs():
    assert [item.name for item in own_fields(ToyConfig)] == ["kind", "width", "gate", "layer"]


def test_fairseqs_parser_reads_the_fields_and_the_own_ranges():
    args = toy_parser().parse_args(["--kind", "wide", "--gate", "--dropout", "1.5"])  # fairseq's --dropout: fairseq's
    assert vars(args) == {"kind": "wide", "gate": True, "dropout": 1.5}  # absent flags stay unset (fairseq's SUPPRESS)
    fill_defaults(args, ToyConfig)
    assert (args.width, args.layer, args.dropout) == (None, None, 1.5)  # the model derives width; fairseq fills its own


def test_the_parser_names_the_flag_and_the_text(capsys):
    for flags, message in ((["--width", "two"], "--width must be a positive integer, got 'two'"),
                           (["--kind", "tall"], "argument --kind: invalid choice: 'tall'")):
        with pytest.raises(SystemExit):
            toy_parser().parse_args(flags)
        assert message in capsys.readouterr().err


@pytest.mark.parametrize("parse_type", [positive_int, argparse_type(POSITIVE_INT)], ids=["tools", "models"])
def test_the_tools_flags_accept_what_the_models_flags_accept(parse_type, capsys):
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=parse_type)
    assert parser.parse_args(["--steps", "3"]).steps == 3
    for text in ("0", "-2", "1.5", "x"):
        with pytest.raises(SystemExit):
            parser.parse_args(["--steps", text])
        assert f"argument --steps: must be a positive integer, got '{text}'" in capsys.readouterr().err


@pytest.mark.parametrize("field_name,value,message", [
    ("dropout", 1.0, "--dropout must be in [0, 1), got 1.0"),
    ("kind", "tall", "--kind must be one of narrow, wide, got 'tall'"),
    ("width", "16", "--width must be a positive integer, got '16'"),
    ("gate", "yes", "--gate is a switch: True or False, got 'yes'"),
    ("width", None, "--width must be a positive integer, got None"),  # derived: None is no value
])
def test_values_built_in_code_get_the_same_one_line_errors(field_name, value, message):
    args = argparse.Namespace(dropout=0.1, kind="wide", width=16, gate=False, layer=None)
    setattr(args, field_name, value)
    with pytest.raises(ConfigurationError) as error:
        check_values(args, ToyConfig, derived=("width",))
    assert str(error.value) == message


def test_idle_flags_are_named_unless_at_the_architectures_value(caplog):
    args = argparse.Namespace(kind="narrow", width=5)
    warn_idle_flags(args, {"width": ("only wide models have a width", "--kind is narrow")}, {"width": 5})
    assert not caplog.records
    warn_idle_flags(args, {"width": ("only wide models have a width", "--kind is narrow")}, {"width": 16})
    assert [r.getMessage() for r in caplog.records] == [
        "flag without effect: --width 5: only wide models have a width, and --kind is narrow"]


def test_the_one_validation_function_leaves_no_file_it_returns_to():
    """The walk of args through build_model: no plugin file calls out of itself and is called back into."""
    task = SimpleNamespace(source_dictionary=dictionary_of_size(30), target_dictionary=dictionary_of_size(30))
    args = parse_model_args("mlrf_iwslt_de_en", "--fuse-decoder", "none", "--encoder-embed-dim", "16",
                            "--decoder-embed-dim", "16")
    plugin, stack, returns = os.path.dirname(fusion_fairseq.__file__), [], []

    def profile(frame, event, arg):
        path = frame.f_code.co_filename
        if event == "call" and path.startswith(plugin):
            files = [name for name in stack if name is not None]
            if path in files and files[-1] != path:
                returns.append(f"{path} after {files[files.index(path):]}")
            stack.append(path)
        elif event == "call":
            stack.append(None)
        elif event == "return" and stack:
            stack.pop()

    sys.setprofile(profile)
    try:
        ARCH_MODEL_REGISTRY["mlrf_iwslt_de_en"].build_model(args, task)
    finally:
        sys.setprofile(None)
    assert not returns, returns[:3]


@pytest.mark.parametrize("model", PLUGIN_MODELS)
def test_every_own_field_of_a_model_is_a_flag_with_help(model):
    config = MODEL_DATACLASS_REGISTRY[model]
    parser = argparse.ArgumentParser(argument_default=argparse.SUPPRESS)
    ARCH_MODEL_REGISTRY[model].add_args(parser)
    options = {action.dest: action for action in parser._actions}
    for item in own_fields(config):
        if not item.name.startswith("max_"):  # the task's flags
            assert options[item.name].help, item.name
            assert options[item.name].option_strings == ["--" + item.name.replace("_", "-")]


DENSE_STRUCTURAL = {"growth_dim", "summary_every", "dense_attention", "embed_bottleneck_dim", "no_dense_encoder",
                    "no_dense_decoder"}
STRUCTURAL = {
    "fusion_transformer": {
        "fuse_encoder", "fuse_decoder", "fusion_hops", "fusion_attn_dim", "fusion_ffn_dim", "fusion_independent_w1",
        "fusion_no_embedding_layer", "fusion_no_layer_embedding", "fusion_no_layernorm", "aggregate_encoder",
        "aggregate_decoder", "dense_connection", "aggregation_fn", "aggregation_residual", "multi_layer_attention",
        "layer_attention", "surface_fusion", "surface_fusion_variant", "denseformer_encoder", "denseformer_decoder",
        "denseformer_dilation", "denseformer_period", "mudd_encoder", "mudd_decoder", "mudd_variant",
        "hyper_connections_encoder", "hyper_connections_decoder", "hyper_connections_rate",
        "hyper_connections_sinkhorn_order"},
    "dense_transformer": DENSE_STRUCTURAL,
    "dense_fconv": DENSE_STRUCTURAL | {"summary_layer", "residual_dim"},
    "layerwise_coordination": {
        "layers", "embed_dim", "ffn_embed_dim", "attention_heads", "normalize_before", "no_scale_embedding",
        "no_layer_sharing", "no_mixed_attention", "no_language_embedding", "no_position_embedding"},
}


def test_a_fields_metadata_says_what_it_accepts_and_whether_a_checkpoint_fixes_it():
    assert structural_fields(ToyConfig) == ("width",)
    assert list(field_values(ToyConfig)) == ["dropout", "kind", "width", "gate", "layer"]


@pytest.mark.parametrize("model", PLUGIN_MODELS)
def test_checkpoint_safety_reads_the_structural_fields_of_the_config(model):
    """The flags that change the parameters, or what the model computes with them."""
    args = parse_model_args(model)
    assert set(structural_flags(vars(args))) == STRUCTURAL[model]
    assert "fuse_encoder" in structural_flags({"arch": "mlrf_iwslt_de_en"})
    assert structural_flags({"arch": "transformer"}) == ()  # fairseq's own model


# --- the registered dataclass checks hydra configs --------------------------------------------

EXAMPLE_DIR = os.path.join(os.path.dirname(__file__), os.pardir, "examples", "hydra")


def compose_example(*overrides):
    """fairseq-hydra-train's composition of examples/hydra/mlrf.yaml, then its ``add_defaults``."""
    from fairseq.dataclass.initialize import add_defaults, hydra_init
    from hydra import compose, initialize_config_dir

    hydra_init("mlrf")
    # version_base 1.1, as fairseq composes: a later one makes fairseq's hydra.experimental imports fail
    with initialize_config_dir(config_dir=os.path.abspath(EXAMPLE_DIR), version_base="1.1"):
        cfg = compose("mlrf", overrides=["task.data=unused", "common.user_dir=unused", *overrides])
    add_defaults(cfg)
    return cfg


def test_a_misspelt_model_field_in_a_hydra_config_is_refused_naming_it():
    with pytest.raises(ConfigurationError) as error:
        compose_example("+model.fuse_decodr=sa")
    assert str(error.value) == ("model.fuse_decodr is no field of fusion_transformer: did you mean fuse_decoder? "
                                "(the fields are the flags of fairseq-train --arch fusion_transformer, with _ for -)")


def test_a_misspelt_criterion_field_is_left_to_fairseq_not_called_a_model_field():
    """The plugin's check is of model configs; the criterion's was refused as "model.diversity_lamda ... --arch"."""
    from omegaconf.errors import ConfigKeyError

    with pytest.raises(ConfigKeyError, match="diversity_lamda"):
        compose_example("criterion._name=label_smoothed_cross_entropy_with_layer_diversity",
                        "+criterion.diversity_lamda=0.5")


@pytest.mark.parametrize("field, value, allowed", [
    ("fuse_decoder", "sax", "must be one of none, avg, fnn, sa"),
    ("fusion_hops", 0, "must be a positive integer"),
    ("dropout", 1.5, "must be in [0, 1)"),
])
def test_a_bad_value_in_a_hydra_config_is_refused_naming_its_field(field, value, allowed):
    """By the name the config gives it; on the command line the same value is named by its flag."""
    from fairseq import models

    task = SimpleNamespace(source_dictionary=dictionary_of_size(30), target_dictionary=dictionary_of_size(30))
    with pytest.raises(ConfigurationError) as error:
        models.build_model(compose_example(f"model.{field}={value}").model, task)
    assert str(error.value) == f"model.{field} {allowed}, got {value!r}"
    args = parse_model_args("fusion_transformer")
    setattr(args, field, value)
    with pytest.raises(ConfigurationError) as error:
        ARCH_MODEL_REGISTRY["fusion_transformer"].build_model(args, task)
    assert str(error.value) == f"--{field.replace('_', '-')} {allowed}, got {value!r}"


def test_a_preset_in_a_hydra_config_is_refused_rather_than_applied_by_halves():
    """fairseq's merge would give the preset's FFN width the model's default before the preset runs."""
    with pytest.raises(ConfigurationError, match="^model._name mlrf_iwslt_de_en is a preset of fusion_transformer"):
        compose_example("model._name=mlrf_iwslt_de_en")


def test_the_hydra_example_is_the_command_lines_preset():
    from fairseq import models

    cfg = compose_example()
    task = SimpleNamespace(source_dictionary=dictionary_of_size(30), target_dictionary=dictionary_of_size(30))
    torch.manual_seed(0)
    from_yaml = models.build_model(cfg.model, task)
    torch.manual_seed(0)
    from_flags = ARCH_MODEL_REGISTRY["mlrf_iwslt_de_en"].build_model(
        parse_model_args("mlrf_iwslt_de_en", "--fuse-encoder", "fnn", "--fuse-decoder", "sa"), task)
    yaml_state, flags_state = from_yaml.state_dict(), from_flags.state_dict()
    assert yaml_state.keys() == flags_state.keys()
    assert all(torch.equal(yaml_state[name], flags_state[name]) for name in yaml_state)


def readme_mlrf_stage_1():
    """The flags of README.md's first MLRF command (stage 1), after the data and --user-dir."""
    import re
    import shlex

    with open(os.path.join(os.path.dirname(__file__), os.pardir, "README.md"), encoding="utf-8") as f:
        commands = re.findall(r"^fairseq-train \$DATA --user-dir \$USER_DIR (.*?--save-dir \S+)$", f.read(),
                              re.M | re.S)
    stage_1 = [command for command in commands if command.endswith("checkpoints/mlrf/stage1")]
    assert len(stage_1) == 1
    return shlex.split(stage_1[0].replace("\\\n", " "))


def test_the_hydra_example_trains_as_the_readmes_first_stage():
    """Batches, optimiser, schedule and criterion as the command line's; the example once left out
    --required-batch-size-multiple 1, so each epoch's last partial batch was dropped."""
    from fairseq import options
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    parser = options.get_training_parser()
    flags = readme_mlrf_stage_1()
    command_line = convert_namespace_to_omegaconf(options.parse_args_and_arch(
        parser, ["unused", "--user-dir", USER_DIR, *flags]))
    example = compose_example()
    fields = {"dataset": ("batch_size", "required_batch_size_multiple", "max_tokens"),
              "optimization": ("lr", "clip_norm", "max_epoch", "max_update", "update_freq"),
              "optimizer": ("_name", "adam_betas", "adam_eps", "weight_decay"),
              "lr_scheduler": ("_name", "warmup_updates", "warmup_init_lr"), "criterion": ("_name",),
              "checkpoint": ("keep_last_epochs",)}
    for group, names in fields.items():
        for name in names:
            assert example[group][name] == command_line[group][name], f"{group}.{name}"


@pytest.mark.slow
def test_fairseq_hydra_train_refuses_a_misspelt_model_field(tiny_data_bin, tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "fairseq_cli.hydra_train", "--config-dir", EXAMPLE_DIR, "--config-name", "mlrf",
         f"task.data={tiny_data_bin}", f"common.user_dir={USER_DIR}", f"checkpoint.save_dir={tmp_path}",
         "+model.fuse_decodr=sa"],
        capture_output=True, text=True, timeout=600, cwd=tmp_path, env={**os.environ, "PYTHONWARNINGS": "ignore"})
    assert result.returncode == 1 and not list(tmp_path.glob("*.pt"))
    refusal = [line for line in result.stderr.splitlines() if "model.fuse_decodr is" in line]
    assert refusal == ["fusion_fairseq.errors.ConfigurationError: model.fuse_decodr is no field of fusion_transformer: "
                       "did you mean fuse_decoder? (the fields are the flags of fairseq-train --arch "
                       "fusion_transformer, with _ for -)"], result.stderr[-3000:]


@pytest.mark.slow
def test_fairseq_hydra_train_names_a_bad_value_by_its_field(tiny_data_bin, tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "fairseq_cli.hydra_train", "--config-dir", EXAMPLE_DIR, "--config-name", "mlrf",
         f"task.data={tiny_data_bin}", f"common.user_dir={USER_DIR}", "model.fuse_decoder=sax"],
        capture_output=True, text=True, timeout=600, cwd=tmp_path, env={**os.environ, "PYTHONWARNINGS": "ignore"})
    assert result.returncode == 1 and not list(tmp_path.rglob("*.pt")), result.stderr[-3000:]
    assert ("fusion_fairseq.errors.ConfigurationError: model.fuse_decoder must be one of none, avg, fnn, sa, got 'sax'"
            in result.stderr.splitlines()), result.stderr[-3000:]


@pytest.mark.slow
def test_fairseq_hydra_train_reads_relative_paths_from_where_it_runs(tiny_data_bin, tmp_path):
    """The example's data and save_dir are relative to the folder the command runs in, as fairseq-train's."""
    os.symlink(tiny_data_bin, tmp_path / "data-bin")
    result = subprocess.run(
        [sys.executable, "-m", "fairseq_cli.hydra_train", "--config-dir", EXAMPLE_DIR, "--config-name", "mlrf",
         "task.data=data-bin", f"common.user_dir={USER_DIR}", "checkpoint.save_dir=saved",
         "optimization.max_update=1", "model.encoder_embed_dim=16", "model.decoder_embed_dim=16",
         "model.fusion_attn_dim=16", "model.fusion_ffn_dim=16"],
        capture_output=True, text=True, timeout=600, cwd=tmp_path, env={**os.environ, "PYTHONWARNINGS": "ignore"})
    assert result.returncode == 0, result.stderr[-3000:]
    assert (tmp_path / "saved" / "checkpoint_last.pt").is_file()
    assert sorted(os.listdir(tmp_path)) == ["data-bin", "saved"]  # hydra's record in saved/, no outputs/


# --- checkpoints saved before the dataclasses were registered ----------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("name", ["mlrf_iwslt_de_en", "fusion_transformer"])
def test_a_checkpoint_with_a_namespace_model_config_loads(tiny_mlrf_checkpoint, tmp_path, name):
    """Before, fairseq stored ``cfg.model`` as the command line's Namespace; under the model's own
    name fairseq reads it through the registered dataclass, under a preset's as it is."""
    state = torch.load(tiny_mlrf_checkpoint)
    state["cfg"]["model"] = Namespace(**{**state["cfg"]["model"], "_name": name, "arch": name})
    legacy = tmp_path / "legacy.pt"
    torch.save(state, legacy)
    (model,), _ = checkpoint_utils.load_model_ensemble([str(legacy)])
    (reference,), _ = checkpoint_utils.load_model_ensemble([tiny_mlrf_checkpoint])
    tokens = torch.tensor([[4, 5, 6, 2]])
    model.eval(), reference.eval()
    assert torch.equal(model(tokens, torch.tensor([4]), tokens)[0], reference(tokens, torch.tensor([4]), tokens)[0])


def test_checkpoint_safety_and_the_helper_import_no_model():
    """Layers point one way: the models import the helper and checkpoint safety, never the reverse."""
    import ast

    for module in ("checkpoint_safety", "config_fields"):
        path = os.path.join(os.path.dirname(fusion_fairseq.__file__), f"{module}.py")
        imported = [node.module or "" for node in ast.walk(ast.parse(open(path).read()))
                    if isinstance(node, ast.ImportFrom)]
        assert not [name for name in imported if "models" in name.split(".") and name.startswith(("fusion", "."))
                    or name == "models"], module
