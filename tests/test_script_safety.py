"""Scripts never replace a user's files, check their outputs before the work, refuse a
non-positive --beam / --timeout, and report a damaged checkpoint file in one line naming it."""

import os
import subprocess
import sys
from types import SimpleNamespace

import pytest

from conftest import SCRIPTS, load_script

RECIPES = {
    "prepare-multi30k.sh": ("de", "en"),
    "prepare-iwslt14.sh": ("de", "en"),
    "prepare-wmt14-en-de.sh": ("en", "de"),
    "prepare-wmt16-en-ro.sh": ("en", "ro"),
}


def recipe(name, *args):
    return subprocess.run(["bash", os.path.join(SCRIPTS, name), *map(str, args)], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "PYTHON": sys.executable, "PYTHONWARNINGS": "ignore"})


def snapshot(directory):
    return {name: (directory / name).read_bytes() for name in sorted(os.listdir(directory))
            if (directory / name).is_file()}


# --- data recipes ----------------------------------------------------------------------------

@pytest.mark.parametrize("name", list(RECIPES))
def test_recipes_refuse_to_replace_a_users_files(name, tmp_path):
    src, tgt = RECIPES[name]
    dest = tmp_path / "dest"
    dest.mkdir()
    (dest / f"train.{src}").write_text("my own corpus\n")
    (dest / "code").write_text("my own BPE codes\n")
    before = snapshot(dest)
    result = recipe(name, "--dest", dest, "--from", tmp_path / "nowhere.tgz")
    assert result.returncode == 2  # --from is checked first: nothing was read
    result = recipe(name, "--dest", dest)
    assert result.returncode == 2, result.stderr
    assert f"--dest '{dest}' already holds what this recipe writes: {dest}/code {dest}/train.{src}" in result.stderr
    assert "pass --force" in result.stderr
    assert snapshot(dest) == before and sorted(os.listdir(dest)) == ["code", f"train.{src}"]  # not even a work dir


def test_a_non_empty_databin_is_refused(tmp_path):
    databin = tmp_path / "bin"
    databin.mkdir()
    (databin / "dict.de.txt").write_text("mine 1\n")
    result = recipe("prepare-multi30k.sh", "--dest", tmp_path / "dest", "--databin", databin)
    assert result.returncode == 2 and f"{databin} (not empty)" in result.stderr
    assert (databin / "dict.de.txt").read_text() == "mine 1\n"


@pytest.mark.parametrize("force", [[], ["--force"]])
@pytest.mark.parametrize("subdir", ["", "raw"])
def test_from_and_dest_the_same_directory_is_refused_even_with_force(tmp_path, force, subdir):
    raw = tmp_path / "multi30k" / subdir
    raw.mkdir(parents=True, exist_ok=True)
    for split in ("train", "val", "test_2016_flickr"):
        for lang in ("de", "en"):
            (raw / f"{split}.{lang}").write_text(f"{split} {lang} text\n")
    before = snapshot(raw)
    result = recipe("prepare-multi30k.sh", "--from", raw, "--dest", tmp_path / "multi30k", *force)
    assert result.returncode == 2, result.stderr
    assert "would replace the raw text it reads" in result.stderr
    assert snapshot(raw) == before


# --- analysis scripts: outputs, --beam, --timeout --------------------------------------------

@pytest.fixture(scope="module")
def scripts():
    names = ("mask_encoder_layers", "plot_layer_attention", "plot_fusion_attention", "aggregation_exploitation",
             "embedding_analysis", "plot_mixed_attention")
    return {name: load_script(name) for name in names}


def run(scripts, capsys, name, *argv):
    try:
        code = scripts[name].main([str(a) for a in argv])
    except SystemExit as exit_info:  # argparse
        code = exit_info.code
    captured = capsys.readouterr()
    return code, captured.err


def required_arguments(name, checkpoint, data_bin):
    return {
        "mask_encoder_layers": ["--path", checkpoint, "--data", data_bin],
        "plot_layer_attention": ["--path", checkpoint, "--data", data_bin],
        "plot_fusion_attention": ["--path", checkpoint, "--data", data_bin, "--source", "w3 w5"],
        "aggregation_exploitation": ["--path", checkpoint, "--data", data_bin],
        "embedding_analysis": ["spectrum", "--path", checkpoint, "--data", data_bin],
        "plot_mixed_attention": ["--path", checkpoint, "--data", data_bin, "--source", "w3 w5", "--layer", "1"],
    }[name]


ALL_SCRIPTS = ["mask_encoder_layers", "plot_layer_attention", "plot_fusion_attention", "aggregation_exploitation",
               "embedding_analysis", "plot_mixed_attention"]


@pytest.mark.parametrize("name", ALL_SCRIPTS)
@pytest.mark.parametrize("flag", ["--out", "--json"])
def test_existing_outputs_are_refused_before_the_work(scripts, capsys, tmp_path, name, flag):
    """A checkpoint that does not exist shows that the check comes first: nothing is loaded."""
    existing = tmp_path / "mine.png"
    existing.write_bytes(b"my figure")
    other = ["--out", tmp_path / "new.png"] if flag == "--json" else []
    code, err = run(scripts, capsys, name, *required_arguments(name, tmp_path / "missing.pt", tmp_path),
                    flag, existing, *other)
    kind = "JSON" if flag == "--json" else "figure"
    assert code == 2
    assert err.strip() == f"{err.split(':')[0]}: error: {flag} {existing} exists and is no earlier {kind} output; " \
                          "pass --force to replace it, or give another name"
    assert existing.read_bytes() == b"my figure"


@pytest.mark.parametrize("flag,content,replaced", [
    ("--out", b"\x89PNG\r\n\x1a\n...", True), ("--out", b"%PDF-1.4 ...", True), ("--out", b"my notes", False),
    ("--json", b'{"rows": []}', True), ("--json", b"w1 w2 w3", False), ("--json", b"", False),
])
def test_only_an_earlier_output_is_replaced_without_force(tmp_path, flag, content, replaced):
    from fusion_fairseq.tools.analysis import UsageError, check_outputs

    existing = tmp_path / "output"
    existing.write_bytes(content)
    if replaced:
        check_outputs(SimpleNamespace(force=False), [(flag, str(existing))])
    else:
        with pytest.raises(UsageError, match="exists and is no earlier"):
            check_outputs(SimpleNamespace(force=False), [(flag, str(existing))])
    check_outputs(SimpleNamespace(force=True), [(flag, str(existing))])


@pytest.mark.parametrize("name", ["mask_encoder_layers", "plot_layer_attention", "plot_fusion_attention"])
def test_output_directory_and_same_file_are_checked_first(scripts, capsys, tmp_path, name):
    checkpoint = tmp_path / "missing.pt"
    base = required_arguments(name, checkpoint, tmp_path)
    code, err = run(scripts, capsys, name, *base, "--out", tmp_path / "no_dir" / "fig.png")
    assert code == 2 and f"--out {tmp_path / 'no_dir' / 'fig.png'}: the directory {tmp_path / 'no_dir'} does not exist" in err
    code, err = run(scripts, capsys, name, *base, "--out", tmp_path / "fig.png", "--json", tmp_path / "fig.png")
    assert code == 2 and "--json" in err and "is the same file as --out" in err
    checkpoint.write_bytes(b"precious")
    code, err = run(scripts, capsys, name, *base, "--out", checkpoint, "--force")
    assert code == 2 and "is the same file as --path" in err and checkpoint.read_bytes() == b"precious"


def test_mask_encoder_layers_refuses_earlier_kept_outputs(scripts, capsys, tmp_path):
    kept = tmp_path / "kept"
    kept.mkdir()
    (kept / "generate-none.txt").write_text("an earlier run\n")
    code, err = run(scripts, capsys, "mask_encoder_layers", "--path", tmp_path / "missing.pt", "--data", tmp_path,
                    "--keep-outputs", kept)
    assert code == 2 and f"--keep-outputs {kept} already holds 1 generate-*.txt files" in err
    assert (kept / "generate-none.txt").read_text() == "an earlier run\n"


@pytest.mark.parametrize("name,flag", [
    ("mask_encoder_layers", "--beam"), ("mask_encoder_layers", "--timeout"),
    ("plot_fusion_attention", "--beam"), ("plot_mixed_attention", "--beam"),
])
@pytest.mark.parametrize("value", ["0", "-2"])
def test_non_positive_beam_and_timeout_are_refused(scripts, capsys, tmp_path, name, flag, value):
    code, err = run(scripts, capsys, name, *required_arguments(name, tmp_path / "ckpt.pt", tmp_path), flag, value)
    kind = "number" if flag == "--timeout" else "integer"
    assert code == 2 and f"argument {flag}: {flag} must be a positive {kind}, got '{value}'" in err


# --- damaged checkpoint files ----------------------------------------------------------------

def damaged(kind, checkpoint, path):
    data = open(checkpoint, "rb").read()
    content = {
        "truncated": data[: len(data) // 2],
        "empty": b"",
        "random bytes": os.urandom(4096),
        "text": b"this is a text file, not a checkpoint\n",
    }[kind]
    path.write_bytes(content)
    return path


@pytest.mark.parametrize("name", ["mask_encoder_layers", "plot_layer_attention", "plot_fusion_attention",
                                  "aggregation_exploitation"])
@pytest.mark.parametrize("kind", ["truncated", "empty", "random bytes", "text"])
def test_damaged_checkpoints_are_one_line_errors_naming_the_file(scripts, capsys, tiny_mlrf_checkpoint,
                                                                   tiny_data_bin, tmp_path, name, kind):
    path = damaged(kind, tiny_mlrf_checkpoint, tmp_path / "damaged.pt")
    outputs = ["--out", tmp_path / "fig.png"] if name in ("plot_layer_attention", "plot_fusion_attention") else []
    code, err = run(scripts, capsys, name, *required_arguments(name, path, tiny_data_bin), *outputs)
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert f": error: --path {path}: cannot read the checkpoint, the file is damaged or not a fairseq checkpoint (" \
        in lines[0]
    assert not (tmp_path / "fig.png").exists()


def test_a_torch_file_without_a_model_is_named(scripts, capsys, tiny_data_bin, tmp_path):
    import torch

    path = tmp_path / "weights.pt"
    torch.save({"something": 1}, path)
    code, err = run(scripts, capsys, "plot_layer_attention", "--path", path, "--data", tiny_data_bin,
                    "--out", tmp_path / "fig.png")
    assert code == 2 and err.count("\n") == 1 and f"--path {path}: cannot read the checkpoint" in err
