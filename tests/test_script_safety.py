"""Scripts never replace a user's files, check their outputs before the work, refuse a
non-positive --beam / --timeout, and report a damaged checkpoint file in one line naming it."""

import contextlib
import io
import json
import os
import re
import sys
from argparse import Namespace
from types import SimpleNamespace

import pytest
import torch

from conftest import load_script

RECIPES = {"multi30k": ("de", "en"), "iwslt14": ("de", "en"), "wmt14-en-de": ("en", "de"), "wmt16-en-ro": ("en", "ro")}


def recipe(name, *args):
    """``corpus prepare NAME ARGS`` in this process: exit status and stderr."""
    return run_corpus("prepare", name, *args)


def run_corpus(*args):
    from fusion_lab import corpus

    stderr, code = io.StringIO(), 0
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(stderr):
        try:
            corpus.main([str(a) for a in args])
        except SystemExit as error:
            code = error.code if isinstance(error.code, int) else 1
            print(error.code if isinstance(error.code, str) else "", file=sys.stderr)
    return SimpleNamespace(returncode=code, stderr=stderr.getvalue())


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
    result = recipe("multi30k", "--dest", tmp_path / "dest", "--databin", databin)
    assert result.returncode == 2 and f"{databin} (not empty)" in result.stderr
    assert (databin / "dict.de.txt").read_text() == "mine 1\n"


def write_raw_multi30k(raw):
    """A folder of raw Multi30k files, one line each."""
    raw.mkdir(parents=True, exist_ok=True)
    for split in ("train", "val", "test_2016_flickr"):
        for lang in ("de", "en"):
            (raw / f"{split}.{lang}").write_text(f"{split} {lang} text\n")


@pytest.mark.parametrize("force", [[], ["--force"]])
@pytest.mark.parametrize("subdir", ["", "raw"])
def test_from_and_dest_the_same_directory_is_refused_even_with_force(tmp_path, force, subdir):
    raw = tmp_path / "multi30k" / subdir
    write_raw_multi30k(raw)
    before = snapshot(raw)
    result = recipe("multi30k", "--from", raw, "--dest", tmp_path / "multi30k", *force)
    assert result.returncode == 2, result.stderr
    assert "would replace the raw text it reads" in result.stderr
    assert snapshot(raw) == before


@pytest.mark.parametrize("force", [[], ["--force"]])
def test_a_dest_inside_from_is_refused(tmp_path, force):
    """The recipe searches --from for its raw files: a rerun found its own copies (cp: same file)."""
    raw = tmp_path / "multi30k"
    write_raw_multi30k(raw)
    before = snapshot(raw)
    result = recipe("multi30k", "--from", raw, "--dest", raw / "out", *force)
    assert result.returncode == 2, result.stderr
    assert result.stderr.splitlines()[0] == f"corpus: error: --dest '{raw / 'out'}' is inside --from " \
        f"'{raw}': the recipe searches --from for its raw files and would find the ones it writes; give a --dest " \
        "outside it"
    assert snapshot(raw) == before and not (raw / "out").exists()


def test_force_never_writes_through_a_link_in_dest(tmp_path):
    """--force replaces the recipe's outputs: a hard link to the raw input, a symbolic link to the
    user's codes or directory, a dangling link: each is removed, its target left as it was."""
    raw = tmp_path / "raw"
    write_raw_multi30k(raw)
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "codes").write_text("my BPE codes\n")
    (mine / "train.de").write_text("my own train.de\n")
    dest = tmp_path / "dest"
    (dest / "tok").mkdir(parents=True)
    os.link(raw / "train.de", dest / "train.de")  # BPE output, hard-linked to the input
    os.link(raw / "val.en", dest / "tok" / "valid.en")
    (dest / "code").symlink_to(mine / "codes")
    (dest / "raw").symlink_to(mine)  # a linked directory: its files are the user's
    (dest / "test.en").symlink_to(tmp_path / "nothing-here")  # dangling: would create the target
    (dest / "data-bin").mkdir()
    (dest / "data-bin" / "recipe.env").symlink_to(mine / "codes")
    inputs, users = snapshot(raw), snapshot(mine)
    result = recipe("multi30k", "--from", raw, "--dest", dest, "--bpe-merges", "5", "--workers", "1", "--force")
    assert result.returncode == 0, result.stderr
    assert snapshot(raw) == inputs and snapshot(mine) == users and sorted(os.listdir(mine)) == ["codes", "train.de"]
    assert not (tmp_path / "nothing-here").exists()
    assert not any(os.path.islink(dest / name) for name in ("code", "raw", "test.en", "data-bin/recipe.env"))
    assert (dest / "raw" / "train.de").read_text() == "train de text\n"


def test_a_dangling_link_in_dest_is_refused_without_force(tmp_path):
    dest = tmp_path / "dest"
    dest.mkdir()
    (dest / "code").symlink_to(tmp_path / "nothing-here")
    result = recipe("multi30k", "--dest", dest)
    assert result.returncode == 2 and f"already holds what this recipe writes: {dest}/code" in result.stderr


def test_evaluate_never_writes_through_a_link_in_out(tmp_path):
    out = tmp_path / "eval"
    out.mkdir()
    (tmp_path / "mine.log").write_text("my log\n")
    (out / "generate-test.log").symlink_to(tmp_path / "mine.log")
    result = evaluate(tmp_path, out, "--force")
    assert result.returncode == 1 and "fairseq-generate failed" in result.stderr
    assert (tmp_path / "mine.log").read_text() == "my log\n" and not os.path.islink(out / "generate-test.log")


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


def users_figure(path):
    """A figure the user made with matplotlib (no mark of any script)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(1, 1))
    ax.plot([0, 1])
    fig.savefig(path)
    plt.close(fig)
    return path


@pytest.mark.parametrize("name", ALL_SCRIPTS)
@pytest.mark.parametrize("flag", ["--out", "--json"])
def test_a_users_file_is_refused_before_the_work(scripts, capsys, tmp_path, name, flag):
    """A user's own figure or JSON (valid files of the kind the flag writes) is kept byte for
    byte; a checkpoint that does not exist shows that the check comes first: nothing is loaded."""
    existing = users_figure(tmp_path / "fig.png") if flag == "--out" else tmp_path / "config.json"
    if flag == "--json":
        existing.write_text('{"lr": 0.0005, "rows": []}\n')
    before = existing.read_bytes()
    other = ["--out", tmp_path / "new.png"] if flag == "--json" else []
    code, err = run(scripts, capsys, name, *required_arguments(name, tmp_path / "missing.pt", tmp_path),
                    flag, existing, *other)
    assert code == 2
    assert err.strip() == f"{err.split(':')[0]}: error: {flag} {existing} exists; pass --force to overwrite it, " \
                          "or give another name"
    assert existing.read_bytes() == before


def marked_outputs(tmp_path):
    """Files that carry the marks by which scripts once recognised their own earlier output (and
    replaced it without --force): a figure's metadata, a JSON "written_by" key, a Markdown comment."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure = tmp_path / "ours.png"
    fig, ax = plt.subplots(figsize=(1, 1))
    ax.plot([0, 1])
    fig.savefig(figure, dpi=50, metadata={"Software": "fusion-fairseq plot_layer_attention.py"})
    plt.close(fig)
    (tmp_path / "ours.json").write_text('{"written_by": "fusion-fairseq plot_layer_attention.py", "rows": [1]}')
    (tmp_path / "ours.md").write_text("<!-- written_by: fusion-fairseq plot_layer_attention.py -->\n# Table\n")
    return [figure, tmp_path / "ours.json", tmp_path / "ours.md"]


def test_an_existing_output_is_overwritten_only_with_force(tmp_path):
    """Whoever wrote it: a file carrying this script's own mark is refused without --force too."""
    from fusion_lab.analysis import UsageError, check_outputs

    for path in [*marked_outputs(tmp_path), users_figure(tmp_path / "users.png")]:
        before = path.read_bytes()
        message = f"--out {path} exists; pass --force to overwrite it, or give another name"
        with pytest.raises(UsageError, match=f"^{re.escape(message)}$"):
            check_outputs(SimpleNamespace(force=False), [("--out", str(path))])
        assert path.read_bytes() == before
        check_outputs(SimpleNamespace(force=True), [("--out", str(path))])


def test_a_rerun_into_the_same_outputs_needs_force(scripts, capsys, tiny_mlrf_checkpoint, tiny_data_bin, tmp_path):
    figure, weights = tmp_path / "fig.png", tmp_path / "weights.json"
    argv = [*required_arguments("plot_fusion_attention", tiny_mlrf_checkpoint, tiny_data_bin),
            "--out", figure, "--json", weights]
    code, err = run(scripts, capsys, "plot_fusion_attention", *argv)
    assert code == 0, err
    for path in (figure, weights):
        os.utime(path, ns=(0, 0))
    code, err = run(scripts, capsys, "plot_fusion_attention", *argv)
    assert code == 2 and f"--out {figure} exists; pass --force to overwrite it" in err
    assert os.stat(figure).st_mtime_ns == os.stat(weights).st_mtime_ns == 0
    code, err = run(scripts, capsys, "plot_fusion_attention", *argv, "--force")
    assert code == 0, err
    assert os.stat(figure).st_mtime_ns > 0 and os.stat(weights).st_mtime_ns > 0


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


def test_an_output_hard_linked_to_the_checkpoint_is_refused_even_with_force(scripts, capsys, tmp_path):
    """Two names of one file: comparing paths would let --force overwrite the checkpoint."""
    checkpoint = tmp_path / "ck.pt"
    checkpoint.write_bytes(b"precious")
    os.link(checkpoint, tmp_path / "hard.json")
    code, err = run(scripts, capsys, "plot_fusion_attention", *required_arguments("plot_fusion_attention", checkpoint,
                    tmp_path), "--out", tmp_path / "fig.png", "--json", tmp_path / "hard.json", "--force")
    assert code == 2 and f"--json {tmp_path / 'hard.json'} is the same file as --path {checkpoint}" in err
    assert checkpoint.read_bytes() == b"precious"


@pytest.mark.parametrize("folder", ["kept", "kept[1]"])  # a glob pattern's characters in the name
def test_mask_encoder_layers_refuses_earlier_kept_outputs(scripts, capsys, tmp_path, folder):
    kept = tmp_path / folder
    kept.mkdir()
    (kept / "generate-none.txt").write_text("an earlier run\n")
    code, err = run(scripts, capsys, "mask_encoder_layers", "--path", tmp_path / "missing.pt", "--data", tmp_path,
                    "--keep-outputs", kept)
    assert code == 2 and f"--keep-outputs {kept / 'generate-none.txt'} exists; pass --force to overwrite it" in err
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


@pytest.mark.parametrize("name", ALL_SCRIPTS)
@pytest.mark.parametrize("value", ["0", "-5", "100000"])
def test_a_dpi_out_of_range_is_refused(scripts, capsys, tmp_path, name, value):
    """100000 dots per inch made a figure that exhausted memory."""
    code, err = run(scripts, capsys, name, *required_arguments(name, tmp_path / "ckpt.pt", tmp_path), "--dpi", value)
    assert code == 2 and f"argument --dpi: --dpi must be an integer from 1 to 1200, got '{value}'" in err


@pytest.mark.parametrize("name", ["mask_encoder_layers", "plot_mixed_attention"])
@pytest.mark.parametrize("value", ["nan", "inf"])
def test_a_length_penalty_that_is_no_finite_number_is_refused(scripts, capsys, tmp_path, name, value):
    """mask_encoder_layers.py wrote --lenpen nan into its JSON, which then did not parse."""
    code, err = run(scripts, capsys, name, *required_arguments(name, tmp_path / "ckpt.pt", tmp_path), "--lenpen", value)
    assert code == 2 and f"argument --lenpen: --lenpen must be a finite number, got '{value}'" in err


# --- measurements: the benchmark and its --time-to-loss ------------------------------------------------------

class Measured(Exception):
    """Raised in place of the measurement: the output checks let it start."""


def measurement_refused(main, measure, monkeypatch, capsys, argv):
    """Exit status and stderr of ``main(argv)`` with ``measure`` replaced by :class:`Measured`
    (None, None when the checks let the measurement start)."""
    def measure_nothing(*args, **kwargs):
        raise Measured

    monkeypatch.setattr(*measure, measure_nothing)
    try:
        code = main([str(a) for a in argv])
    except SystemExit as exit_info:
        code = exit_info.code
    except Measured:
        return None, None
    return code, capsys.readouterr().err


def measurements(tmp_path):
    """``{script: (main, (module, the function doing the work), arguments it needs)}``."""
    from fusion_lab import benchmark

    return {"fusion-fairseq-benchmark": (benchmark.main, (benchmark, "run_benchmark"), []),
            "time_to_loss": (benchmark.main, (benchmark, "time_to_loss"),
                             ["--time-to-loss", tmp_path / "residual.log", tmp_path / "dense.log"])}


@pytest.mark.parametrize("script,flag", [
    ("fusion-fairseq-benchmark", "--json"), ("fusion-fairseq-benchmark", "--markdown"), ("time_to_loss", "--json"),
])
def test_measurements_check_their_outputs_first(monkeypatch, capsys, tmp_path, script, flag):
    from fusion_lab.analysis import write_json, write_markdown

    main, function, needed = measurements(tmp_path)[script]

    def measure(*argv):
        return measurement_refused(main, function, monkeypatch, capsys, [*needed, *argv])

    missing = tmp_path / "nonexistent" / "x.out"
    code, err = measure(flag, missing)
    assert code == 2 and err.strip().splitlines()[-1].endswith(
        f": error: {flag} {missing}: the directory {missing.parent} does not exist")
    users = tmp_path / "mine.out"
    users.write_text('{"my": "settings"}\n')
    code, err = measure(flag, users)
    assert code == 2 and err.strip().splitlines()[-1].endswith(
        f": error: {flag} {users} exists; pass --force to overwrite it, or give another name")
    assert users.read_text() == '{"my": "settings"}\n'
    assert measure(flag, users, "--force") == (None, None)
    ours = tmp_path / "ours.out"
    (write_json if flag == "--json" else write_markdown)(str(ours), {} if flag == "--json" else "")
    assert measure(flag, ours)[0] == 2
    assert measure(flag, ours, "--force") == (None, None)


# --- corpus evaluate --------------------------------------------------------------------------

def evaluate(tmp_path, out, *args):
    """``corpus evaluate`` on a stand-in data directory (no dictionaries) and a checkpoint without weights that
    its own checks read: the run stops at fairseq-generate (exit status 1) once those checks have passed."""
    data = tmp_path / "data-bin"
    data.mkdir(exist_ok=True)
    (data / "test.de-en.de.idx").write_bytes(b"")
    torch.save({"cfg": {"model": Namespace(arch="transformer", _name="transformer")}, "model": {}},
               tmp_path / "checkpoint.pt")
    (tmp_path / "ref.en").write_text("a reference\n")
    return run_corpus("evaluate", data, tmp_path / "checkpoint.pt", "--src", "de", "--tgt", "en", "--ref",
                      tmp_path / "ref.en", "--no-user-dir", "--out", out, *args)


def test_evaluate_refuses_an_out_dir_holding_files_it_did_not_write(tmp_path):
    out = tmp_path / "eval"
    out.mkdir()
    (out / "hyp.tok").write_text("my hypotheses\n")
    (out / "scores.json").write_text('{"bleu": 30.1}\n')
    (out / "notes.txt").write_text("mine, not an output of corpus evaluate\n")
    before = snapshot(out)
    result = evaluate(tmp_path, out)
    assert result.returncode == 2
    assert result.stderr.splitlines()[0] == f"corpus: error: --out '{out}' holds files that corpus evaluate did not " \
        "write: hyp.tok scores.json; pass --force to replace them, or give another --out"
    assert snapshot(out) == before and not (out / ".written_by").exists()
    result = evaluate(tmp_path, out, "--force")
    assert result.returncode == 1 and "fairseq-generate failed" in result.stderr
    assert (out / "notes.txt").read_text() == "mine, not an output of corpus evaluate\n"


@pytest.mark.parametrize("key", ["LOWERCASE", "COMPOUND_SPLIT"])
def test_evaluate_reads_recipe_env_as_data(tmp_path, key):
    """bash arithmetic on a value evaluates the command substitutions in it: only 0 or 1 is read."""
    marker = tmp_path / "PWNED"
    (tmp_path / "data-bin").mkdir()
    (tmp_path / "data-bin" / "recipe.env").write_text(f"{key}=BEAM[$(touch {marker})]\n")
    result = evaluate(tmp_path, tmp_path / "eval")
    assert result.returncode == 1 and not marker.exists()
    assert result.stderr.strip() == f"corpus: error: {tmp_path / 'data-bin'}/recipe.env: {key} " \
        f"'BEAM[$(touch {marker})]' is not allowed (allowed: 0 or 1)"


def test_evaluate_reads_a_recipe_env_with_crlf_line_endings(tmp_path):
    data = tmp_path / "data-bin"
    data.mkdir()
    (data / "test.de-en.de.idx").write_bytes(b"")
    (data / "recipe.env").write_bytes(b"# written on Windows\r\nSRC=de\r\nTGT=en\r\nLOWERCASE=1\r\nCOMPOUND_SPLIT=0\r\n")
    torch.save({"cfg": {"model": Namespace(arch="transformer", _name="transformer")}, "model": {}},
               tmp_path / "checkpoint.pt")  # read by evaluate's checks, refused by fairseq-generate
    (tmp_path / "ref.en").write_text("a reference\n")
    result = run_corpus("evaluate", data, tmp_path / "checkpoint.pt", "--ref", tmp_path / "ref.en", "--no-user-dir",
                        "--out", tmp_path / "eval")
    assert result.returncode == 1 and "fairseq-generate failed" in result.stderr, result.stderr
    assert "(de -> en)" in result.stderr


def test_evaluate_reruns_into_its_own_out_dir(tmp_path):
    out = tmp_path / "eval"
    for _ in range(2):
        result = evaluate(tmp_path, out)
        assert result.returncode == 1 and "fairseq-generate failed" in result.stderr, result.stderr
    assert (out / ".written_by").read_text() == "fusion-fairseq corpus evaluate\n"
    assert (out / "generate-test.log").exists()
    (tmp_path / "file").write_text("mine\n")
    result = evaluate(tmp_path, tmp_path / "file")
    assert result.returncode == 2 and f"--out '{tmp_path / 'file'}' is not a directory" in result.stderr


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


@pytest.mark.parametrize("name", ALL_SCRIPTS)
@pytest.mark.parametrize("kind,unknown", [("task", "nosuchtask"), ("architecture", "nosucharch")])
def test_an_unknown_task_or_architecture_is_named(scripts, capsys, tiny_mlrf_checkpoint, tiny_data_bin, tmp_path,
                                                  name, kind, unknown):
    """fairseq failed deep in its registries (an AssertionError, or an IndexError building its message)."""
    import torch

    state = torch.load(tiny_mlrf_checkpoint)
    if kind == "task":
        state["cfg"]["task"]["_name"] = unknown
    else:
        state["cfg"]["model"].update(_name=unknown)
    path = tmp_path / "unknown.pt"
    torch.save(state, path)
    arguments = required_arguments(name, path, tiny_data_bin)
    code, err = run(scripts, capsys, name, *arguments, "--out", tmp_path / "fig.png")
    assert code == 2 and err.count("\n") == 1, err
    assert f": error: --path {path}: the checkpoint's {kind} '{unknown}' is not one fairseq " \
        "knows; pass the --user-dir that registers it" in err


def test_a_refusal_names_the_architecture_a_plugin_checkpoint_stores_as_its_name():
    """The plugin's configurations store the architecture as ``_name``; the error read ``arch ?``."""
    from argparse import Namespace

    from fusion_lab.analysis import UsageError, checkpoint_setting

    config = Namespace(_name="mlrf_iwslt_de_en", layer_attention="none")
    with pytest.raises(UsageError, match=r"the checkpoint \(arch mlrf_iwslt_de_en\) has --layer-attention none"):
        checkpoint_setting(config, "layer-attention", ("coarse", "fine"), "--path x.pt", "it has no layer attention")


def test_mask_encoder_layers_reads_a_data_path_with_a_space(scripts):
    """The count of loaded test sentences (the check of the hypothesis count) was lost for such a path."""
    line = "2026-12-07 | INFO | fairseq.data.data_utils | loaded 15 examples from: out dir/data-bin/test.de-en.de\n"
    assert scripts["mask_encoder_layers"].LOADED_LINE.findall(line) == [("15", "out dir/data-bin/test.de-en.de")]
