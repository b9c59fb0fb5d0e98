"""Crafted checkpoints run no code, and a checkpoint lacking fusion parameters loads only for
fine-tuning.

Configuration strings that fairseq would ``eval()`` while building a plugin model (dense_fconv's
layer specs, the Transformer's ``adaptive_softmax_cutoff`` and ``xformers_att_config``) or the
task and criterion stored in a checkpoint (``left_pad_source``/``left_pad_target`` of the
multilingual tasks, ctc's ``wer_args``) are parsed as literals; each crafted checkpoint below holds
a string that creates a file when evaluated. --model-overrides cannot change a structural flag
against the value a checkpoint was trained with."""

import os
import subprocess
import sys

from argparse import Namespace
from types import SimpleNamespace

import pytest
import torch
from fairseq import checkpoint_utils

from conftest import TINY_MLRF_FLAGS, USER_DIR, load_script, run_cli
from fusion_fairseq.checkpoint_safety import CheckpointContentError, parse_config_literal, starts_from_pretrained_model
from fusion_fairseq.errors import ConfigurationError
from fusion_fairseq.models import FusionTransformerModel
from fusion_fairseq.models.dense_fconv import layer_spec
from model_building import parse_model_args, task_of

TINY_FCONV = ["--encoder-embed-dim", "16", "--decoder-embed-dim", "16", "--decoder-out-embed-dim", "16",
              "--encoder-layers", "[(8, 3)] * 2", "--decoder-layers", "[(8, 3)] * 2"]
TINY_TRANSFORMER = TINY_MLRF_FLAGS[:16]  # its dimensions, without the fusion flags


def train(data_bin, save_dir, arch, *flags, updates=2):
    run_cli(
        "fairseq_cli.train", data_bin, "--user-dir", USER_DIR, "--arch", arch, *flags,
        "--optimizer", "adam", "--lr", "0.003", "--max-tokens", "1000", "--max-update", str(updates),
        "--save-dir", save_dir, "--no-progress-bar", "--seed", "1", "--no-epoch-checkpoints",
    )
    return os.path.join(save_dir, "checkpoint_last.pt")


def run_unchecked(module, *args):
    return subprocess.run([sys.executable, "-m", module, *map(str, args)], capture_output=True, text=True,
                          timeout=600, env={**os.environ, "PYTHONWARNINGS": "ignore"})


def generate(data_bin, checkpoint, *flags):
    return run_unchecked("fairseq_cli.generate", data_bin, "--user-dir", USER_DIR, "--path", checkpoint,
                         "--beam", "2", "--max-tokens", "1000", "--gen-subset", "test", *flags)


def assert_one_line_error(result, *fragments):
    """The program failed with the plugin's error, one line of Python's report naming ``fragments`` (the last
    line, or the cause of the error fairseq's trainer re-raises a failed load as)."""
    assert result.returncode != 0
    errors = [line for line in result.stderr.splitlines() if line.startswith((
        "fusion_fairseq.errors.ConfigurationError: ", "fusion_fairseq.checkpoint_safety.CheckpointContentError: "))]
    assert len(errors) == 1, result.stderr[-3000:]
    last = errors[0]
    for fragment in fragments:
        assert fragment in last


@pytest.fixture(scope="module")
def dense_fconv_checkpoint(tiny_data_bin, tmp_path_factory):
    return train(tiny_data_bin, str(tmp_path_factory.mktemp("dense_fconv")), "dense_fconv_iwslt_de_en", *TINY_FCONV)


@pytest.fixture(scope="module")
def no_fusion_checkpoint(tiny_data_bin, tmp_path_factory):
    """A ``fusion_transformer`` with every fusion switched off: the vanilla Transformer's parameters."""
    return train(tiny_data_bin, str(tmp_path_factory.mktemp("no_fusion")), "fusion_transformer", *TINY_TRANSFORMER)


def touch_payload(marker, result):
    """A configuration string that creates ``marker`` when evaluated and then yields ``result``."""
    return f"__import__('pathlib').Path({str(marker)!r}).touch() or {result}"


def crafted(checkpoint, tmp_path, **config):
    state = torch.load(checkpoint)
    state["cfg"]["model"].update(config)
    path = tmp_path / "crafted.pt"
    torch.save(state, path)
    return str(path)


# --- item: configuration strings are parsed, never evaluated ---------------------------------

@pytest.mark.parametrize("field,result", [
    ("adaptive_softmax_cutoff", "[5]"),
    ("encoder_xformers_att_config", "None"),
    ("decoder_xformers_att_config", "None"),
])
def test_transformer_config_strings_are_not_evaluated_on_load(tiny_mlrf_checkpoint, tmp_path, field, result):
    marker = tmp_path / "created_by_checkpoint"
    path = crafted(tiny_mlrf_checkpoint, tmp_path, **{field: touch_payload(marker, result)})
    with pytest.raises(ConfigurationError, match=f"checkpoint {path}: model {field} .* is not a literal .*; fairseq "
                                                 "would evaluate it when building the model"):
        checkpoint_utils.load_model_ensemble_and_task([path])
    assert not marker.exists()


@pytest.mark.parametrize("field", ["adaptive_softmax_cutoff", "encoder_layers"])
def test_a_checkpoint_of_fairseqs_own_transformer_runs_no_code(no_fusion_checkpoint, tmp_path, field):
    """fairseq's transformer eval()s its cutoff (and ConvS2S its layer specs): checked whatever the architecture."""
    marker = tmp_path / "created_by_checkpoint"
    path = crafted(no_fusion_checkpoint, tmp_path, _name="transformer", arch="transformer",
                   **{field: touch_payload(marker, "[5]")})
    with pytest.raises(CheckpointContentError, match=f"checkpoint {path}: model {field} .* is not a literal"):
        checkpoint_utils.load_model_ensemble_and_task([path])
    assert not marker.exists()


def test_an_empty_evaluated_model_field_loads(no_fusion_checkpoint, tmp_path):
    """"" is the default of multires HuBERT's override_encoder_layers, which fairseq evaluates only when set."""
    path = crafted(no_fusion_checkpoint, tmp_path, override_encoder_layers="", character_filters="  ")
    assert checkpoint_utils.load_checkpoint_to_cpu(path)["cfg"]["model"]["override_encoder_layers"] == ""


@pytest.mark.parametrize("kind", [bytes, bytearray])
@pytest.mark.parametrize("section,field", [("task", "left_pad_source"), ("model", "adaptive_softmax_cutoff")])
def test_a_field_stored_as_bytes_is_refused(no_fusion_checkpoint, tmp_path, kind, section, field):
    """torch's safe loader admits bytes, and eval() runs them as it runs a string."""
    marker = tmp_path / "created_by_checkpoint"
    state = torch.load(no_fusion_checkpoint)
    state["cfg"][section][field] = kind(touch_payload(marker, "True").encode())
    path = tmp_path / "crafted.pt"
    torch.save(state, path)
    with pytest.raises(CheckpointContentError, match=f"{section} {field} holds {kind.__name__}, not a literal string"):
        checkpoint_utils.load_checkpoint_to_cpu(str(path))
    assert not marker.exists()


@pytest.mark.slow
def test_dense_fconv_layer_specs_are_not_evaluated_on_load(dense_fconv_checkpoint, tmp_path):
    marker = tmp_path / "created_by_checkpoint"
    path = crafted(dense_fconv_checkpoint, tmp_path, encoder_layers=touch_payload(marker, "[(8, 3)] * 2"))
    with pytest.raises(ConfigurationError, match=r"model encoder_layers .* is not a literal \(it contains BoolOp\)"):
        checkpoint_utils.load_model_ensemble_and_task([path])
    assert not marker.exists()


@pytest.mark.slow
def test_generate_refuses_a_crafted_checkpoint_in_one_line(dense_fconv_checkpoint, tiny_data_bin, tmp_path):
    marker = tmp_path / "created_by_checkpoint"
    path = crafted(dense_fconv_checkpoint, tmp_path, decoder_layers=touch_payload(marker, "[(8, 3)] * 2"))
    result = generate(tiny_data_bin, path)
    assert_one_line_error(result, "model decoder_layers", "is not a literal")
    assert not marker.exists()


def test_nested_xformers_config_is_not_evaluated(tmp_path):
    marker = tmp_path / "created_by_checkpoint"
    args = parse_model_args("fusion_transformer", *TINY_TRANSFORMER)
    args.decoder = {"xformers_att_config": touch_payload(marker, "None")}
    with pytest.raises(ConfigurationError, match="--decoder-xformers-att-config"):
        FusionTransformerModel.build_model(args, task_of(10, 10))
    assert not marker.exists()


def test_dense_transformer_cutoff_is_not_evaluated(tmp_path):
    marker = tmp_path / "created_by_checkpoint"
    args = parse_model_args("dense_transformer")
    args.adaptive_softmax_cutoff = touch_payload(marker, "[5]")  # as read from a checkpoint
    from fusion_fairseq.models.dense_transformer import DenseTransformerModel

    with pytest.raises(ConfigurationError, match="--adaptive-softmax-cutoff"):
        DenseTransformerModel.build_model(args, task_of(10, 10))
    assert not marker.exists()


@pytest.mark.parametrize("text", [
    "[(128, 3)] * 9 + [(256, 3)] * 4 + [(512, 1)] * 2", "[(96, 3)] * 8", "[(512, 3, 1)] * 2 + [(8, 1)]",
    "2000,4000", "[5, 10]", "{'name': 'scaled_dot_product', 'dropout': 0.1}", "-1",
])
def test_literals_read_as_python_would(text):
    assert parse_config_literal(text, "--flag") == eval(text)  # noqa: S307 - the reference reading


@pytest.mark.parametrize("text,why", [
    ("open('x', 'w')", "it contains Call"),
    ("os.system", "it contains Attribute"),
    ("[x for x in 'ab']", "it contains ListComp"),
    ("lambda: 0", "it contains Lambda"),
    ("[(1, 1)] * 10001", "at most 10000 items"),
    ("[(1, 1)] * 5000 * 3", "at most 10000 items"),
    ("[1] * 10000 + [1] * 10000", "at most 10000 items"),
    pytest.param("+".join(["[1] * 10000"] * 200), "at most 10000 items", id="200 terms"),
    ("[[1] * 10000] * 10000", "at most 10000 items"),
    ("{[1]: 2}", "the dict key [1] is not hashable"),
    pytest.param("[0]" + "+[0]" * 5000, "it is nested too deeply", id="5001 terms"),
    ("2 ** 100", "it contains BinOp"),
    ("[(1, 2)", "it does not parse"),
])
def test_non_literals_are_refused_naming_the_flag(text, why):
    with pytest.raises(ConfigurationError) as error:
        layer_spec(text, "--encoder-layers", None)
    message = str(error.value)
    assert message.startswith(f"--encoder-layers {text[:200]!r}") and why in message
    assert "\n" not in message


# --- the stored task and criterion: their evaluated strings are parsed, never evaluated ------

def with_stored(checkpoint, tmp_path, name="crafted.pt", **sections):
    """``checkpoint`` with whole sections of its stored configuration (``task``, ``criterion``) replaced."""
    state = torch.load(checkpoint)
    state["cfg"].update(sections)
    path = tmp_path / name
    torch.save(state, path)
    return str(path)


def multilingual_task(marker, data_bin):
    """A multilingual_translation task, whose setup ``eval()``s ``left_pad_source``."""
    return Namespace(task="multilingual_translation", left_pad_source=touch_payload(marker, "True"),
                     left_pad_target="False", lang_pairs="src-tgt", data=data_bin)


def ctc_criterion(marker):
    """A ctc criterion, whose constructor ``eval()``s ``wer_args``."""
    return {"_name": "ctc", "wer_args": touch_payload(marker, "(None, None, 0.0, 0.0)")}


def validate(data_bin, checkpoint, *flags):
    return run_unchecked("fairseq_cli.validate", data_bin, "--user-dir", USER_DIR, "--path", checkpoint,
                         "--max-tokens", "1000", "--valid-subset", "test", *flags)


@pytest.mark.slow
def test_validate_refuses_a_crafted_criterion_in_one_line(no_fusion_checkpoint, tiny_data_bin, tmp_path):
    marker = tmp_path / "created_by_checkpoint"
    path = with_stored(no_fusion_checkpoint, tmp_path, criterion=ctc_criterion(marker))
    result = validate(tiny_data_bin, path, "--task", "translation")
    assert not marker.exists()
    assert_one_line_error(result, f"checkpoint {path}: criterion wer_args", "is not a literal (it contains BoolOp)",
                          "fairseq would evaluate it when building the criterion")


@pytest.mark.slow
def test_validate_refuses_a_crafted_task_in_one_line(no_fusion_checkpoint, tiny_data_bin, tmp_path):
    marker = tmp_path / "created_by_checkpoint"
    path = with_stored(no_fusion_checkpoint, tmp_path, task=multilingual_task(marker, tiny_data_bin))
    result = validate(tiny_data_bin, path, "--task", "multilingual_translation", "--lang-pairs", "src-tgt")
    assert not marker.exists()
    assert_one_line_error(result, f"checkpoint {path}: task left_pad_source", "is not True or False",
                          "fairseq would evaluate it when building the task")


def test_the_hub_api_refuses_a_crafted_task(no_fusion_checkpoint, tiny_data_bin, tmp_path):
    marker = tmp_path / "created_by_checkpoint"
    with_stored(no_fusion_checkpoint, tmp_path, task=multilingual_task(marker, tiny_data_bin))
    with pytest.raises(ConfigurationError, match="task left_pad_source .* is not True or False; fairseq would evaluate"):
        FusionTransformerModel.from_pretrained(str(tmp_path), checkpoint_file="crafted.pt",
                                               data_name_or_path=tiny_data_bin)
    assert not marker.exists()


@pytest.fixture
def requests_seen():
    """A local HTTP server: its URL, and the paths requested from it."""
    import http.server
    import threading

    seen = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            seen.append(self.path)
            self.send_error(404)

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}", seen
    server.shutdown()


def test_the_hub_api_fetches_no_url_a_checkpoint_names(no_fusion_checkpoint, tiny_data_bin, tmp_path, requests_seen):
    url, seen = requests_seen
    with_stored(no_fusion_checkpoint, tmp_path, bpe={"_name": "gpt2", "gpt2_encoder_json": f"{url}/encoder.json",
                                                     "gpt2_vocab_bpe": f"{url}/vocab.bpe"})
    for keywords, setting in (({}, "bpe 'gpt2'"), ({"bpe": "gpt2"}, f"bpe gpt2_encoder_json '{url}/encoder.json'")):
        refused = f"from_pretrained: checkpoint .*crafted.pt sets {setting}, which would read"
        with pytest.raises(ValueError, match=refused):
            FusionTransformerModel.from_pretrained(str(tmp_path), checkpoint_file="crafted.pt",
                                                   data_name_or_path=tiny_data_bin, **keywords)
    assert seen == []


def test_the_hub_api_reads_no_file_a_checkpoint_names(no_fusion_checkpoint, tiny_data_bin, tmp_path):
    state = torch.load(no_fusion_checkpoint)
    state["cfg"]["generation"]["replace_unk"] = "/etc/passwd"
    torch.save(state, tmp_path / "crafted.pt")
    with pytest.raises(ValueError, match="sets generation replace_unk '/etc/passwd', which would read or fetch a file"):
        FusionTransformerModel.from_pretrained(str(tmp_path), checkpoint_file="crafted.pt",
                                               data_name_or_path=tiny_data_bin)


def test_the_hub_api_builds_the_bpe_the_user_names(no_fusion_checkpoint, tiny_data_bin, tmp_path):
    codes = tmp_path / "codes"
    codes.write_text("#version: 0.2\nw 1</w>\n")
    hub = FusionTransformerModel.from_pretrained(os.path.dirname(no_fusion_checkpoint), data_name_or_path=tiny_data_bin,
                                                 checkpoint_file=os.path.basename(no_fusion_checkpoint),
                                                 bpe="subword_nmt", bpe_codes=str(codes), replace_unk="")
    assert hub.bpe is not None and hub.cfg.bpe.bpe_codes == str(codes)


def test_an_analysis_script_refuses_a_crafted_task(no_fusion_checkpoint, tiny_data_bin, tmp_path, capsys):
    folder = tmp_path / ("a-long-folder-name-" * 8)  # the whole refusal is printed, however long the paths in it
    folder.mkdir()
    marker = folder / "created_by_checkpoint"
    path = with_stored(no_fusion_checkpoint, folder, task=multilingual_task(marker, tiny_data_bin))
    code = load_script("plot_layer_attention").main(
        ["--path", path, "--data", tiny_data_bin, "--out", str(tmp_path / "heatmap.png")])
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert code != 0 and "task left_pad_source" in error and "fairseq would evaluate it" in error
    assert not marker.exists()


def test_a_legacy_args_checkpoint_is_checked_too(no_fusion_checkpoint, tiny_data_bin, tmp_path):
    """Checkpoints saved before fairseq's omegaconf configuration keep one flat ``args``."""
    marker = tmp_path / "created_by_checkpoint"
    state = torch.load(no_fusion_checkpoint)
    model = state["cfg"]["model"]
    state["args"] = Namespace(**{**model, "arch": model["_name"], **vars(multilingual_task(marker, tiny_data_bin))})
    state["cfg"] = None
    path = tmp_path / "legacy.pt"
    torch.save(state, path)
    with pytest.raises(ConfigurationError, match=f"checkpoint {path}: task left_pad_source .* is not True or False"):
        checkpoint_utils.load_model_ensemble_and_task([str(path)])
    assert not marker.exists()


@pytest.mark.parametrize("value", [True, "False", None])
def test_literal_task_booleans_load(no_fusion_checkpoint, tmp_path, value):
    state = torch.load(no_fusion_checkpoint)
    state["cfg"]["task"]["left_pad_source"] = value
    path = tmp_path / "literal.pt"
    torch.save(state, path)
    loaded = checkpoint_utils.load_checkpoint_to_cpu(str(path))
    assert loaded["cfg"]["task"]["left_pad_source"] == value


# --- item: only fine-tuning starts fusion parameters fresh -----------------------------------

@pytest.mark.parametrize("flag, value", [("fuse_decoder", "sa"), ("surface_fusion", "hard")])
def test_fusion_switched_on_at_load_is_an_error_naming_the_flag(no_fusion_checkpoint, flag, value):
    with pytest.raises(ConfigurationError, match=f"--model-overrides sets {flag} '{value}' but checkpoint "
                                                 f"{no_fusion_checkpoint} was trained with {flag} 'none'"):
        checkpoint_utils.load_model_ensemble_and_task([no_fusion_checkpoint], arg_overrides={flag: value})


def test_a_checkpoint_whose_configuration_has_fusion_and_whose_weights_lack_it_is_refused(no_fusion_checkpoint,
                                                                                          tmp_path):
    """Only fine-tuning starts fusion parameters fresh: a checkpoint claiming a fusion it holds no weights of is
    refused by the strict load, naming a missing parameter."""
    state = torch.load(no_fusion_checkpoint)
    state["cfg"]["model"]["fuse_decoder"] = "sa"
    path = tmp_path / "claims_fusion.pt"
    torch.save(state, path)
    with pytest.raises(CheckpointContentError, match=f"{path}: parameter decoder.output_fusion.[\\w.]+ is missing "
                                                     "from the checkpoint"):
        checkpoint_utils.load_model_ensemble_and_task([str(path)])


@pytest.mark.parametrize("field", ["dense_connection", "fuse_decoder"])
def test_a_configuration_without_a_structural_field_is_refused_naming_it(no_fusion_checkpoint, tmp_path, field):
    """fairseq stores every field: one missing is older than its flag, whose default may compute another function
    (dense aggregation was the literal reading before --dense-connection); it loaded with today's default."""
    state = torch.load(no_fusion_checkpoint)
    del state["cfg"]["model"][field]
    path = tmp_path / "older.pt"
    torch.save(state, path)
    with pytest.raises(CheckpointContentError, match=f"^{path}: the checkpoint's configuration of fusion_transformer "
                                                     f"stores no {field}: it is older than these flags"):
        checkpoint_utils.load_model_ensemble_and_task([str(path)])


@pytest.mark.slow
def test_generate_with_fusion_overrides_fails_in_one_line(no_fusion_checkpoint, tiny_data_bin):
    result = generate(tiny_data_bin, no_fusion_checkpoint, "--model-overrides", "{'fuse_decoder': 'sa'}")
    assert_one_line_error(result, "--model-overrides sets fuse_decoder 'sa'", "was trained with fuse_decoder 'none'")
    assert "H-" not in result.stdout


@pytest.mark.parametrize("flag", ["aggregate_encoder", "aggregate_decoder"])
def test_a_parameter_free_structure_switched_on_at_load_is_refused(no_fusion_checkpoint, flag):
    """A dense connection with its default LayerNorm reading has no parameters: the strict load
    alone would pass and the model would compute another function."""
    with pytest.raises(ConfigurationError, match=(
            f"--model-overrides sets {flag} 'dense' but checkpoint {no_fusion_checkpoint} was trained with "
            f"{flag} 'none': a structural flag cannot change at load")):
        checkpoint_utils.load_model_ensemble_and_task([no_fusion_checkpoint], arg_overrides={flag: "dense"})


@pytest.mark.slow
def test_generate_with_a_structural_override_fails_in_one_line(no_fusion_checkpoint, tiny_data_bin):
    result = generate(tiny_data_bin, no_fusion_checkpoint, "--model-overrides", "{'aggregate_decoder': 'dense'}")
    assert_one_line_error(result, "--model-overrides sets aggregate_decoder 'dense'",
                          "was trained with aggregate_decoder 'none'")
    assert "H-" not in result.stdout


def test_overrides_that_keep_the_trained_structure_load(no_fusion_checkpoint):
    """The trained value of a structural flag and the flags that tune or analyse a trained model
    (dropout, mask_encoder_layer) are accepted."""
    overrides = {"aggregate_decoder": "none", "multi_layer_attention": 1, "fusion_no_layernorm": False,
                 "mask_encoder_layer": None, "dropout": 0.0}
    models, cfg, _ = checkpoint_utils.load_model_ensemble_and_task([no_fusion_checkpoint], arg_overrides=overrides)
    assert cfg.model.aggregate_decoder == "none" and cfg.model.dropout == 0.0


@pytest.mark.slow
def test_resuming_another_configuration_is_an_error(no_fusion_checkpoint, tiny_data_bin, tmp_path):
    save_dir = tmp_path / "resume"
    save_dir.mkdir()
    (save_dir / "checkpoint_last.pt").write_bytes(open(no_fusion_checkpoint, "rb").read())
    result = run_unchecked(
        "fairseq_cli.train", tiny_data_bin, "--user-dir", USER_DIR, "--arch", "fusion_transformer",
        *TINY_TRANSFORMER, "--fuse-decoder", "sa", "--optimizer", "adam", "--lr", "0.003", "--max-tokens", "1000",
        "--max-update", "4", "--save-dir", save_dir, "--no-progress-bar", "--no-epoch-checkpoints",
    )
    assert_one_line_error(result, "fairseq-train resumes from", "trained with fuse_decoder 'none'",
                          "the command line gives fuse_decoder 'sa'")


@pytest.mark.slow
def test_resuming_with_a_parameter_free_structural_change_is_an_error(tiny_data_bin, tmp_path):
    """A dense connection adds no parameter, so the strict load of checkpoint_last.pt passes and the
    resumed model would compute another function than the one trained so far."""
    save_dir = str(tmp_path / "resume")
    train(tiny_data_bin, save_dir, "fusion_transformer", *TINY_TRANSFORMER)
    resume = ["fairseq_cli.train", tiny_data_bin, "--user-dir", USER_DIR, "--arch", "fusion_transformer",
              *TINY_TRANSFORMER, "--optimizer", "adam", "--lr", "0.003", "--max-tokens", "1000", "--max-update", "3",
              "--save-dir", save_dir, "--no-progress-bar", "--no-epoch-checkpoints"]
    result = run_unchecked(*resume, "--aggregate-decoder", "dense")
    assert_one_line_error(result, "fairseq-train resumes from", "trained with aggregate_decoder 'none'",
                          "the command line gives aggregate_decoder 'dense'")
    assert torch.load(os.path.join(save_dir, "checkpoint_last.pt"))["optimizer_history"][-1]["num_updates"] == 2
    resumed = run_unchecked(*resume)  # the same configuration resumes
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert torch.load(os.path.join(save_dir, "checkpoint_last.pt"))["optimizer_history"][-1]["num_updates"] == 3


@pytest.fixture(scope="module")
def dense_checkpoint(tiny_data_bin, tmp_path_factory):
    """Dense aggregation on both sides: no parameter beyond the vanilla Transformer's."""
    return train(tiny_data_bin, str(tmp_path_factory.mktemp("dense")), "fusion_transformer", *TINY_TRANSFORMER,
                 "--aggregate-encoder", "dense", "--aggregate-decoder", "dense")


@pytest.fixture(scope="module")
def vanilla_checkpoint(tiny_data_bin, tmp_path_factory):
    return train(tiny_data_bin, str(tmp_path_factory.mktemp("vanilla")), "transformer", *TINY_TRANSFORMER)


@pytest.mark.slow
@pytest.mark.parametrize("field", ["_name", "arch"])
def test_the_architecture_cannot_change_at_load(dense_checkpoint, field):
    """fairseq builds the model of ``_name``: a vanilla Transformer would drop the aggregation."""
    with pytest.raises(ConfigurationError, match=(
            f"--model-overrides sets {field} 'transformer' but checkpoint .* was trained with arch 'fusion_transformer'")):
        checkpoint_utils.load_model_ensemble_and_task([dense_checkpoint], arg_overrides={field: "transformer"})


@pytest.mark.parametrize("overrides", [
    {"fuse_decoder": "avg"}, {"fusion_hops": 2}, {"fusion_ffn_dim": 99}, {"fuse_encoder": "none"},
    {"fusion_no_layernorm": True},
])
def test_parameter_changing_overrides_are_named_not_left_to_the_strict_load(tiny_mlrf_checkpoint, overrides):
    [(flag, value)] = overrides.items()
    with pytest.raises(ConfigurationError, match=f"--model-overrides sets {flag} {value!r} but checkpoint"):
        checkpoint_utils.load_model_ensemble_and_task([tiny_mlrf_checkpoint], arg_overrides=overrides)


@pytest.mark.slow
def test_generate_with_a_parameter_changing_override_fails_in_one_line(tiny_mlrf_checkpoint, tiny_data_bin):
    result = generate(tiny_data_bin, tiny_mlrf_checkpoint, "--model-overrides", "{'fusion_hops': 2}")
    assert_one_line_error(result, "--model-overrides sets fusion_hops 2", "was trained with fusion_hops 4")


def resume(data_bin, checkpoint, save_dir, arch, *flags):
    """fairseq-train resuming from a copy of ``checkpoint`` as checkpoint_last.pt in ``save_dir``."""
    save_dir.mkdir()
    (save_dir / "checkpoint_last.pt").write_bytes(open(checkpoint, "rb").read())
    return run_unchecked(
        "fairseq_cli.train", data_bin, "--user-dir", USER_DIR, "--arch", arch, *TINY_TRANSFORMER, *flags,
        "--optimizer", "adam", "--lr", "0.003", "--max-tokens", "1000", "--max-update", "4", "--save-dir", save_dir,
        "--no-progress-bar", "--no-epoch-checkpoints",
    )


@pytest.mark.slow
def test_resuming_a_vanilla_checkpoint_with_dense_aggregation_is_an_error(vanilla_checkpoint, tiny_data_bin, tmp_path):
    result = resume(tiny_data_bin, vanilla_checkpoint, tmp_path / "resume", "fusion_transformer",
                    "--aggregate-encoder", "dense", "--aggregate-decoder", "dense")
    assert_one_line_error(result, "trained with arch 'transformer'", "the command line gives arch 'fusion_transformer'")


@pytest.mark.slow
def test_resuming_a_dense_checkpoint_as_a_vanilla_transformer_is_an_error(dense_checkpoint, tiny_data_bin, tmp_path):
    result = resume(tiny_data_bin, dense_checkpoint, tmp_path / "resume", "transformer")
    assert_one_line_error(result, "trained with arch 'fusion_transformer'", "the command line gives arch 'transformer'")


@pytest.mark.slow
def test_resuming_with_another_fusion_function_fails_in_one_line(tiny_mlrf_checkpoint, tiny_data_bin, tmp_path):
    """The strict load fails first (another function has other parameters): the flag is named."""
    result = resume(tiny_data_bin, tiny_mlrf_checkpoint, tmp_path / "resume", "mlrf_iwslt_de_en",
                    *TINY_MLRF_FLAGS[16:], "--fuse-decoder", "avg")
    assert_one_line_error(result, "trained with fuse_decoder 'sa'", "the command line gives fuse_decoder 'avg'")


@pytest.mark.slow
def test_fine_tuning_starts_fusion_parameters_fresh(no_fusion_checkpoint, tiny_data_bin, tmp_path):
    checkpoint = train(tiny_data_bin, str(tmp_path / "finetune"), "fusion_transformer", *TINY_TRANSFORMER,
                       "--fuse-decoder", "sa", "--finetune-from-model", no_fusion_checkpoint, updates=1)
    tuned = torch.load(checkpoint)["model"]
    vanilla = torch.load(no_fusion_checkpoint)["model"]
    assert any("output_fusion." in key for key in tuned)
    assert set(vanilla) < set(tuned)


@pytest.mark.slow
def test_fine_tuning_into_a_deeper_model_names_the_command_lines_parameter(no_fusion_checkpoint, tiny_data_bin,
                                                                           tmp_path):
    """The file is whole: it is the command line's model that it does not fit (the error said the checkpoint
    does not hold the weights of the configuration it stores)."""
    result = run_unchecked(
        "fairseq_cli.train", tiny_data_bin, "--user-dir", USER_DIR, "--arch", "fusion_transformer", *TINY_TRANSFORMER,
        "--encoder-layers", "3", "--finetune-from-model", no_fusion_checkpoint, "--optimizer", "adam", "--lr", "0.003",
        "--max-tokens", "1000", "--max-update", "1", "--save-dir", tmp_path / "deeper", "--no-progress-bar")
    assert_one_line_error(result, f"{no_fusion_checkpoint}: parameter encoder.layers.2.", "is missing from the checkpoint",
                          "--finetune-from-model starts fresh only the fusion parameters the checkpoint lacks")


def test_fine_tuning_rule_is_fairseqs(tmp_path):
    trainer = SimpleNamespace(checkpoint_suffix="")
    cfg = SimpleNamespace(finetune_from_model="vanilla.pt", restore_file="checkpoint_last.pt",
                          save_dir=str(tmp_path), continue_once=None)
    assert starts_from_pretrained_model(cfg, trainer)
    (tmp_path / "checkpoint_last.pt").write_bytes(b"")
    assert not starts_from_pretrained_model(cfg, trainer)  # resuming, not fine-tuning
    assert not starts_from_pretrained_model(SimpleNamespace(**{**vars(cfg), "finetune_from_model": None}), trainer)


def test_a_state_dict_loaded_in_code_is_torchs_strict_load_or_the_callers_initialisation():
    """In code, load_state_dict is torch's: strict, the missing fusion parameters are named; strict=False starts
    them fresh, as fine-tuning does. The model reads nothing of why it loads."""
    from model_building import build_model

    vanilla = build_model("fusion_transformer", *TINY_TRANSFORMER)
    fusion = build_model("fusion_transformer", *TINY_TRANSFORMER, "--fuse-decoder", "sa")
    with pytest.raises(RuntimeError, match='Missing key.s. in state_dict: "decoder.output_fusion.'):
        fusion.load_state_dict(vanilla.state_dict())
    fusion.load_state_dict(vanilla.state_dict(), strict=False)
    fusion_weights = {name for name in fusion.state_dict() if name not in vanilla.state_dict()}
    assert fusion_weights and all("output_fusion." in name for name in fusion_weights)
    assert torch.equal(fusion.state_dict()["encoder.embed_tokens.weight"], vanilla.state_dict()["encoder.embed_tokens.weight"])


# --- the dense-connection reading of a checkpoint ----------------------------------------------

@pytest.fixture(scope="module")
def literal_dense_checkpoint(tiny_data_bin, tmp_path_factory):
    """A dense-aggregation checkpoint trained with Eq. 4 to the letter."""
    save_dir = tmp_path_factory.mktemp("dense_literal")
    return train(tiny_data_bin, str(save_dir), "fusion_transformer", *TINY_TRANSFORMER,
                 "--aggregate-encoder", "dense", "--dense-connection", "literal")


@pytest.mark.slow
def test_the_dense_connection_reading_cannot_change_at_load(literal_dense_checkpoint):
    path = literal_dense_checkpoint
    refused = "sets dense_connection 'layernorm' .* trained with dense_connection 'literal'"
    with pytest.raises(ConfigurationError, match=refused):
        checkpoint_utils.load_model_ensemble_and_task([path], arg_overrides={"dense_connection": "layernorm"})
    models, _, _ = checkpoint_utils.load_model_ensemble_and_task([path], arg_overrides={"dense_connection": "literal"})
    assert models[0].encoder.aggregation.reading == "literal"


@pytest.mark.slow
def test_a_new_dense_checkpoint_keeps_its_reading(tiny_data_bin, tmp_path):
    trained = train(tiny_data_bin, str(tmp_path), "fusion_transformer", *TINY_TRANSFORMER,
                    "--aggregate-encoder", "dense")
    _, cfg, _ = checkpoint_utils.load_model_ensemble_and_task([trained])
    assert cfg.model.dense_connection == "layernorm"


# --- the pretrained-embedding files a checkpoint names are never read ---------------------------

def embedding_files(tmp_path):
    """Files a model's build_model must not open: a FIFO (blocks for ever), /dev/zero (fills memory), any file."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    return {"fifo": str(fifo), "zero": "/dev/zero", "passwd": "/etc/passwd"}


def load_in_child(code, timeout=120):
    """``code`` run in a child interpreter with the plugin imported and at most 3 GiB of address space."""
    prelude = "import resource; resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30)); import fusion_fairseq.models\n"
    return subprocess.run([sys.executable, "-c", prelude + code], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "PYTHONWARNINGS": "ignore"})


@pytest.mark.parametrize("field,target", [("encoder_embed_path", "fifo"), ("decoder_embed_path", "zero"),
                                          ("encoder_embed_path", "passwd")])
def test_a_checkpoint_naming_embedding_files_loads_without_reading_them(tiny_mlrf_checkpoint, tiny_data_bin,
                                                                        tmp_path, field, target):
    path = crafted(tiny_mlrf_checkpoint, tmp_path, **{field: embedding_files(tmp_path)[target]})
    code = ("from fairseq import checkpoint_utils\n"
            f"models, cfg, _ = checkpoint_utils.load_model_ensemble_and_task([{path!r}])\n"
            f"assert cfg.model.{field} is None\n"
            "from fusion_fairseq.models import FusionTransformerModel\n"
            f"FusionTransformerModel.from_pretrained({str(tmp_path)!r}, checkpoint_file='crafted.pt', "
            f"data_name_or_path={tiny_data_bin!r})\n"
            "print('loaded')")
    result = load_in_child(code)
    assert result.returncode == 0 and result.stdout.strip() == "loaded", result.stderr[-2000:]


def test_generate_and_analysis_scripts_read_no_embedding_file(tiny_mlrf_checkpoint, tiny_data_bin, tmp_path, capsys):
    fifo = embedding_files(tmp_path)["fifo"]
    path = crafted(tiny_mlrf_checkpoint, tmp_path, encoder_embed_path=fifo, decoder_embed_path=fifo)
    result = subprocess.run([sys.executable, "-m", "fairseq_cli.generate", tiny_data_bin, "--user-dir", USER_DIR,
                             "--path", path, "--beam", "2", "--max-tokens", "1000", "--gen-subset", "test"],
                            capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONWARNINGS": "ignore"})
    assert result.returncode == 0 and "BLEU" in result.stdout + result.stderr, result.stderr[-2000:]
    code = (f"import sys; sys.path.insert(0, {os.path.dirname(USER_DIR) + '/scripts'!r})\n"
            "import plot_layer_attention\n"
            f"sys.exit(plot_layer_attention.main(['--path', {path!r}, '--data', {tiny_data_bin!r}, "
            f"'--out', {str(tmp_path / 'heatmap.png')!r}]))")
    result = load_in_child(code)
    assert "embed" not in result.stderr and "Traceback" not in result.stderr, result.stderr[-2000:]


@pytest.mark.parametrize("config", [
    lambda: Namespace(arch="transformer", encoder_embed_path="/dev/zero", decoder_embed_path="/etc/passwd"),
    lambda: {"_name": "transformer", "encoder": {"embed_path": "/dev/zero"}, "decoder": {"embed_path": "x"}},
])
@pytest.mark.parametrize("where", ["args", "cfg"])
def test_the_reader_forgets_every_embedding_path(config, where):
    from omegaconf import OmegaConf

    from fusion_fairseq.checkpoint_safety import forget_embedding_files

    model = config()
    model = OmegaConf.create(model) if isinstance(model, dict) else model
    forget_embedding_files({"args": model} if where == "args" else {"cfg": {"model": model}, "args": None})
    if isinstance(model, Namespace):
        assert model.encoder_embed_path is None and model.decoder_embed_path is None
    else:
        assert model.encoder.embed_path is None and model.decoder.embed_path is None


@pytest.mark.slow
def test_dense_fconv_checkpoint_naming_embedding_files_loads(dense_fconv_checkpoint, tmp_path):
    """dense_fconv refuses --encoder-embed-path when trained; a checkpoint naming one still loads, reading nothing."""
    path = crafted(dense_fconv_checkpoint, tmp_path, encoder_embed_path=embedding_files(tmp_path)["fifo"])
    result = load_in_child(f"from fairseq import checkpoint_utils; checkpoint_utils.load_model_ensemble_and_task([{path!r}])")
    assert result.returncode == 0, result.stderr[-2000:]


# --- fairseq's own structural flags cannot change at load or on resume ---------------------------

@pytest.mark.parametrize("overrides", [
    {"encoder_attention_heads": 4}, {"decoder_attention_heads": "1"}, {"activation_fn": "gelu"},
    {"decoder_normalize_before": True}, {"encoder_layers": 1}, {"no_scale_embedding": True},
    {"share_decoder_input_output_embed": True},
])
def test_fairseq_structural_overrides_are_refused_naming_the_field(tiny_mlrf_checkpoint, overrides):
    """Heads, activation, LayerNorm placement, embedding scale: no parameter changes and the scores would."""
    [(flag, value)] = overrides.items()
    with pytest.raises(ConfigurationError, match=f"--model-overrides sets {flag} {value!r} but checkpoint .* "
                                                      f"was trained with {flag} "):
        checkpoint_utils.load_model_ensemble_and_task([tiny_mlrf_checkpoint], arg_overrides=overrides)


def test_fairseq_flags_at_their_trained_values_or_tuning_flags_load(tiny_mlrf_checkpoint):
    models, cfg, _ = checkpoint_utils.load_model_ensemble_and_task(
        [tiny_mlrf_checkpoint], arg_overrides={"encoder_attention_heads": 2, "activation_fn": "relu",
                                               "dropout": 0.3, "max_source_positions": 2048})
    assert cfg.model.dropout == 0.3


@pytest.mark.slow
def test_generate_with_a_fairseq_structural_override_fails_in_one_line(tiny_mlrf_checkpoint, tiny_data_bin):
    result = generate(tiny_data_bin, tiny_mlrf_checkpoint, "--model-overrides", "{'encoder_attention_heads': 4}")
    assert_one_line_error(result, "--model-overrides sets encoder_attention_heads 4", "trained with "
                          "encoder_attention_heads 2")


@pytest.mark.slow
@pytest.mark.parametrize("flags, field", [
    (["--encoder-attention-heads", "4"], "encoder_attention_heads"),  # same parameters: would resume silently
    (["--encoder-layers", "3"], "encoder_layers"),  # the strict load fails: a traceback before
])
def test_resuming_with_another_fairseq_structure_fails_in_one_line(no_fusion_checkpoint, tiny_data_bin, tmp_path,
                                                                   flags, field):
    result = resume(tiny_data_bin, no_fusion_checkpoint, tmp_path / "resume", "fusion_transformer", *flags)
    assert_one_line_error(result, f"trained with {field} 2", f"the command line gives {field} ")


# --- checkpoints fairseq cannot use fail in one line naming the file ------------------------------

def edited(checkpoint, tmp_path, edit):
    state = torch.load(checkpoint)
    edit(state)
    torch.save(state, tmp_path / "edited.pt")
    return str(tmp_path / "edited.pt")


def first_parameter(state, change):
    name = next(iter(state["model"]))
    state["model"][name] = change(state["model"][name])


UNUSABLE = {
    "unknown architecture": (lambda s: s["cfg"]["model"].update(_name="no_such_arch"),
                             "the checkpoint's architecture 'no_such_arch' is not one fairseq knows"),
    "no model": (lambda s: s.pop("model"), "cannot read the checkpoint: it has no 'model' entry of parameters"),
    "model not a dict": (lambda s: s.update(model=[1, 2]), "it has no 'model' entry of parameters"),
    "meta tensor": (lambda s: first_parameter(s, lambda t: t.to("meta")), "is a meta tensor, without data"),
    "complex tensor": (lambda s: first_parameter(s, lambda t: t.to(torch.complex64)),
                       "is a complex tensor (torch.complex64)"),
    "not a tensor": (lambda s: first_parameter(s, lambda t: t.tolist()), "is list; a model's parameters are real"),
    "encoder_layers_to_keep": (lambda s: s["cfg"]["model"].update(encoder_layers_to_keep="0"),
                               "encoder_layers_to_keep '0' (fairseq's LayerDrop pruning) is not supported"),
    "decoder_layers_to_keep": (lambda s: s["cfg"]["model"].update(decoder_layers_to_keep="0,1"),
                               "decoder_layers_to_keep '0,1'"),
    "refused global": (lambda s: s.update(extra=__import__("pathlib").PurePosixPath("x")),
                       "cannot read the checkpoint safely (Unsupported global: GLOBAL pathlib.PurePosixPath)"),
}


@pytest.mark.parametrize("kind", list(UNUSABLE))
def test_an_unusable_checkpoint_is_named_in_one_error(tiny_mlrf_checkpoint, tmp_path, kind):
    edit, message = UNUSABLE[kind]
    path = edited(tiny_mlrf_checkpoint, tmp_path, edit)
    with pytest.raises(ConfigurationError) as error:
        checkpoint_utils.load_model_ensemble_and_task([path])
    assert str(error.value).startswith(f"{path}: ") and message in str(error.value) and "\n" not in str(error.value)


def test_layer_pruning_given_as_an_override_is_refused(tiny_mlrf_checkpoint):
    with pytest.raises(ConfigurationError, match="decoder_layers_to_keep '0' .* is not supported"):
        checkpoint_utils.load_model_ensemble_and_task([tiny_mlrf_checkpoint],
                                                      arg_overrides={"decoder_layers_to_keep": "0"})


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["unknown architecture", "meta tensor", "refused global"])
def test_generate_reports_an_unusable_checkpoint_in_one_line(tiny_mlrf_checkpoint, tiny_data_bin, tmp_path, kind):
    edit, message = UNUSABLE[kind]
    result = generate(tiny_data_bin, edited(tiny_mlrf_checkpoint, tmp_path, edit))
    assert_one_line_error(result, message)


@pytest.mark.slow
def test_generate_reports_a_pickle_payload_in_one_line(tiny_data_bin, tmp_path):
    """A callable of a module torch blocks outright (posix.system) was a 35-line UnpicklingError."""
    class RunsACommand:
        def __reduce__(self):
            return (os.system, (f"touch {tmp_path / 'pwned'}",))

    path = tmp_path / "payload.pt"
    torch.save({"model": {}, "payload": RunsACommand()}, path)
    result = generate(tiny_data_bin, path)
    assert_one_line_error(result, f"{path}: cannot read the checkpoint safely (Unsupported global: GLOBAL posix.system)")
    assert not (tmp_path / "pwned").exists()


# --- a checkpoint is checked for what it holds: shapes that fit its model, finite weights ---------

@pytest.fixture(scope="module")
def denseformer_checkpoint(tiny_data_bin, tmp_path_factory):
    return train(tiny_data_bin, str(tmp_path_factory.mktemp("denseformer")), "fusion_transformer", *TINY_TRANSFORMER,
                 "--denseformer-encoder", "--denseformer-decoder")


def alpha_name(state):
    return next(name for name in state["model"] if "alphas" in name)


def wrong_shape(state):
    name = alpha_name(state)
    size = len(state["model"][name])
    state["model"][name] = torch.zeros(size + 2)
    return name, f"has shape [{size + 2}] in the checkpoint but [{size}] in the model its configuration builds"


def nan_weight(state):
    name = "encoder.layers.0.fc1.weight"
    state["model"][name][0, 0] = float("nan")
    return name, "holds 1 NaN or infinite value"


def infinite_weight(state):
    name = "decoder.embed_tokens.weight"
    state["model"][name][1, :3] = float("inf")
    return name, "holds 3 NaN or infinite values"


def extra_weight(state):
    state["model"]["encoder.extra.weight"] = torch.zeros(2)
    return "encoder.extra.weight", "is not a parameter of the model its configuration builds"


def missing_weight(state):
    name = alpha_name(state)
    del state["model"][name]
    return name, "is missing from the checkpoint"


HELD = {"wrong shape": wrong_shape, "NaN": nan_weight, "inf": infinite_weight, "extra": extra_weight,
        "missing": missing_weight}


@pytest.mark.parametrize("kind", list(HELD))
def test_a_checkpoint_whose_weights_do_not_fit_or_are_not_finite_is_refused_naming_the_parameter(
        denseformer_checkpoint, tmp_path, kind):
    """Weights of the wrong shape, missing or extra gave a 25-line strict-load traceback; NaN or infinite ones loaded
    (fairseq-validate exited 0, the sequence generator failed an assertion)."""
    named = []
    path = edited(denseformer_checkpoint, tmp_path, lambda state: named.extend(HELD[kind](state)))
    name, message = named
    with pytest.raises(ConfigurationError) as error:
        checkpoint_utils.load_model_ensemble_and_task([path])
    text = str(error.value)
    assert text.startswith(f"{path}: parameter {name} ") and message in text and "\n" not in text, text


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["wrong shape", "NaN"])
def test_generate_reports_what_a_checkpoint_holds_in_one_line(denseformer_checkpoint, tiny_data_bin, tmp_path, kind):
    named = []
    path = edited(denseformer_checkpoint, tmp_path, lambda state: named.extend(HELD[kind](state)))
    result = generate(tiny_data_bin, path)
    assert_one_line_error(result, f"{path}: parameter {named[0]} ", named[1])


@pytest.mark.parametrize("kind", ["wrong shape", "NaN"])
def test_the_analysis_scripts_report_what_a_checkpoint_holds_in_one_line(denseformer_checkpoint, tiny_data_bin,
                                                                         tmp_path, kind):
    """They read the state themselves and hand it to fairseq's loader, which then reads no file."""
    from fusion_lab.analysis import UsageError, load_model

    named = []
    path = edited(denseformer_checkpoint, tmp_path, lambda state: named.extend(HELD[kind](state)))
    with pytest.raises(UsageError) as error:
        load_model(path, tiny_data_bin)
    text = str(error.value)
    assert f"{path}: parameter {named[0]} " in text and named[1] in text and "\n" not in text, text


# --- a stored configuration that disagrees with the weights, or that fairseq cannot read ----------

@pytest.fixture(scope="module")
def hyper_connections_checkpoint(tiny_data_bin, tmp_path_factory):
    return train(tiny_data_bin, str(tmp_path_factory.mktemp("hyper_connections")), "fusion_transformer",
                 *TINY_TRANSFORMER, "--hyper-connections-encoder", "dynamic", "--hyper-connections-decoder", "static",
                 "--hyper-connections-rate", "2")


def with_model_config(checkpoint, tmp_path, **fields):
    return edited(checkpoint, tmp_path, lambda state: state["cfg"]["model"].update(fields))


# (checkpoint fixture, cfg.model fields changed while the weights stay, what the one line says after the file)
STORED_DISAGREEMENTS = {
    "dilation of another type": ("denseformer_checkpoint", {"denseformer_dilation": "x"},
                                 "denseformer_dilation 'x' (as stored) is not a value of type int"),
    "dilation beyond the depth": ("denseformer_checkpoint", {"denseformer_dilation": 3},
                                  "--denseformer-dilation 3 leaves every encoder average reading only its own"),
    "period 0": ("denseformer_checkpoint", {"denseformer_period": 0},
                 "model.denseformer_period must be a positive integer, got 0"),
    "dilation 2": ("denseformer_checkpoint", {"denseformer_dilation": 2},
                   "parameter encoder.aggregation.alphas.0 has shape [2] in the checkpoint but [1] in the model"),
    "layer count": ("denseformer_checkpoint", {"encoder_layers": 3},
                    "parameter encoder.layers.2.self_attn.k_proj.weight is missing from the checkpoint"),
    "embed dim": ("denseformer_checkpoint", {"encoder_embed_dim": 32, "decoder_embed_dim": 32},
                  "parameter encoder.embed_tokens.weight has shape [40, 16] in the checkpoint but [40, 32]"),
    "expansion rate": ("hyper_connections_checkpoint", {"hyper_connections_rate": 3},
                       "hyper_connections.0.static_alpha has shape [2, 3] in the checkpoint but [3, 4] in the model"),
    "rate 0": ("hyper_connections_checkpoint", {"hyper_connections_rate": 0},
               "model.hyper_connections_rate must be a positive integer, got 0"),
    "rate of another type": ("hyper_connections_checkpoint", {"hyper_connections_rate": [2]},
                             "hyper_connections_rate [2] (as stored) is not a value of type int"),
    "no decoder layer": ("hyper_connections_checkpoint", {"decoder_layers": 0},
                         "--hyper-connections-decoder static wires the decoder's layers, and --decoder-layers is 0"),
    "another kind": ("hyper_connections_checkpoint", {"hyper_connections_encoder": "manifold"},
                     "parameter encoder.layers.0.hyper_connections.0.phi is missing from the checkpoint"),
    "cutoff as a string": ("denseformer_checkpoint", {"adaptive_softmax_cutoff": "5,10"},
                           "adaptive_softmax_cutoff '5,10' (as stored) is not a value of type Optional[List[int]]"),
    "cutoff without its weights": ("denseformer_checkpoint", {"adaptive_softmax_cutoff": [5, 10]},
                                   "parameter decoder.adaptive_softmax.version is missing from the checkpoint: its "
                                   "configuration builds an adaptive softmax"),
}


def assert_names_the_file_in_one_line(text, path, message):
    assert text.startswith((f"{path}: ", f"checkpoint {path}: ")) and message in text and "\n" not in text, text


@pytest.mark.parametrize("kind", list(STORED_DISAGREEMENTS))
def test_a_stored_configuration_that_does_not_fit_is_refused_naming_the_file(request, tmp_path, kind):
    """A wrongly typed value was omegaconf's 60-line traceback, the cutoff without its weights fairseq's "This
    version of the model is no longer supported"; the plugin's own refusals of a stored value did not name the file."""
    checkpoint, fields, message = STORED_DISAGREEMENTS[kind]
    path = with_model_config(request.getfixturevalue(checkpoint), tmp_path, **fields)
    with pytest.raises(ValueError) as error:
        checkpoint_utils.load_model_ensemble_and_task([path])
    assert isinstance(error.value, ConfigurationError), error.value
    assert_names_the_file_in_one_line(str(error.value), path, message)


@pytest.mark.parametrize("kind", ["dilation of another type", "rate 0", "cutoff without its weights"])
def test_the_hub_and_the_analysis_scripts_refuse_a_stored_configuration_in_one_line(request, tiny_data_bin,
                                                                                      tmp_path, kind):
    from fusion_lab.analysis import UsageError, load_model

    checkpoint, fields, message = STORED_DISAGREEMENTS[kind]
    path = with_model_config(request.getfixturevalue(checkpoint), tmp_path, **fields)
    with pytest.raises(ConfigurationError) as error:
        FusionTransformerModel.from_pretrained(str(tmp_path), checkpoint_file="edited.pt",
                                               data_name_or_path=tiny_data_bin)
    assert_names_the_file_in_one_line(str(error.value), tmp_path / "edited.pt", message)
    with pytest.raises(UsageError) as error:
        load_model(path, tiny_data_bin)
    assert_names_the_file_in_one_line(str(error.value), path, message)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["dilation of another type", "expansion rate"])
def test_generate_and_validate_refuse_a_stored_configuration_in_one_line(request, tiny_data_bin, tmp_path, kind):
    checkpoint, fields, message = STORED_DISAGREEMENTS[kind]
    path = with_model_config(request.getfixturevalue(checkpoint), tmp_path, **fields)
    assert_one_line_error(generate(tiny_data_bin, path), path, message)
    assert_one_line_error(validate(tiny_data_bin, path, "--task", "translation"), path, message)


def test_a_wrongly_typed_override_is_named_as_an_override(denseformer_checkpoint):
    with pytest.raises(ConfigurationError, match=f"^checkpoint {denseformer_checkpoint}: dropout 'high' "
                                                 r"\(given by --model-overrides\) is not a value of type float"):
        checkpoint_utils.load_model_ensemble_and_task([denseformer_checkpoint], arg_overrides={"dropout": "high"})


def legacy_args(state):
    """The state as fairseq saved it before its omegaconf configuration: one flat ``args`` Namespace, no ``cfg``."""
    sections = ("common", "task", "criterion", "optimization", "checkpoint", "dataset", "model")
    flat = {key: value for section in sections for key, value in (state["cfg"][section] or {}).items()}
    flat.update(arch=state["cfg"]["model"]["_name"], task="translation", criterion="cross_entropy", optimizer="adam",
                lr_scheduler="fixed")
    del flat["_name"]
    state["args"] = Namespace(**flat)
    del state["cfg"]


def test_a_legacy_args_checkpoint_loads_as_fairseq_loads_it(denseformer_checkpoint, tiny_data_bin, tmp_path):
    path = edited(denseformer_checkpoint, tmp_path, legacy_args)
    models, cfg, _ = checkpoint_utils.load_model_ensemble_and_task([path], arg_overrides={"data": tiny_data_bin})
    trained = torch.load(denseformer_checkpoint)["model"]
    assert cfg.model.denseformer_encoder and cfg.model.encoder_layers == 2
    assert all(torch.equal(tensor, trained[name]) for name, tensor in models[0].state_dict().items())


@pytest.mark.parametrize("edit,held", [
    (lambda state: state["cfg"].update(model=None), "no 'cfg.model'"),
    (lambda state: state.update(cfg=None), "no 'cfg'"),
    (lambda state: state["cfg"].update(model=[1, 2]), "a cfg.model of type list"),
])
def test_a_checkpoint_without_a_model_configuration_is_refused_in_one_line(denseformer_checkpoint, tmp_path, edit,
                                                                           held):
    """``cfg.model = None`` was a TypeError inside fairseq's upgrade of the state."""
    path = edited(denseformer_checkpoint, tmp_path, edit)
    with pytest.raises(CheckpointContentError) as error:
        checkpoint_utils.load_model_ensemble_and_task([path])
    assert_names_the_file_in_one_line(str(error.value), path, f"it stores no model configuration (no legacy 'args', "
                                                              f"and {held})")


def test_legacy_args_that_are_no_namespace_are_refused_in_one_line(denseformer_checkpoint, tmp_path):
    path = edited(denseformer_checkpoint, tmp_path, lambda state: state.update(args={"arch": "fusion_transformer"}))
    with pytest.raises(CheckpointContentError) as error:
        checkpoint_utils.load_model_ensemble_and_task([path])
    assert_names_the_file_in_one_line(str(error.value), path, "its legacy 'args' is a dict, not the argparse.Namespace")


# --- corpus evaluate: one line for a checkpoint it cannot score, or a flag fairseq-generate refuses --------

def evaluate(data_bin, checkpoint, reference, out, *extra):
    return run_unchecked("fusion_lab.corpus", "evaluate", data_bin, checkpoint, "--ref", reference,
                         "--out", out, *extra)


def error_lines(result):
    """What a failed run printed besides fairseq's import notice and the tool's progress lines."""
    return [line for line in result.stderr.splitlines() if line.strip() and not line.startswith(("INFO:", "[corpus]"))]


@pytest.fixture
def another_dictionary(tiny_data_bin, tmp_path):
    """``tiny_data_bin`` whose source dictionary has three more types than the one the checkpoints were trained on."""
    import shutil

    data_bin = tmp_path / "another-bin"
    shutil.copytree(tiny_data_bin, data_bin)
    with open(data_bin / "dict.src.txt", "a") as dictionary:
        dictionary.write("xa 1\nxb 1\nxc 1\n")
    return data_bin


def test_evaluate_names_a_checkpoint_of_another_dictionary_in_one_line(denseformer_checkpoint, another_dictionary,
                                                                       tiny_raw, tmp_path):
    """It was a 36-line dump of fairseq-generate's output."""
    result = evaluate(another_dictionary, denseformer_checkpoint, f"{tiny_raw}/test.tgt", tmp_path / "eval")
    assert result.returncode == 2 and error_lines(result) == [
        f"corpus: error: CHECKPOINT {denseformer_checkpoint}: parameter encoder.embed_tokens.weight has 40 rows, one "
        f"per type of the dictionary it was trained with, but {another_dictionary}/dict.src.txt has 43 types: the "
        "checkpoint was trained on another dictionary; evaluate it on the DATA_BIN it was trained with"], result.stderr
    assert not (tmp_path / "eval").exists()


@pytest.mark.slow
@pytest.mark.parametrize("extra,said", [
    (["--", "--no-such-flag"], "generate.py: error: unrecognized arguments: --no-such-flag"),
    (["--", "--beam", "x"], "generate.py: error: argument --beam: invalid int value: 'x'"),
    ([], "parameter encoder.aggregation.alphas.0 has shape [2] in the checkpoint but [1]"),
])
def test_evaluate_reports_a_failed_generate_in_one_line(denseformer_checkpoint, tiny_data_bin, tiny_raw, tmp_path,
                                                        extra, said):
    """A flag fairseq-generate refused printed its 65-line usage, a checkpoint it refused 26 lines of traceback."""
    checkpoint = with_model_config(denseformer_checkpoint, tmp_path, denseformer_dilation=2) if not extra \
        else denseformer_checkpoint
    result = evaluate(tiny_data_bin, checkpoint, f"{tiny_raw}/test.tgt", tmp_path / "eval", *extra)
    log = tmp_path / "eval" / "generate-test.log"
    [line] = error_lines(result)
    assert result.returncode == 1 and line.startswith(f"error: fairseq-generate failed (exit ") and said in line, line
    assert f"; log {log}: " in line and said in log.read_text()  # the whole output stays in the log
