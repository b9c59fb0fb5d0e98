"""Bad flags get a clear error naming the flag, the value and what is allowed."""

import os
import re
import subprocess
import sys
import tarfile
from types import SimpleNamespace

import pytest
from fairseq.models import ARCH_MODEL_REGISTRY

from fusion_fairseq.errors import ConfigurationError
from fusion_fairseq.models import FusionTransformerModel
from fusion_fairseq.models.fusion_config import check_fusion_args
from conftest import TINY_MLRF_FLAGS, USER_DIR
from model_building import build_model, dictionary_of_size, parse_model_args

TINY = TINY_MLRF_FLAGS[:16]  # small dimensions, no fusion flags


def cli_error(capsys, *flags):
    with pytest.raises(SystemExit) as exit_info:
        parse_model_args("fusion_transformer", *flags)
    assert exit_info.value.code == 2
    return capsys.readouterr().err


def test_unknown_fusion_name(capsys):
    err = cli_error(capsys, "--fuse-encoder", "max")
    assert "argument --fuse-encoder: invalid choice: 'max'" in err
    assert "none, avg, fnn, sa" in err or "'none', 'avg', 'fnn', 'sa'" in err


@pytest.mark.parametrize("flag", ["--fusion-hops", "--fusion-attn-dim", "--fusion-ffn-dim"])
@pytest.mark.parametrize("value", ["0", "-3", "two"])
def test_non_positive_sizes(capsys, flag, value):
    err = cli_error(capsys, flag, value)
    assert f"{flag} must be a positive integer, got '{value}'" in err


def test_fusion_dropout_out_of_range(capsys):
    assert "--fusion-dropout must be in [0, 1), got '1.5'" in cli_error(capsys, "--fusion-dropout", "1.5")


def valid_args(**changes):
    args = parse_model_args("mlrf_iwslt_de_en")
    vars(args).update(changes)
    return args


@pytest.mark.parametrize(
    "changes,message",
    [
        ({"fuse_decoder": "median"}, "--fuse-decoder must be one of none, avg, fnn, sa, got 'median'"),
        ({"fusion_hops": 0}, "--fusion-hops must be a positive integer, got 0"),
        ({"fusion_attn_dim": -1}, "--fusion-attn-dim must be a positive integer, got -1"),
        ({"fusion_ffn_dim": 2.5}, "--fusion-ffn-dim must be a positive integer, got 2.5"),
        ({"encoder_layerdrop": 0.2}, "--encoder-layerdrop/--decoder-layerdrop must be 0"),
        ({"fuse_encoder": "sa", "decoder_embed_dim": 128}, r"--encoder-embed-dim \(256\) == --decoder-embed-dim \(128\)"),
        ({"surface_fusion": "hard", "adaptive_softmax_cutoff": "2000,4000"},
         "--surface-fusion hard projects .* --adaptive-softmax-cutoff 2000,4000 replaces it"),
        # the model was built, then its first forward failed in F.linear (480x8 and 16x16)
        ({"surface_fusion": "soft", "decoder_output_dim": 128},
         r"--surface-fusion soft joins .* needs --decoder-output-dim \(128\) == --decoder-embed-dim \(256\)$"),
    ],
)
def test_configurations_built_in_code_are_checked_too(changes, message):
    with pytest.raises(ValueError, match=message):
        check_fusion_args(valid_args(**changes))


@pytest.mark.parametrize("arch, flags, message", [
    ("fusion_transformer", ("--encoder-layerdrop", "0.5"),
     "--encoder-layerdrop 0.5: fusion_transformer runs every layer it builds (no LayerDrop)"),
    ("fusion_transformer", ("--hyper-connections-decoder", "static", "--decoder-layerdrop", "0.3"),
     "--decoder-layerdrop 0.3: fusion_transformer runs every layer it builds"),
    ("fusion_transformer", ("--encoder-layers-to-keep", "0,1"), "--encoder-layers-to-keep [0, 1]: fusion_transformer"),
    ("dense_transformer", ("--decoder-layerdrop", "0.2"), "--decoder-layerdrop 0.2 is not supported by dense_transformer"),
])
def test_layerdrop_is_refused_where_the_stacks_would_run_every_layer(arch, flags, message):
    """The stacks call their layers by index, so fairseq's LayerDrop dropped no layer, without a word."""
    with pytest.raises(ConfigurationError, match=re.escape(message)):
        build_model(arch, *flags)


def test_build_model_rejects_a_bad_configuration():
    task = SimpleNamespace(source_dictionary=dictionary_of_size(10), target_dictionary=dictionary_of_size(10))
    with pytest.raises(ValueError, match="--fusion-hops must be a positive integer, got 0"):
        FusionTransformerModel.build_model(valid_args(fusion_hops=0), task)


def test_share_all_embeddings_needs_a_joined_dictionary():
    with pytest.raises(ValueError, match="--share-all-embeddings requires a joined dictionary"):
        build_model("mlrf_iwslt_de_en", "--share-all-embeddings")
    shared = build_model("mlrf_iwslt_de_en", "--share-all-embeddings", joined=True)
    assert shared.encoder.embed_tokens is shared.decoder.embed_tokens


# --- every error names the flag, the value and what is allowed -------------------------------

def arch_cli_error(capsys, arch, *flags):
    with pytest.raises(SystemExit) as exit_info:
        parse_model_args(arch, *flags)
    assert exit_info.value.code == 2
    return capsys.readouterr().err


@pytest.mark.parametrize("flag,allowed", [
    ("--surface-fusion-lambda", "in [0, 1]"),
    ("--surface-fusion-tau", ">= 0.01"),
    ("--layer-attention-dropconnect", "in [0, 1)"),
    ("--fusion-dropout", "in [0, 1)"),
])
def test_text_given_to_a_real_valued_flag(capsys, flag, allowed):
    assert f"{flag} must be a number {allowed}, got 'high'" in cli_error(capsys, flag, "high")


@pytest.mark.parametrize("tau", ["1e-30", "0.001", "inf"])
def test_a_vanishing_or_infinite_temperature_is_refused_as_it_is_parsed(capsys, tau):
    """1e-30 trained into NaN gradients; 0.001 and inf were parsed and refused only as the model was built."""
    assert f"--surface-fusion-tau must be >= 0.01, got '{tau}'" in cli_error(
        capsys, *TINY, "--surface-fusion", "hard", "--surface-fusion-tau", tau)
    with pytest.raises(ValueError, match=rf"^--surface-fusion-tau must be >= 0.01, got {float(tau)!r}$"):
        check_fusion_args(valid_args(surface_fusion="soft", surface_fusion_tau=float(tau)))


def test_a_bad_dropout_is_named_as_given_not_as_the_fusion_dropout_it_sets():
    args = parse_model_args("fusion_transformer", *TINY, "--dropout", "nan", "--fuse-encoder", "fnn")
    with pytest.raises(ValueError, match=r"^--dropout must be in \[0, 1\), got nan$"):
        check_fusion_args(args)


@pytest.mark.parametrize("changes,message", [
    ({"surface_fusion_lambda": "high"}, "--surface-fusion-lambda must be a number in [0, 1], got 'high'"),
    ({"surface_fusion_tau": None}, "--surface-fusion-tau must be a number >= 0.01, got None"),
    ({"layer_attention_dropconnect": [0.3]}, "--layer-attention-dropconnect must be a number in [0, 1), got [0.3]"),
    ({"fusion_dropout": "0.1"}, "--fusion-dropout must be a number in [0, 1), got '0.1'"),
    ({"fusion_independent_w1": "yes"}, "--fusion-independent-w1 is a switch: True or False, got 'yes'"),
    ({"layer_attention": "fine", "fuse_encoder": "none", "mask_encoder_layer": "2"},
     "--mask-encoder-layer must be an integer, got '2'"),
    ({"dropout": 1.5}, "--dropout must be in [0, 1), got 1.5"),
    ({"attention_dropout": -0.1}, "--attention-dropout must be in [0, 1), got -0.1"),
    # compared with a number before they were type-checked: a bare TypeError
    ({"multi_layer_attention": "2"}, "--multi-layer-attention must be a positive integer, got '2'"),
    ({"decoder_layerdrop": "0.1"}, "--decoder-layerdrop must be a number in [0, 1), got '0.1'"),
])
def test_wrong_types_from_model_overrides_are_named(changes, message):
    """--model-overrides values reach the checks untyped: a ValueError naming the flag, no TypeError."""
    with pytest.raises(ValueError) as error:
        check_fusion_args(valid_args(**changes))
    assert str(error.value) == message


def test_layerwise_coordination_dropout_is_checked(capsys):
    err = arch_cli_error(capsys, "layerwise_coordination", "--dropout", "1.5")
    assert "argument --dropout: --dropout must be in [0, 1), got '1.5'" in err
    args = parse_model_args("layerwise_coordination")
    args.attention_dropout = 2.0  # as read from a checkpoint or --model-overrides
    joined = dictionary_of_size(10)
    with pytest.raises(ValueError, match=r"--attention-dropout must be in \[0, 1\), got 2.0"):
        ARCH_MODEL_REGISTRY["layerwise_coordination"].build_model(args, SimpleNamespace(
            source_dictionary=joined, target_dictionary=joined))


@pytest.mark.parametrize("arch", ["dense_fconv", "dense_transformer"])
def test_dense_models_check_dropout(arch, capsys):
    with pytest.raises(SystemExit):
        parse_model_args(arch, "--dropout", "1.5")
    assert "argument --dropout: --dropout must be in [0, 1), got '1.5'" in capsys.readouterr().err
    args = parse_model_args(arch)
    args.dropout = 1.5  # as read from a checkpoint or --model-overrides
    joined = dictionary_of_size(10)
    with pytest.raises(ValueError, match=r"^--dropout must be in \[0, 1\), got 1.5$"):
        ARCH_MODEL_REGISTRY[arch].build_model(args, SimpleNamespace(source_dictionary=joined, target_dictionary=joined))


# --- flags that do nothing in the chosen configuration are warned about ----------------------

@pytest.mark.parametrize("flags,warning", [
    (["--fuse-decoder", "fnn", "--fusion-hops", "2"], "--fusion-hops 2: only self-attention fusion"),
    (["--layer-attention-dropconnect", "0.5"], "--layer-attention-dropconnect 0.5: it drops layer-attention weights"),
    (["--surface-fusion", "soft", "--surface-fusion-lambda", "0.5"],
     "--surface-fusion-lambda 0.5: only hard SurfaceFusion (Eq. 6) interpolates, and --surface-fusion is soft"),
    (["--surface-fusion-lambda", "0.5"], "--surface-fusion is none"),
    (["--fuse-encoder", "avg", "--fusion-no-layer-embedding"],
     "--fusion-no-layer-embedding: only self-attention and FNN fusion read the layer embedding, "
     "and --fuse-encoder/--fuse-decoder are avg/none"),
    (["--aggregate-encoder", "linear", "--dense-connection", "sum"],
     "--dense-connection sum: it reads dense aggregation, and --aggregate-encoder/--aggregate-decoder are linear/none"),
    (["--fusion-independent-w1"], "--fusion-independent-w1: only self-attention fusion has W1 (Eq. 5), and "
                                  "--fuse-encoder/--fuse-decoder are none/none"),
    (["--fuse-decoder", "avg", "--fusion-attn-dim", "32"], "--fusion-attn-dim 32: only self-attention fusion"),
    (["--fusion-ffn-dim", "24"], "--fusion-ffn-dim 24: only FNN and self-attention fusion have a fusion FNN"),
    (["--fusion-dropout", "0.5"], "--fusion-dropout 0.5: only FNN and self-attention fusion"),
    (["--fusion-no-layernorm"], "--fusion-no-layernorm: it acts on layer fusion"),
    (["--fusion-no-embedding-layer"], "--fusion-no-embedding-layer: it acts on layer fusion"),
    (["--aggregate-encoder", "dense", "--aggregation-fn", "relu"],
     "--aggregation-fn relu: only iterative and hierarchical aggregation and multi-layer attention"),
    (["--aggregation-residual", "top"], "--aggregation-residual top: only iterative and hierarchical"),
    (["--surface-fusion-tau", "3"], "--surface-fusion-tau 3.0: it is SurfaceFusion's temperature, and --surface-fusion is none"),
])
def test_idle_fusion_flags_are_warned_about(caplog, flags, warning):
    build_model("fusion_transformer", *TINY, *flags)
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1 and warnings[0].startswith("flag without effect: ") and warning in warnings[0]


@pytest.mark.parametrize("flags", [
    [], ["--fuse-decoder", "sa", "--fusion-hops", "2"], ["--layer-attention", "fine", "--layer-attention-dropconnect", "0.5"],
    ["--surface-fusion", "hard", "--surface-fusion-lambda", "0.5"], ["--fusion-hops", "4"],
    ["--fuse-encoder", "fnn", "--fusion-no-layer-embedding"], ["--aggregate-decoder", "dense", "--dense-connection", "sum"],
    ["--fuse-decoder", "avg", "--fusion-no-layernorm", "--fusion-ffn-dim", "32"],  # 2 x 16: the default
    ["--aggregate-decoder", "hierarchical", "--aggregation-fn", "relu"], ["--surface-fusion", "soft", "--surface-fusion-tau", "3"],
])
def test_flags_in_use_give_no_warning(caplog, flags):
    build_model("fusion_transformer", *TINY, *flags)
    assert not [r for r in caplog.records if r.levelname == "WARNING"]


def test_a_presets_own_values_are_not_taken_for_idle_flags(caplog):
    """mlrf_nist_zh_en sets independent W1 and its own fusion sizes; its baseline (no fusion) gives
    no warning for what the user never passed."""
    build_model("mlrf_nist_zh_en", "--fuse-decoder", "none")
    assert not [r for r in caplog.records if r.levelname == "WARNING"]


def test_growth_dim_without_a_dense_side_is_warned_about(caplog):
    build_model("dense_transformer", "--no-dense-encoder", "--no-dense-decoder", "--growth-dim", "24")
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert warnings == ["flag without effect: --growth-dim 24: it is the dense layers' width, and both "
                        "--no-dense-encoder and --no-dense-decoder are set"]
    caplog.clear()
    build_model("dense_transformer", "--no-dense-encoder", "--no-dense-decoder")  # the architecture's own width
    assert not [r for r in caplog.records if r.levelname == "WARNING"]


def test_summary_every_beyond_the_depth_is_warned_about(caplog):
    four_layers = ["--encoder-layers", "[(8, 3)] * 4", "--decoder-layers", "[(8, 3)] * 4"]
    build_model("dense_fconv", *four_layers, "--summary-every", "4")  # a summary after layer 3
    assert not [r for r in caplog.records if r.levelname == "WARNING"]
    build_model("dense_fconv", *four_layers, "--summary-every", "5")
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert warnings == ["flag without effect: --summary-every 5 builds no summary layer (one follows every 4 "
                        "layers below the top layer; dense layers: encoder 4, decoder 4)"]


@pytest.mark.parametrize("arch,flags,softmax", [
    ("dense_fconv", ["--encoder-layers", "[(8, 3)] * 4", "--decoder-layers", "[(8, 3)] * 4"], "--decoder-out-embed-dim"),
    ("dense_transformer", [], "--decoder-output-dim"),
])
def test_a_softmax_width_beside_small_embeddings_is_warned_about(caplog, arch, flags, softmax):
    """Sec. 4.2: the softmax matrix takes the small embeddings' width, whatever the user asked for."""
    build_model(arch, *flags, "--embed-bottleneck-dim", "8", softmax, "12")
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert warnings == [f"flag without effect: {softmax} 12: the softmax matrix takes the small embeddings' width "
                        "(Sec. 4.2), and --embed-bottleneck-dim is 8"]
    caplog.clear()
    build_model(arch, *flags, "--embed-bottleneck-dim", "8")
    assert not [r for r in caplog.records if r.levelname == "WARNING"]


@pytest.mark.parametrize("flags", [["--layer-attention-dropconnect", "0.3"], ["--aggregation-residual=all"]])
def test_idle_flag_warnings_read_the_configuration_not_the_command_line(caplog, monkeypatch, flags):
    """A flag typed at the architecture's own value configures what the architecture would: the warning comes from
    the values the model is built from (a checkpoint's or a hydra config's the same), never from sys.argv."""
    monkeypatch.setattr(sys, "argv", ["fairseq-train", "data-bin", *flags])
    build_model("fusion_transformer", *TINY, *[part for flag in flags for part in flag.split("=")])
    assert not [r for r in caplog.records if r.levelname == "WARNING"]


@pytest.mark.parametrize("flags,warning", [
    (["--summary-layer", "linear", "--summary-every", "0"],
     "--summary-layer linear: it is the kind of the summary layers, and --summary-every is 0 (no summary layers)"),
    (["--residual-dim", "64"], "--residual-dim 64: it is the width of a residual side, and neither --no-dense-encoder "
                               "nor --no-dense-decoder is set"),
    (["--decoder-attention", "False"], "--decoder-attention False: the dense_fconv decoder attends to the source in "
                                       "every layer (Sec. 3.2), and it cannot be switched off"),
])
def test_idle_dense_fconv_flags_are_warned_about(caplog, flags, warning):
    build_model("dense_fconv", "--encoder-layers", "[(8, 3)] * 4", "--decoder-layers", "[(8, 3)] * 4", *flags)
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert warnings == [f"flag without effect: {warning}"]
    caplog.clear()
    build_model("dense_fconv_iwslt_de_en_8l")  # its own linear summary layers and residual width
    assert not [r for r in caplog.records if r.levelname == "WARNING"]


@pytest.mark.parametrize("flags", [["--layer-attention", "fine"], ["--fuse-encoder", "sa"], ["--denseformer-encoder"],
                                   ["--mudd-encoder"], ["--hyper-connections-encoder", "dynamic"]])
def test_no_cross_attention_with_a_source_memory_is_refused(flags):
    """The fusion would get no gradient and the output would ignore the source."""
    with pytest.raises(ValueError, match=f"--no-cross-attention removes the decoder's attention to the source memory "
                                         f"that {' '.join(flags)} builds"):
        build_model("fusion_transformer", *TINY, *flags, "--no-cross-attention")


# --- errors found while building end fairseq's command in one line -------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("flags,message", [
    (["--arch", "dense_fconv_iwslt_de_en", "--embed-bottleneck-dim", "512"],
     "--embed-bottleneck-dim 512 is wider than --encoder-embed-dim 256"),
    (["--arch", "fusion_transformer", "--layer-attention", "fine", "--fuse-encoder", "sa"],
     "--layer-attention fine and --fuse-encoder sa both define the decoder's source memory"),
])
def test_build_time_errors_print_one_line(tiny_data_bin, tmp_path, flags, message):
    result = subprocess.run(
        [sys.executable, "-m", "fairseq_cli.train", tiny_data_bin, "--user-dir", USER_DIR, *flags,
         "--optimizer", "adam", "--lr", "0.001", "--max-tokens", "500", "--max-update", "1",
         "--save-dir", str(tmp_path), "--no-progress-bar"],
        capture_output=True, text=True, timeout=600, env={**os.environ, "PYTHONWARNINGS": "ignore"},
    )
    assert result.returncode == 1
    last_line = result.stderr.strip().splitlines()[-1]  # Python's report of the plugin's error ends with its line
    assert last_line.startswith("fusion_fairseq.errors.ConfigurationError: ") and message in last_line


@pytest.mark.parametrize("arch,changes,message", [
    ("layerwise_coordination", {"embed_dim": "512"}, "--embed-dim must be a positive integer, got '512'"),
    ("layerwise_coordination", {"layers": 2.0}, "--layers must be a positive integer, got 2.0"),
    # a text switch read as True, then a strict-load size mismatch
    ("layerwise_coordination", {"no_layer_sharing": "yes"}, "--no-layer-sharing is a switch: True or False, got 'yes'"),
    ("dense_fconv", {"embed_bottleneck_dim": "64"}, "--embed-bottleneck-dim must be a positive integer, got '64'"),
    ("dense_fconv", {"growth_dim": "64"}, "--growth-dim must be a positive integer, got '64'"),
    ("dense_transformer", {"summary_every": "5"}, "--summary-every must be 0 (no summary layers) or an integer >= 2"),
    # a text switch read as True, a text width handed to torch, a text kernel compared with 0
    ("dense_fconv", {"no_dense_encoder": "yes"}, "--no-dense-encoder is a switch: True or False, got 'yes'"),
    ("dense_transformer", {"no_dense_decoder": "no"}, "--no-dense-decoder is a switch: True or False, got 'no'"),
    ("dense_fconv", {"no_dense_encoder": True, "residual_dim": "8"}, "--residual-dim must be a positive integer, got '8'"),
    ("dense_fconv", {"encoder_layers": "[(8, 'x')] * 2"},
     "--encoder-layers: hidden sizes and kernel widths must be integers, got (8, 'x')"),
    ("dense_fconv", {"no_dense_encoder": True, "encoder_layers": "[(8.5, 3)] * 2"},
     "--encoder-layers: hidden sizes and kernel widths must be integers, got (8.5, 3)"),
])
def test_wrong_types_for_the_other_architectures_are_named(arch, changes, message):
    args = parse_model_args(arch)
    vars(args).update(changes)  # as --model-overrides or a checkpoint would give them
    joined = dictionary_of_size(10)
    with pytest.raises(ValueError) as error:
        ARCH_MODEL_REGISTRY[arch].build_model(args, SimpleNamespace(source_dictionary=joined, target_dictionary=joined))
    assert str(error.value).startswith(message)


# ------------------------------------------------------------------------------------- walks and links

def find_in_a_child(root, name, work, timeout=60):
    """``corpus.find(name, root, work)`` in a child process that a walk without end cannot hang."""
    code = "import sys; from fusion_lab.corpus import find; print(find(*sys.argv[1:]))"
    return subprocess.run([sys.executable, "-c", code, name, str(root), str(work)], capture_output=True, text=True,
                          timeout=timeout)


def test_a_walk_does_not_follow_links_back_up_the_tree(tmp_path):
    """Two links back up (``--from R`` holding R/up -> R and R/top -> ..) made os.walk(followlinks=True) grow
    without bound; the walk skips every link below R, each named once in a warning line."""
    root, work = tmp_path / "mine", tmp_path / "work"
    (root / "texts").mkdir(parents=True)
    work.mkdir()
    (root / "texts" / "train.de").write_text("hallo\n")
    os.symlink(root, root / "up")
    os.symlink("..", root / "texts" / "top")
    result = find_in_a_child(root, "train.de", work)
    assert result.returncode == 0 and result.stdout.strip() == str(root / "texts" / "train.de"), result.stderr
    warnings = [line for line in result.stderr.splitlines() if "warning:" in line]
    assert sorted(warnings) == sorted(f"[corpus] warning: {link} is a link, not followed: walks stay inside {root}"
                                      for link in (root / "texts" / "top", root / "up"))


def test_a_walk_reads_no_file_through_a_link(tmp_path, capsys):
    """A file found by its name may not be a link out of the tree (a stranger's folder naming ~/.ssh/id_rsa
    train.de), nor may an archive beside it."""
    from fusion_lab import corpus

    root, work, outside = tmp_path / "mine", tmp_path / "work", tmp_path / "outside"
    for folder in (root, work, outside):
        folder.mkdir()
    (outside / "secret").write_text("not a corpus\n")
    os.symlink(outside / "secret", root / "train.de")
    with tarfile.open(outside / "texts.tgz", "w:gz") as archive:
        archive.add(outside / "secret", arcname="train.de")
    os.symlink(outside / "texts.tgz", root / "texts.tgz")
    with pytest.raises(SystemExit, match=f"cannot find train.de under {root}"):
        corpus.find("train.de", str(root), str(work))
    err = capsys.readouterr().err
    assert f"warning: {root / 'train.de'} is a link, not followed" in err
    assert f"warning: {root / 'texts.tgz'} is a link, not followed" in err
    assert not os.listdir(work / "unpacked")


# ------------------------------------------------------------------------------ options that would do nothing

@pytest.mark.parametrize("flags,message", [
    (["--denseformer-encoder", "--denseformer-dilation", "3"],
     "--denseformer-dilation 3 leaves every encoder average reading only its own layer's output: the averages follow "
     "layers up to 2 (--encoder-layers 2, --denseformer-period 1); allowed: at most 2"),
    (["--denseformer-decoder", "--decoder-layers", "6", "--denseformer-period", "4", "--denseformer-dilation", "5"],
     "--denseformer-dilation 5 leaves every decoder average reading only its own layer's output: the averages follow "
     "layers up to 4 (--decoder-layers 6, --denseformer-period 4); allowed: at most 4"),
    (["--hyper-connections-encoder", "static", "--encoder-layers", "0"],
     "--hyper-connections-encoder static wires the encoder's layers, and --encoder-layers is 0: allowed with at least "
     "one layer"),
    (["--hyper-connections-decoder", "manifold", "--decoder-layers", "0"],
     "--hyper-connections-decoder manifold wires the decoder's layers, and --decoder-layers is 0: allowed with at "
     "least one layer"),
    (["--aggregate-encoder", "dense", "--encoder-layers", "0"],
     "--aggregate-encoder dense wires the encoder's layers, and --encoder-layers is 0: allowed with at least one layer"),
])
def test_options_that_would_do_nothing_are_refused(flags, message):
    """A dilation beyond the last averaged layer leaves DenseFormer no dense connection, and a wiring of zero layers
    connects nothing; both trained without a word."""
    with pytest.raises(ConfigurationError) as error:
        build_model("fusion_transformer", *TINY, *flags)
    assert str(error.value) == message


@pytest.mark.parametrize("flags", [
    ["--denseformer-encoder", "--denseformer-dilation", "2"],  # the average after layer 2 reads the embedding too
    ["--denseformer-decoder", "--decoder-layers", "6", "--denseformer-period", "4", "--denseformer-dilation", "4"],
    ["--hyper-connections-encoder", "static", "--encoder-layers", "1"],
])
def test_the_largest_useful_values_are_taken(flags):
    build_model("fusion_transformer", *TINY, *flags)
