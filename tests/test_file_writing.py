"""One way to write a file and one way to trust a folder (docs/safety.md, "Files and folders"): every writer
of the package, its scripts and its shell scripts goes through ``replace_atomically`` (Python) or
``replace_file`` (shell, scripts/files.sh); a link is replaced, never written through; a folder a tool did
not make is written into only when empty or with --force; a stamp counts only in a folder owned by the user
and closed to others' writes."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO_ROOT
from fusion_lab import common, quickstart
from fusion_lab.common import claim_out_dir, replace_atomically, trust_problem, write_file
from test_script_safety import recipe, snapshot, write_raw_multi30k

FILES_SH = os.path.join(REPO_ROOT, "scripts", "files.sh")
RUNBOOK = os.path.join(REPO_ROOT, "examples", "gpu", "run.sh")

# --- no writer bypasses the primitive -----------------------------------------------------------------------

PYTHON_WRITES = re.compile(r"""\bopen\([^)]*["'][wax]b?\+?["']|\.write_(text|bytes)\(|shutil\.copy(file|2|tree)?\(|"""
                           r"""json\.dump\(|\.savefig\(|torch\.save\(|np\.save""")
SHELL_WRITES = re.compile(r"""(^|[;&|(]\s*|\s)(tee|cp)\s|\btar\b[^#\n]*\s-\w*f\s+(?!-(\s|$))|"""
                          r"""[^2&>=]>>?\s*(?!/dev/)(?![0-9])["$\w/.]""")

#: (file, the line's text after stripping) -> why it may write without the primitive
ALLOWED = {
    ("fusion_lab/analysis.py", 'figure.savefig(file, dpi=dpi, format=os.path.splitext(name)[1][1:].lower() '
                                         'or None)'): "writes into the file replace_atomically opened",
    ("scripts/files.sh", 'if (($#)); then "$@" > "$temporary" || status=$?; else cat > "$temporary" || status=$?; fi'):
        "the primitive itself, into the file mktemp made",
    ("scripts/files.sh", "{ tee /dev/fd/3 | replace_file \"$1\"; } 3>&1"): "a copy to standard output",
    ("examples/comparison/launch.sh", '>> "$EXP/logs/train.log" 2>&1 < /dev/null &'):
        "the runner's log, appended across sessions after `appendable` (no link, no other hard link)",
    ("examples/comparison/launch.sh", "printf '\\n==== train-one %s threads %s\\n' \"$(date -u +%FT%T+00:00)\" "
                                      "\"$THREADS\" >> run.log"): "the run's log, appended after `appendable`",
    ("examples/comparison/launch.sh", 'flock -n .lock "$PY" -P -m "$RUNNER" _train "$EXP/$RUN" '
                                      '"$BUDGET" >> run.log 2>&1 < /dev/null &'): "the run's log, appended after `appendable`",
    ("scripts/wheelhouse.sh", '--python "$TARGET_PYTHON" --exclude "$EXCLUDE" > "$WORK/needs.txt"'):
        "a scratch file in the folder mktemp -d made",
    ("examples/comparison/multi30k.sh", 'curl -fsSL --retry 3 "$BASE/data/task1/raw/$file.gz" | gunzip > "$work/$file" \\'):
        "a scratch file in the folder mktemp -d made, moved into place as a whole",
}


def source_files():
    folders = ["fusion_fairseq", "fusion_lab", "scripts", "examples"]
    tracked = subprocess.run(["git", "-C", REPO_ROOT, "ls-files", *folders],
                             capture_output=True, text=True, check=True).stdout.split()
    untracked = subprocess.run(["git", "-C", REPO_ROOT, "ls-files", "--others", "--exclude-standard", *folders],
                               capture_output=True, text=True, check=True).stdout.split()
    return sorted(name for name in set(tracked + untracked) if name.endswith((".py", ".sh"))
                  and os.path.isfile(os.path.join(REPO_ROOT, name)))


def writes_outside_the_primitive(name, text):
    pattern = PYTHON_WRITES if name.endswith(".py") else SHELL_WRITES
    found = []
    for line in text.splitlines():
        code = line.split("#", 1)[0] if name.endswith(".py") else re.sub(r"(^|\s)#.*$", "", line)
        if pattern.search(code) and "replace_atomically(" not in code and (name, line.strip()) not in ALLOWED:
            found.append(line.strip())
    return found


def test_every_writer_goes_through_the_primitive():
    """A new writer that opens, copies, dumps, tees, tars or redirects into a file by itself fails here: write it
    with replace_atomically / write_file / copy_file (Python) or replace_file / tee_file (shell), or add it to
    ALLOWED with the reason it may not."""
    bypassing = {name: lines for name in source_files()
                 if (lines := writes_outside_the_primitive(name, Path(REPO_ROOT, name).read_text(encoding="utf-8")))}
    assert bypassing == {}
    unused = [key for key in ALLOWED if key[0] in source_files() and key[1] not in
              [line.strip() for line in Path(REPO_ROOT, key[0]).read_text(encoding="utf-8").splitlines()]]
    assert unused == []  # an entry whose line is gone: remove it


@pytest.mark.parametrize("name,line", [
    ("fusion_lab/x.py", 'with open(path, "w") as f:'), ("fusion_lab/x.py", "p.write_text(text)"),
    ("scripts/x.py", "shutil.copyfile(a, b)"), ("scripts/x.py", "json.dump(data, f)"),
    ("examples/x.sh", 'cmd | tee "$OUT/log"'), ("examples/x.sh", 'cp -- "$a" "$OUT/"'),
    ("examples/x.sh", 'tar -czf "$OUT/a.tgz" -C "$W" .'), ("examples/x.sh", 'echo $! > "$PIDFILE"'),
    ("examples/x.sh", 'bash x.sh >> "$EXP/list"'),
])
def test_the_scan_finds_each_kind_of_write(name, line):
    assert writes_outside_the_primitive(name, line) == [line]


@pytest.mark.parametrize("line", ['echo "x" >&2', "cmd >/dev/null 2>&1", 'tee_file "$OUT/log"', "# cp a b",
                                  'replace_file "$OUT/a" cat -- "$b"'])
def test_the_scan_leaves_what_writes_no_file(line):
    assert writes_outside_the_primitive("examples/x.sh", line) == []


# --- the primitive ------------------------------------------------------------------------------------------

def test_a_link_is_replaced_and_a_hard_link_keeps_its_content(tmp_path):
    theirs = tmp_path / "theirs.txt"
    theirs.write_text("theirs\n")
    (tmp_path / "linked").symlink_to(theirs)
    os.link(theirs, tmp_path / "hard")
    for name in ("linked", "hard"):
        write_file(str(tmp_path / name), "ours\n")
        assert (tmp_path / name).read_text() == "ours\n" and not (tmp_path / name).is_symlink()
    assert theirs.read_text() == "theirs\n"


def test_a_failed_write_leaves_the_target_and_no_temporary_file(tmp_path):
    target = tmp_path / "results.json"
    target.write_text("before\n")

    def fail(file):
        file.write(b"half")
        raise ValueError("stopped")

    with pytest.raises(ValueError):
        replace_atomically(str(target), fail)
    assert target.read_text() == "before\n" and os.listdir(tmp_path) == ["results.json"]
    with pytest.raises(ValueError):
        replace_atomically(str(target), fail, keep_partial=True)  # a log: what was written replaces it
    assert target.read_bytes() == b"half" and os.listdir(tmp_path) == ["results.json"]


def test_a_write_whose_rename_fails_leaves_no_temporary_file(tmp_path):
    (tmp_path / "results.json").mkdir()  # os.replace cannot put a file over a folder
    for keep_partial in (False, True):
        with pytest.raises(IsADirectoryError):
            replace_atomically(str(tmp_path / "results.json"), lambda file: file.write(b"new"), keep_partial)
        assert os.listdir(tmp_path) == ["results.json"] and os.listdir(tmp_path / "results.json") == []


def test_the_tools_fairseq_commands_import_nothing_from_the_working_directory(tmp_path, monkeypatch):
    """A fairseq_cli package planted in the folder a tool runs in is not the one its fairseq commands run."""
    from fusion_lab import corpus

    marker = tmp_path / "planted_ran"
    (tmp_path / "fairseq_cli").mkdir()
    (tmp_path / "fairseq_cli" / "__init__.py").write_text("")
    (tmp_path / "fairseq_cli" / "generate.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
    monkeypatch.chdir(tmp_path)
    corpus.run_fairseq("generate", ["--help"])
    assert not marker.exists()


def test_a_claimed_folder_is_closed_to_others_before_its_links_are_removed(tmp_path, monkeypatch):
    from fusion_lab import common

    out = tmp_path / "out"
    out.mkdir()
    out.chmod(0o777)  # group- and world-writable: anyone could put a link back after the removal
    modes = []
    real = common.remove_links
    monkeypatch.setattr(common, "remove_links", lambda folder, names: (modes.append(out.stat().st_mode & 0o777),
                                                                        real(folder, names)))
    claim_out_dir(str(out), ["results.json"], "made by test", False, "test", RuntimeError)
    assert modes == [0o755]


# --- trusting a folder --------------------------------------------------------------------------------------

STAMP = "fusion-fairseq test"


def claim(out, force=False):
    claim_out_dir(str(out), ["results.md"], STAMP, force, "the test", SystemExit)


def test_a_folder_the_tool_did_not_make_is_written_into_only_when_empty_or_forced(tmp_path):
    empty, theirs = tmp_path / "empty", tmp_path / "theirs"
    empty.mkdir()
    claim(empty)
    assert (empty / ".written_by").read_text() == STAMP + "\n"
    theirs.mkdir()
    (theirs / "notes.txt").write_text("mine\n")
    with pytest.raises(SystemExit, match=r"^--out '.*theirs' holds files that the test did not write: notes.txt; "
                                         r"pass --force to replace them, or give another --out$"):
        claim(theirs)
    assert os.listdir(theirs) == ["notes.txt"]
    claim(theirs, force=True)
    claim(theirs)  # its own now
    assert (theirs / "notes.txt").read_text() == "mine\n"


@pytest.mark.parametrize("how", ["group-writable folder", "others-writable stamp", "stamp of another user"])
def test_a_stamp_counts_only_where_no_one_else_could_have_written_it(tmp_path, how):
    out = tmp_path / "out"
    claim(out)
    (out / "results.md").write_text("ours\n")
    claim(out)
    if how == "group-writable folder":
        out.chmod(0o775)
    elif how == "others-writable stamp":
        (out / ".written_by").chmod(0o646)
    else:
        if os.geteuid() != 0:
            pytest.skip("giving a file to another user needs root")
        os.chown(out / ".written_by", 65534, 65534)
    assert trust_problem(str(out if how == "group-writable folder" else out / ".written_by")) is not None
    with pytest.raises(SystemExit, match="holds files that the test did not write: results.md .written_by"):
        claim(out)
    claim(out, force=True)
    assert trust_problem(str(out)) is None and trust_problem(str(out / ".written_by")) is None


# --- the writers named in docs/safety.md --------------------------------------------------------------------

def test_corpus_prepare_force_replaces_a_data_bin_link_instead_of_writing_into_another_corpus(tmp_path):
    raw, other = tmp_path / "raw", tmp_path / "other-corpus" / "data-bin"
    write_raw_multi30k(raw)
    other.mkdir(parents=True)
    (other / "dict.de.txt").write_text("another corpus's dictionary 1\n")
    dest = tmp_path / "dest"
    dest.mkdir()
    (dest / "data-bin").symlink_to(other)
    result = recipe("multi30k", "--from", raw, "--dest", dest, "--bpe-merges", "5", "--workers", "1")
    assert result.returncode == 2 and f"{dest}/data-bin (a link)" in result.stderr
    result = recipe("multi30k", "--from", raw, "--dest", dest, "--bpe-merges", "5", "--workers", "1", "--force")
    assert result.returncode == 0, result.stderr
    assert os.listdir(other) == ["dict.de.txt"] and (other / "dict.de.txt").read_text() == \
        "another corpus's dictionary 1\n"
    assert not (dest / "data-bin").is_symlink() and (dest / "data-bin" / "recipe.env").is_file()


def test_fairseq_writes_none_of_its_names_through_a_link_and_every_other_file_stays(tmp_path):
    """Before fairseq-train writes its checkpoints and the probe file ``dummy`` into a folder by name, the links
    and hard-linked files among those names go (what they lead to stays); a user's other files there stay,
    their links and hard links too."""
    theirs, folder = tmp_path / "theirs", tmp_path / "checkpoints"
    theirs.mkdir()
    folder.mkdir()
    for name in "abcd":
        (theirs / name).write_text(f"their {name}\n")
    before = snapshot(theirs)
    (folder / "dummy").symlink_to(theirs / "a")
    (folder / "checkpoint_best.pt").symlink_to(theirs / "b")
    os.link(theirs / "c", folder / "checkpoint_1_250.pt")
    (folder / "notes.txt").symlink_to(theirs / "d")
    os.link(theirs / "d", folder / "mine.pt")
    common.folder_without_links(str(folder), common.FAIRSEQ_TRAIN_WRITES)
    assert sorted(os.listdir(folder)) == ["mine.pt", "notes.txt"] and snapshot(theirs) == before


def test_corpus_prepare_with_workers_writes_no_workers_file_through_a_link(tmp_path):
    """fairseq-preprocess's second worker writes SPLIT.SRC-TGT.LANG.pt1.bin and .idx by name, then merges them."""
    raw, dest, theirs = tmp_path / "raw", tmp_path / "dest", tmp_path / "theirs.txt"
    write_raw_multi30k(raw)
    theirs.write_text("theirs\n")
    prepare = ("multi30k", "--from", raw, "--dest", dest, "--bpe-merges", "5", "--workers", "2")
    assert recipe(*prepare).returncode == 0
    for ext in ("bin", "idx"):
        (dest / "data-bin" / f"train.de-en.de.pt1.{ext}").symlink_to(theirs)
    result = recipe(*prepare, "--force")
    assert result.returncode == 0, result.stderr
    assert theirs.read_text() == "theirs\n"


def test_the_comparisons_training_writes_through_no_link_and_imports_only_the_plugin_beside_it(tmp_path, monkeypatch):
    """A run folder's checkpoints are written by fairseq-train by name; its config.json's --user-dir (another
    checkout's, or a folder of code the file was edited to name) is not imported: the runner's own plugin is."""
    from fusion_lab import comparison

    run, theirs = tmp_path / "run", tmp_path / "theirs.txt"
    (run / "checkpoints").mkdir(parents=True)
    theirs.write_text("theirs\n")
    (run / "checkpoints" / "dummy").symlink_to(theirs)
    (run / "config.json").write_text(json.dumps({"train_argv": ["data-bin", "--user-dir", str(tmp_path / "code"),
                                                                "--save-interval-updates", "2"],
                                                 "threads": 1, "device": "cpu"}))
    started = []
    monkeypatch.setattr(comparison.subprocess, "call", lambda argv, **kwargs: started.append(
        (argv, os.path.lexists(run / "checkpoints" / "dummy"))) or 0)
    with pytest.raises(comparison.ComparisonError, match="fairseq-train stopped before update 2"):
        comparison.train_run(str(run), 2)
    (argv, link_left), = started
    assert not link_left and theirs.read_text() == "theirs\n"
    assert argv[argv.index("--user-dir") + 1] == common.PLUGIN_DIR and str(tmp_path / "code") not in argv


def test_the_comparisons_scoring_writes_through_no_link(tmp_path, monkeypatch):
    import fairseq.options
    import fairseq_cli.generate
    from fusion_lab import comparison

    run, theirs = tmp_path / "run", tmp_path / "theirs.txt"
    results = run / "eval-beam5" / "average" / "test_2016_flickr"
    results.mkdir(parents=True)
    theirs.write_text("theirs\n")
    (results / "generate-test.txt").symlink_to(theirs)
    (run / "config.json").write_text(json.dumps({"recipe": {"SRC": "de", "TGT": "en"}, "beam": 5, "device": "cpu",
                                                 "train_argv": ["--save-interval-updates", "2"]}))
    monkeypatch.setattr(comparison, "final_average", lambda *args: "average.pt")
    monkeypatch.setattr(fairseq.options, "parse_args_and_arch", lambda parser, argv: argv)
    linked = []

    class Generated(Exception):
        """Raised where fairseq-generate would write: the test has seen what it would find."""

    def generate(argv):
        linked.append(os.path.lexists(results / "generate-test.txt"))
        raise Generated

    monkeypatch.setattr(fairseq_cli.generate, "main", generate)
    with pytest.raises(Generated):
        comparison.evaluate_run(str(run), 4, {"test_2016_flickr": {"data": "data-bin"}})
    assert linked == [False] and theirs.read_text() == "theirs\n"


def test_a_run_is_scored_only_with_the_generation_flags_it_was_trained_for(tmp_path):
    """The runner scores a run with its config.json's --beam and --gen-args: other ones on the command line are
    refused, not ignored."""
    from fusion_lab import comparison

    (tmp_path / "config.json").write_text(json.dumps({"beam": 5, "gen_args": "--max-len-b 12"}))
    comparison.check_generation(str(tmp_path), 5, "--max-len-b 12")
    with pytest.raises(comparison.ComparisonError) as refused:
        comparison.check_generation(str(tmp_path), 4, "--lenpen 0.6")
    assert str(refused.value) == (f"compare_methods: error: --beam 4 --gen-args '--lenpen 0.6': {tmp_path} was "
                                  "trained to be scored with --beam 5 --gen-args '--max-len-b 12'; give those, or use "
                                  "another --out")


def test_corpus_prepare_refuses_a_dest_holding_other_files_without_force(tmp_path):
    raw, dest = tmp_path / "raw", tmp_path / "dest"
    write_raw_multi30k(raw)
    dest.mkdir()
    (dest / "thesis.tex").write_text("mine\n")
    result = recipe("multi30k", "--from", raw, "--dest", dest, "--bpe-merges", "5", "--workers", "1")
    assert result.returncode == 2 and result.stderr.splitlines()[0] == \
        f"corpus: error: --dest '{dest}' holds files that corpus prepare did not write: thesis.tex; pass --force to " \
        "replace them, or give another --dest"
    assert os.listdir(dest) == ["thesis.tex"]


def quickstart_main(*argv):
    try:
        quickstart.main([str(a) for a in argv])
    except SystemExit as error:
        return error.code
    return 0


def test_quickstart_refuses_an_out_it_did_not_make_before_any_work(tmp_path):
    out = tmp_path / "out"
    (out / "checkpoints" / "transformer").mkdir(parents=True)
    (out / "checkpoints" / "transformer" / "checkpoint_best.pt").write_bytes(b"a user's model")
    code = quickstart_main("--out", out, "--models", "transformer")
    assert code == f"fusion-fairseq-quickstart: error: --out '{out}' holds files that quickstart did not write: " \
        "checkpoints; pass --force to replace them, or give another --out"
    assert (out / "checkpoints" / "transformer" / "checkpoint_best.pt").read_bytes() == b"a user's model"
    assert sorted(os.listdir(out)) == ["checkpoints"]


@pytest.mark.slow
def test_quickstart_force_replaces_linked_outputs_and_writes_through_none(tmp_path):
    """The five files quickstart wrote through links (results.json, its logs, fairseq-generate's output) and
    the checkpoints fairseq-train writes by name: with --force each link is replaced, its target kept; a link
    under another name, the user's, stays."""
    out, theirs = tmp_path / "out", tmp_path / "theirs"
    theirs.mkdir()
    for name in ("results.json", "train.log", "generate.log", "generate-test.txt", "checkpoint_best.pt.tmp",
                 "preprocess.log"):
        (theirs / name).write_text(f"their {name}\n")
    (out / "logs" / "generate-transformer").mkdir(parents=True)
    (out / "checkpoints" / "transformer").mkdir(parents=True)
    links = {"results.json": "results.json", "logs/train-transformer.log": "train.log",
             "logs/generate-transformer.log": "generate.log", "logs/preprocess.log": "preprocess.log",
             "logs/generate-transformer/generate-test.txt": "generate-test.txt",
             "checkpoints/transformer/checkpoint_best.pt.tmp": "checkpoint_best.pt.tmp"}
    for name, target in links.items():
        (out / name).symlink_to(theirs / target)
    users_links = ["checkpoints/transformer/mine.pt", "logs/notes.txt"]
    for name in users_links:
        (out / name).symlink_to(theirs / "train.log")
    before = snapshot(theirs)
    code = quickstart_main("--out", out, "--models", "transformer", "--force", "--train-size", 60, "--valid-size", 10,
                           "--test-size", 6, "--max-update", 4, "--layers", 1, "--embed-dim", 16, "--ffn-dim", 32,
                           "--heads", 2, "--bpe-merges", 50, "--threads", 1, "--cpu")
    assert code == 0
    assert snapshot(theirs) == before
    assert not any((out / name).is_symlink() for name in links)
    assert all((out / name).is_symlink() for name in users_links)
    assert (out / "logs" / "generate-transformer" / "generate-test.txt").read_text().count("\nH-") == 6


# --- shell: replace_file, claim_folder and examples/gpu/run.sh ----------------------------------------------

def shell(script, cwd, **env):
    return subprocess.run(["bash", "-c", f'set -euo pipefail; source "{FILES_SH}"; {script}'], cwd=cwd,
                          capture_output=True, text=True, env={**os.environ, **env})


def test_replace_file_replaces_a_link_and_a_failed_command_leaves_the_target(tmp_path):
    (tmp_path / "theirs").write_text("theirs\n")
    (tmp_path / "out.log").symlink_to(tmp_path / "theirs")
    assert shell('replace_file out.log echo ours', tmp_path).returncode == 0
    assert (tmp_path / "out.log").read_text() == "ours\n" and (tmp_path / "theirs").read_text() == "theirs\n"
    failed = shell('replace_file out.log bash -c "echo half; exit 3"', tmp_path)
    assert failed.returncode == 3 and (tmp_path / "out.log").read_text() == "ours\n"
    assert sorted(os.listdir(tmp_path)) == ["out.log", "theirs"]
    assert shell('printf "a\\nb\\n" | tee_file copy.log', tmp_path).stdout == "a\nb\n"
    assert (tmp_path / "copy.log").read_text() == "a\nb\n" and oct((tmp_path / "copy.log").stat().st_mode)[-3:] == "644"


def test_claim_folder_is_claim_out_dir_in_shell(tmp_path):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "notes.txt").write_text("mine\n")
    refused = shell('claim_folder out "a stamp" a.log', tmp_path)
    assert refused.returncode == 1 and refused.stdout.strip() == "notes.txt"
    assert os.listdir(tmp_path / "out") == ["notes.txt"]
    assert shell('claim_folder out "a stamp" a.log', tmp_path, FORCE="1").returncode == 0
    assert shell('claim_folder out "a stamp" a.log', tmp_path).returncode == 0  # its own now
    (tmp_path / "out").chmod(0o777)
    assert shell('claim_folder out "a stamp" a.log', tmp_path).returncode == 1  # anyone could have stamped it


def runbook(step, *args, **env):
    return subprocess.run(["bash", RUNBOOK, step, *map(str, args)], cwd=REPO_ROOT, capture_output=True, text=True,
                          env={**os.environ, "PYTHON": sys.executable, "SMOKE": "1", **env}, timeout=300)


def test_run_sh_writes_no_output_through_a_link(tmp_path):
    """OUT's files that are links to someone else's are refused, and with FORCE replaced, never followed."""
    out, theirs = tmp_path / "out", tmp_path / "theirs"
    out.mkdir()
    theirs.mkdir()
    for name in ("speed.json", "speed.md"):
        (theirs / name).write_text(f"their {name}\n")
        (out / name).symlink_to(theirs / name)
    before = snapshot(theirs)
    refused = runbook("speed", out)
    assert refused.returncode == 2 and f"OUT {out} holds files that run.sh did not write: " in refused.stderr
    assert snapshot(theirs) == before
    forced = runbook("speed", out, FORCE="1")
    assert forced.returncode == 0, forced.stderr[-2000:]
    assert snapshot(theirs) == before
    assert not any((out / name).is_symlink() for name in ("speed.json", "speed.md"))
    assert json.loads((out / "speed.json").read_text())["configs"]


# --- examples/dense_nmt/time_to_loss.sh -------------------------------------------------------------------------

TIME_TO_LOSS = os.path.join(REPO_ROOT, "examples", "dense_nmt", "time_to_loss.sh")


def time_to_loss(data_bin, out, tmp_path, **env):
    """The recipe with a ``fairseq-train`` on PATH that prints a line to each stream, notes it ran, and fails."""
    fake = tmp_path / "fake-bin"
    fake.mkdir(exist_ok=True)
    (fake / "fairseq-train").write_text(f'#!/bin/sh\ntouch "{tmp_path}/trained"\necho "training $*"\n'
                                        'echo "it failed" >&2\nexit 3\n')
    (fake / "fairseq-train").chmod(0o755)
    return subprocess.run(["bash", TIME_TO_LOSS, str(data_bin), str(out)], capture_output=True, text=True, timeout=120,
                          cwd=tmp_path, env={**os.environ, "PYTHON": sys.executable, "PYTHONPATH": REPO_ROOT,
                                             "PATH": f"{fake}{os.pathsep}{os.environ['PATH']}", **env})


@pytest.fixture
def binarised(tmp_path):
    """What the recipe checks DATA_BIN for before anything else."""
    data_bin = tmp_path / "data-bin"
    data_bin.mkdir()
    for name in ("train.de-en.de.idx", "dict.de.txt"):
        (data_bin / name).write_text("")
    return data_bin


def test_time_to_loss_refuses_an_out_it_did_not_make_before_training(binarised, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "residual.log").write_text("a user's log\n")
    result = time_to_loss(binarised, out, tmp_path)
    assert result.returncode == 2 and result.stderr.splitlines() == [
        f"error: OUT {out} holds files that time_to_loss.sh did not write: residual.log ; set FORCE=1 to replace "
        "them, or give another OUT"]
    assert (out / "residual.log").read_text() == "a user's log\n" and not (tmp_path / "trained").exists()


def test_time_to_loss_writes_its_logs_through_no_link_and_keeps_a_failed_trainings_log(binarised, tmp_path):
    """fairseq-train's log was redirected into OUT with ``>``, through a link there."""
    out, theirs = tmp_path / "out", tmp_path / "theirs"
    out.mkdir()
    theirs.mkdir()
    for name in ("residual.log", "dense.log"):
        (theirs / name).write_text(f"their {name}\n")
        (out / name).symlink_to(theirs / name)
    before = snapshot(theirs)
    result = time_to_loss(binarised, out, tmp_path, FORCE="1")
    assert result.returncode == 1 and result.stderr.splitlines()[-1] == \
        f"error: the residual model's training failed, see {out}/residual.log"
    assert snapshot(theirs) == before
    for name in ("residual.log", "dense.log"):
        log = out / name
        assert not log.is_symlink() and log.read_text().startswith("training ") and "it failed\n" in log.read_text()
