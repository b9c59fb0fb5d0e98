"""The data pipeline (``fusion_lab.corpus``: prepare, evaluate), offline, and the paper
training recipes (examples/*/train.sh, dry runs).

Multi30k slices come from the team's shared copy (``<repo>/../shared/data/multi30k/raw``; tests that need
it are skipped when it is absent); IWSLT14 is a small generated imitation of the real ``de-en.tgz``
(``de-en/train.tags.de-en.{de,en}`` with the TED talk tags, ``IWSLT14.TED*.de-en.{de,en}.xml`` dev/test
files).
"""

import ast
import contextlib
import gzip
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import zipfile
from types import SimpleNamespace

import numpy as np
import pytest

from conftest import write_multi30k_slice
from fusion_lab import corpus

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARED_RAW = os.path.join(os.path.dirname(REPO_ROOT), "shared", "data", "multi30k", "raw")
UNROUTABLE = "http://10.255.255.1"


def run_corpus(*args, check=True):
    """``python -m fusion_lab.corpus ARGS`` in this process: exit status, stdout, stderr."""
    stdout, stderr, code = io.StringIO(), io.StringIO(), 0
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        try:
            corpus.main([str(a) for a in args])
        except SystemExit as error:
            code = error.code if isinstance(error.code, int) else 1
            if isinstance(error.code, str):
                print(error.code, file=sys.stderr)
    result = SimpleNamespace(returncode=code, stdout=stdout.getvalue(), stderr=stderr.getvalue())
    if check and code != 0:
        raise AssertionError(f"corpus {' '.join(map(str, args))} failed ({code}):\n{result.stderr[-5000:]}")
    return result


def lines(path):
    with open(path, encoding="utf-8") as f:
        return f.read().splitlines()


def write(path, text_lines):
    with open(path, "w", encoding="utf-8") as f:
        f.writelines(line + "\n" for line in text_lines)


def unbpe(line):
    return re.sub(r"(@@ )|(@@ ?$)", "", line)


def assert_binarised(databin, src, tgt):
    for split in ("train", "valid", "test"):
        for lang in (src, tgt):
            for ext in ("bin", "idx"):
                path = os.path.join(databin, f"{split}.{src}-{tgt}.{lang}.{ext}")
                assert os.path.getsize(path) > 0, path
    with open(os.path.join(databin, f"dict.{src}.txt"), "rb") as a, open(os.path.join(databin, f"dict.{tgt}.txt"), "rb") as b:
        assert a.read() == b.read(), "dictionaries are not joined"


# --------------------------------------------------------------------------------------------- Multi30k

def require_shared_raw():
    if not os.path.isfile(os.path.join(SHARED_RAW, "train.de")):
        pytest.skip(f"shared Multi30k data not found at {SHARED_RAW}")


@pytest.fixture(scope="module")
def m30k_slice(tmp_path_factory):
    require_shared_raw()
    directory = tmp_path_factory.mktemp("m30k_slice")
    for split, count in (("train", 500), ("val", 100), ("test_2016_flickr", 100)):
        for lang in ("de", "en"):
            write(directory / f"{split}.{lang}", lines(os.path.join(SHARED_RAW, f"{split}.{lang}"))[:count])
    return directory


@pytest.fixture(scope="module")
def m30k(m30k_slice, tmp_path_factory):
    dest = tmp_path_factory.mktemp("m30k_dest")  # empty: one holding a file of the user's is refused (offline test)
    before = sorted(os.listdir(m30k_slice))
    result = run_corpus("prepare", "multi30k", "--from", m30k_slice, "--dest", dest, "--workers", "1",
                        "--bpe-merges", "1000")
    assert sorted(os.listdir(m30k_slice)) == before, "--from directory was modified"
    return dest, result


@pytest.mark.slow
def test_multi30k_recipe_outputs(m30k, m30k_slice):
    dest, result = m30k
    databin = dest / "data-bin"
    assert f"Binarised data (de -> en) is in: {databin}" in result.stdout
    assert_binarised(databin, "de", "en")
    assert not [p for p in os.listdir(dest) if p.startswith(".work")], "scratch directory left behind"
    for split, count in (("train", 500), ("valid", 100), ("test", 100)):
        for lang in ("de", "en"):
            assert len(lines(dest / f"{split}.{lang}")) == count
    # raw -> punctuation-normalised, tokenised, lowercased (as the official data/task1/tok files)
    raw, tok = lines(m30k_slice / "train.en"), lines(dest / "tok" / "train.en")
    assert raw[0] == "Two young, White males are outside near many bushes."
    assert tok[0] == "two young , white males are outside near many bushes ."
    assert all(line == line.lower() for line in tok)
    assert any("&apos;" in line or "&quot;" in line for line in tok + lines(dest / "tok" / "train.de"))
    # BPE: joint codes, segmentation applied, and undoing it gives the tokenised text back
    assert lines(dest / "code")[0].startswith("#version: 0.2")
    for split in ("train", "valid", "test"):
        for lang in ("de", "en"):
            bpe = lines(dest / f"{split}.{lang}")
            assert [unbpe(x) for x in bpe] == lines(dest / "tok" / f"{split}.{lang}")
    assert any("@@ " in x for x in lines(dest / "train.de"))
    env = dict(line.split("=", 1) for line in lines(databin / "recipe.env") if "=" in line)
    assert env["LOWERCASE"] == "1" and env["SRC"] == "de" and env["TGT"] == "en"
    assert lines(env["RAW_REF_test"]) == lines(m30k_slice / "test_2016_flickr.en")


# ----------------------------------------------------------------------------------------------- IWSLT14

DE = ["Haus", "Baum", "Katze", "Welt", "Sonne", "Stadt", "Straße", "Wasser", "Musik", "Zukunft", "Geschichte",
      "Wissenschaft", "Menschen", "Kinder", "schön", "groß", "klein", "neue", "wichtige", "gesehen"]
EN = ["house", "tree", "cat", "world", "sun", "city", "street", "water", "music", "future", "history",
      "science", "people", "children", "beautiful", "big", "small", "new", "important", "seen"]
TEST_SETS = ["IWSLT14.TED.dev2010", "IWSLT14.TEDX.dev2012", "IWSLT14.TED.tst2010", "IWSLT14.TED.tst2011",
             "IWSLT14.TED.tst2012"]


def sentence_pair(n):
    """A cased, punctuated pair carrying a unique number ``n`` (to trace lines through the pipeline)."""
    k = 3 + n % 6
    de = " ".join(DE[(n * 7 + i * 3) % len(DE)] for i in range(k))
    en = " ".join(EN[(n * 7 + i * 3) % len(EN)] for i in range(k))
    return f"Das {de}, {n}!", f"The {en}, {n}!"


def write_fake_iwslt14(directory, talks=5, lines_per_talk=40):
    """A small ``de-en.tgz`` laid out as the WIT3 2014-01 release that fairseq's recipe downloads:
    ``de-en/train.tags.de-en.{de,en}`` (talk headers: <url>, <keywords>, <talkid>, <title>, <description>,
    then one sentence per line) and the ``IWSLT14.TED*.de-en.{de,en}.xml`` dev/test sets (mteval XML,
    one ``<seg id="N">`` per line).  Returns (archive, the number carried by each training line that
    survives cleaning, in order, the numbers of the test segments in the standard order)."""
    root = directory / "de-en"
    root.mkdir(parents=True)
    train = {"de": [], "en": []}
    kept = []
    n = 0
    for talk in range(1, talks + 1):
        train["de"] += [f"<url>http://www.ted.com/talks/lang/de/speaker_{talk}.html</url>",
                        "<keywords>talks, science, technology</keywords>", f"<talkid>{talk}</talkid>",
                        f"<title>Sprecher {talk}: Der Titel</title>",
                        f"<description>TED Talk Subtitles and Transcript: Beschreibung {talk}.</description>"]
        train["en"] += [f"<url>http://www.ted.com/talks/speaker_{talk}.html</url>",
                        "<keywords>talks, science, technology</keywords>", f"<talkid>{talk}</talkid>",
                        f"<title>Speaker {talk}: The title</title>",
                        f"<description>TED Talk Subtitles and Transcript: Description {talk}.</description>"]
        kept += [talk, talk]  # title and description lines stay (without their tags)
        for _ in range(lines_per_talk):
            n += 1
            de, en = sentence_pair(n)
            if n == 17:  # length ratio 3 : 12 -> removed by cleaning (ratio 1.5)
                de, en = "Ja 17.", "Yes, of course I will do that for you, 17."
            if n == 42:  # 180 tokens -> removed by cleaning (max 175)
                de, en = " ".join(["Wort"] * 179) + " 42", " ".join(["word"] * 179) + " 42"
            train["de"].append(de)
            train["en"].append(en)
            if n not in (17, 42):
                kept.append(n)
    for lang in ("de", "en"):
        write(root / f"train.tags.de-en.{lang}", train[lang])

    test_numbers = []
    for s, name in enumerate(TEST_SETS):
        for lang, tag, attrs in (("de", "srcset", 'srclang="german"'),
                                 ("en", "refset", 'srclang="german" trglang="english" refid="ref"')):
            body, numbers = [], []
            for doc in range(2):
                body += [f'<doc docid="{s}{doc}" genre="lectures">', f"<url>http://www.ted.com/talks/{s}{doc}.html</url>",
                         f"<description>TED Talk Subtitles and Transcript: {name}</description>",
                         "<keywords>talks</keywords>", f"<talkid>{s}{doc}</talkid>", f"<title>Title {s}{doc}</title>"]
                for seg in range(1, 4):
                    number = 1000 + 100 * s + 10 * doc + seg
                    de, en = sentence_pair(number)
                    text = de.replace("Das", "Das’s") if lang == "de" else en.replace("The", "The dog’s")
                    body.append(f'<seg id="{seg}"> {text} </seg>')
                    numbers.append(number)
                body.append("</doc>")
            write(root / f"{name}.de-en.{lang}.xml",
                  ['<?xml version="1.0" encoding="UTF-8"?>', "<mteval>", f'<{tag} setid="{name}" {attrs}>']
                  + body + [f"</{tag}>", "</mteval>"])
        test_numbers += numbers
    write(root / "README", ["IWSLT 2014 German-English (an imitation for tests)"])
    archive = directory / "de-en.tgz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(root, arcname="de-en")
    shutil.rmtree(root)
    return archive, kept, test_numbers


@pytest.fixture(scope="module")
def iwslt(tmp_path_factory):
    """The IWSLT14 recipe on the imitation archive."""
    archive, kept, test_numbers = write_fake_iwslt14(tmp_path_factory.mktemp("iwslt_orig"))
    dest = tmp_path_factory.mktemp("iwslt_dest")
    result = run_corpus("prepare", "iwslt14", f"--from={archive}", "--dest", dest, "--workers", "1", "--bpe-merges", "300")
    return dest, kept, test_numbers, result


def number_of(line):
    found = re.findall(r"\b(\d+)\b", line)
    return int(found[-1]) if found else None


@pytest.mark.slow
def test_iwslt14_recipe_outputs(iwslt, tmp_path):
    dest, kept, test_numbers, result = iwslt
    assert f"Binarised data (de -> en) is in: {dest / 'data-bin'}" in result.stdout
    assert_binarised(dest / "data-bin", "de", "en")
    tok = {split: {lang: lines(dest / "tok" / f"{split}.{lang}") for lang in ("de", "en")}
           for split in ("train", "valid", "test")}
    everything = [x for split in tok.values() for side in split.values() for x in side]
    # tags: <url>/<keywords>/<talkid> lines dropped, <title>/<description> text kept without the tags
    assert not any(t in x for x in everything for t in ("url", "talkid", "keywords", "&lt;", "&gt;"))
    assert "speaker 1 : the title" in tok["train"]["en"] + tok["valid"]["en"]
    # cleaned (ratio 1.5, 1..175 tokens), then valid = every 23rd pair, train = the rest
    expected_valid = kept[22::23]
    expected_train = [x for i, x in enumerate(kept) if (i + 1) % 23 != 0]
    assert len(expected_valid) >= 2
    for lang in ("de", "en"):
        assert [number_of(x) for x in tok["valid"][lang]] == expected_valid
        assert [number_of(x) for x in tok["train"][lang]] == expected_train
    # test = dev2010 + TEDX.dev2012 + tst2010 + tst2011 + tst2012, in that order; ’ -> '
    assert [number_of(x) for x in tok["test"]["en"]] == [number_of(x) for x in tok["test"]["de"]] == test_numbers
    assert lines(dest / "raw" / "test.en")[0].startswith("The dog's ")
    assert tok["test"]["en"][0].startswith("the dog &apos;s ")
    # Moses tokenisation + lowercasing: "Das Katze Sonne Musik Kinder, 1!" -> "das katze sonne musik kinder , 1 !"
    assert all(x == x.lower() for x in everything)
    assert tok["train"]["de"][2] == "das " + " ".join(DE[(7 + i * 3) % len(DE)] for i in range(4)).lower() + " , 1 !"
    # joint BPE on every split, the very text subword-nmt's own apply-bpe gives
    for split in ("train", "valid", "test"):
        for lang in ("de", "en"):
            assert [unbpe(x) for x in lines(dest / f"{split}.{lang}")] == tok[split][lang]
            reference = subprocess.run([sys.executable, "-m", "subword_nmt.apply_bpe", "-c", str(dest / "code")],
                                       input="\n".join(tok[split][lang]) + "\n", capture_output=True, text=True, check=True)
            assert reference.stdout.splitlines() == lines(dest / f"{split}.{lang}")
    assert any("@@ " in x for x in lines(dest / "train.de"))


def write_fake_wmt16(directory):
    """WMT16 En-Ro's four downloads in miniature: Europarl v8 (.tgz), SETIMES2 (.zip) and the SGML
    newsdev2016 / newstest2016 sets (.tgz, both directions). Returns the Romanian training lines."""
    ro = ["Casa este mare şi ţara {n} .", "Copacul mic lângă râu {n} ."]
    en = ["The house is big and the country {n} .", "The small tree near the river {n} ."]
    pairs = [(ro[n % 2].format(n=n), en[n % 2].format(n=n)) for n in range(60)]
    pairs[7] = ("Da 7 .", "Yes , of course I will do that for you now , 7 .")  # ratio 3 : 13, cleaned after BPE
    (directory / "training").mkdir(parents=True)
    for lang, side in (("ro", 0), ("en", 1)):
        write(directory / "training" / f"europarl-v8.ro-en.{lang}", [p[side] for p in pairs[:40]])
    with tarfile.open(directory / "training-parallel-ep-v8.tgz", "w:gz") as tar:
        tar.add(directory / "training", arcname="training")
    with zipfile.ZipFile(directory / "en-ro.txt.zip", "w") as z:
        for lang, side in (("ro", 0), ("en", 1)):
            z.writestr(f"SETIMES.en-ro.{lang}", "".join(p[side] + "\n" for p in pairs[40:]))
    for name, archive in (("newsdev2016", "dev"), ("newstest2016", "test")):
        (directory / archive).mkdir()
        for direction, lang, side, text in (("enro", "en", "src", 1), ("enro", "ro", "ref", 0), ("roen", "ro", "src", 0),
                                            ("roen", "en", "ref", 1)):
            write(directory / archive / f"{name}-{direction}-{side}.{lang}.sgm",
                  ["<srcset>", "<doc>"] + [f'<seg id="{i + 1}">{p[text]}</seg>' for i, p in enumerate(pairs[:10])]
                  + ["</doc>", "</srcset>"])
        with tarfile.open(directory / f"{archive}.tgz", "w:gz") as tar:
            tar.add(directory / archive, arcname=archive)
    for folder in ("training", "dev", "test"):
        shutil.rmtree(directory / folder)
    return [p[0] for p in pairs]


@pytest.mark.slow
def test_wmt16_recipe_from_its_archives(tmp_path):
    """Archives unpacked as found (.tgz, .zip), the SGML sets read, Romanian normalised (and its
    diacritics removed on the Romanian source), training pairs cleaned after BPE, dev/test kept whole."""
    write_fake_wmt16(tmp_path / "orig")
    dest = tmp_path / "dest"
    run_corpus("prepare", "wmt16-en-ro", "--from", tmp_path / "orig", "--dest", dest, "--src", "ro", "--tgt", "en",
               "--remove-diacritics", "--workers", "1", "--bpe-merges", "50")
    assert_binarised(dest / "data-bin", "ro", "en")
    train = lines(dest / "tok" / "train.ro")
    assert len(train) == 59 and not any("Da 7" in x for x in train)  # the 3 : 13 pair
    assert train[0] == "Casa este mare si tara 0 ."
    assert lines(dest / "raw" / "test.en")[0] == "The house is big and the country 0 ."
    assert [len(lines(dest / f"{split}.ro")) for split in ("valid", "test")] == [10, 10]


def test_wmt14_recipe_downloads_wmt14s_training_data_only():
    """The papers train on WMT14 (Dou et al.: 4.56M pairs); fairseq's default script takes WMT17's News
    Commentary v12."""
    wmt14 = corpus.CORPORA["wmt14-en-de"]
    assert all(url.startswith(("http://statmt.org/wmt13/", "http://statmt.org/wmt14/")) for url in wmt14.urls)
    assert "news-commentary-v9.de-en.{lang}" in wmt14.train


def test_wmt14_normalises_the_punctuation_of_its_training_text_only():
    """fairseq's prepare-wmt14en2de.sh normalises punctuation and removes non-printing characters in the training
    data and tokenises newstest2014 as it is: a normalised reference turned „ “ into &quot; and – into -,
    counting a model's normalised output right where fairseq's reference counts it wrong."""
    wmt14, line = corpus.CORPORA["wmt14-en-de"], "Er sagte: „Ja“ – gut"
    train, test = (corpus.Tokeniser("de", corpus.tokenising_steps(wmt14, split), False)(line)
                   for split in ("train", "test"))
    assert train == "Er sagte : &quot; Ja &quot; - gut" and test == "Er sagte : „ Ja “ – gut"


def test_romanian_normalisation_is_for_the_romanian_side_only():
    steps = corpus.CORPORA["wmt16-en-ro"].steps
    assert corpus.Tokeniser("ro", steps, False)("Ţara şi râul") == "Țara și râul"  # cedilla -> comma below
    assert corpus.Tokeniser("ro", steps + ("no_diacritics",), False)("Ţara şi râul") == "Tara si raul"
    assert corpus.Tokeniser("en", steps + ("no_diacritics",), True)("Ţara şi râul") == "ţara şi râul"


# ------------------------------------------------------------------------------ failures: offline, bad flags

@pytest.mark.parametrize("name", [name for name, recipe in corpus.CORPORA.items() if recipe.urls])
def test_offline_download_fails_with_a_clear_message(name, tmp_path):
    """Offline, the download fails in one line pointing to --from and leaves no partial download; a --dest
    holding a file of the user's is refused before anything is fetched, the file kept."""
    dest = tmp_path / "dest"
    result = run_corpus("prepare", name, "--dest", dest, "--mirror", UNROUTABLE, "--timeout", "2", check=False)
    assert result.returncode == 1
    assert "download of http://10.255.255.1/" in result.stderr and "--from PATH" in result.stderr, result.stderr
    assert not [p for p in os.listdir(dest) if p.startswith(".work")]
    assert not (dest / "orig").exists() or os.listdir(dest / "orig") == []  # no partial download left
    users = tmp_path / "users"
    users.mkdir()
    (users / "mine.txt").write_text("keep me\n")
    result = run_corpus("prepare", name, "--dest", users, "--mirror", UNROUTABLE, "--timeout", "2", check=False)
    assert result.returncode == 2 and "holds files that corpus prepare did not write: mine.txt" in result.stderr
    assert os.listdir(users) == ["mine.txt"] and (users / "mine.txt").read_text() == "keep me\n"


# ------------------------------------------------------------------------------ the comparisons' RAW

MULTI30K_SCRIPT = os.path.join(REPO_ROOT, "examples", "comparison", "multi30k.sh")


def multi30k_files():
    """The file names examples/comparison/multi30k.sha256 lists, in its order."""
    with open(os.path.join(REPO_ROOT, "examples", "comparison", "multi30k.sha256")) as f:
        return [line.split()[1] for line in f]


def run_multi30k_script(raw, mirror):
    return subprocess.run(["bash", MULTI30K_SCRIPT, str(raw)], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "MULTI30K_BASE": f"file://{mirror}"})


def write_mirror(mirror, text_of):
    """``mirror``/data/task1/raw/NAME.gz for every file the script downloads, holding ``text_of(NAME)``."""
    (mirror / "data" / "task1" / "raw").mkdir(parents=True)
    for name in multi30k_files():
        with gzip.open(mirror / "data" / "task1" / "raw" / f"{name}.gz", "wb") as f:
            f.write(text_of(name))


def test_the_multi30k_download_and_the_comparisons_script_are_pinned_to_one_dataset_commit():
    with open(MULTI30K_SCRIPT) as f:
        commit = re.search(r"^COMMIT=([0-9a-f]{40})\b", f.read(), re.M).group(1)
    assert corpus.MULTI30K == f"https://raw.githubusercontent.com/multi30k/dataset/{commit}/"
    assert all(url.startswith(corpus.MULTI30K) for url in corpus.CORPORA["multi30k"].urls)
    from fusion_lab.comparison_report import TEST_SETS
    assert multi30k_files() == [f"{split}.{lang}" for split in ("train", "val", *TEST_SETS) for lang in ("de", "en")]


def test_the_multi30k_script_makes_raw_from_the_files_the_runs_read(tmp_path):
    require_shared_raw()
    write_mirror(tmp_path / "mirror", lambda name: open(os.path.join(SHARED_RAW, name), "rb").read())
    result = run_multi30k_script(tmp_path / "raw", tmp_path / "mirror")
    assert result.returncode == 0, result.stderr
    assert sorted(os.listdir(tmp_path / "raw")) == sorted(multi30k_files())
    assert lines(tmp_path / "raw" / "val.en") == lines(os.path.join(SHARED_RAW, "val.en"))


def test_the_multi30k_script_refuses_other_files_and_leaves_no_raw(tmp_path):
    write_mirror(tmp_path / "mirror", lambda name: b"not the dataset\n")
    result = run_multi30k_script(tmp_path / "raw", tmp_path / "mirror")
    assert result.returncode == 1
    assert "differ from the ones the committed runs read" in result.stderr and "RAW was not made" in result.stderr
    assert sorted(os.listdir(tmp_path)) == ["mirror"]  # no RAW, no partial download beside it


@pytest.mark.parametrize("args,code", [(["--help"], 0), (["-h"], 0), (["--raw"], 2), ([], 2), (["a", "b"], 2)])
def test_the_multi30k_script_takes_no_option_for_raw(tmp_path, args, code):
    """An option is not taken for RAW: --help printed usage after making a folder named after dirname's help."""
    result = subprocess.run(["bash", MULTI30K_SCRIPT, *args], capture_output=True, text=True, timeout=60,
                            cwd=tmp_path, env={**os.environ, "MULTI30K_BASE": f"file://{tmp_path}/no-mirror"})
    assert result.returncode == code and "usage: bash examples/comparison/multi30k.sh RAW" in result.stdout + result.stderr
    assert os.listdir(tmp_path) == [] and "downloading" not in result.stdout


def test_the_multi30k_script_replaces_nothing_in_an_existing_raw(tmp_path):
    (tmp_path / "raw").mkdir()
    (tmp_path / "raw" / "train.de").write_text("mine\n")
    result = run_multi30k_script(tmp_path / "raw", tmp_path / "no-mirror")
    assert result.returncode == 2 and f"RAW '{tmp_path / 'raw'}' exists" in result.stderr
    assert (tmp_path / "raw" / "train.de").read_text() == "mine\n"


@pytest.mark.parametrize("args,expected", [
    (["prepare", "multi30k", "--src", "xx"], ["--src", "'xx'", "de, en, fr, cs"]),
    (["prepare", "multi30k", "--src", "en", "--tgt", "en"], ["--src and --tgt"]),
    (["prepare", "multi30k", "--test-set", "test_2099"], ["--test-set", "'test_2099'"]),
    (["prepare", "multi30k", "--frobnicate"], ["unrecognized arguments", "--frobnicate"]),
    (["prepare", "tatoeba"], ["invalid choice", "'tatoeba'"]),
    (["prepare", "iwslt14", "--bpe-merges", "ten"], ["--bpe-merges", "'ten'"]),
    (["prepare", "iwslt14", "--dest"], ["--dest", "expected one argument"]),
    (["prepare", "iwslt14", "--from", "/nonexistent/de-en.tgz"], ["--from", "'/nonexistent/de-en.tgz'", "does not exist"]),
    (["prepare", "iwslt14", "--test-set", "tst2099"], ["--test-set: invalid value 'tst2099' (choose from: fairseq, he2018)"]),
    (["prepare", "wmt14-en-de", "--workers", "0"], ["--workers", "'0'"]),
    (["prepare", "wmt16-en-ro", "--tgt", "de"], ["--tgt", "'de'"]),
    (["prepare", "wmt16-en-ro", "--remove-diacritics"], ["--remove-diacritics"]),
    (["prepare", "iwslt14", "--valid-every", "1"], ["--valid-every", "'1'"]),
    # flags a corpus would ignore
    (["prepare", "multi30k", "--valid-every", "5"],
     ["--valid-every 5: multi30k has validation files of its own; it holds out every N-th training pair for iwslt14, "
      "wmt14-en-de"]),
    (["prepare", "multi30k", "--max-len", "50"],
     ["--max-len 50: multi30k is not cleaned by length; it is for iwslt14, wmt14-en-de, wmt16-en-ro"]),
    (["prepare", "iwslt14", "--from", "/", "--mirror", "http://m"],
     ["--mirror http://m: --from / reads the files there, nothing is downloaded"]),
    (["prepare", "text", "--src", "de", "--tgt", "en"], ["text needs --from DIR, --src and --tgt"]),
    (["prepare", "text", "--from", "/"], ["text needs --from DIR, --src and --tgt"]),
    (["prepare", "text", "--from", "/", "--src", "d e", "--tgt", "en"], ["--src must be a language code", "'d e'"]),
    (["evaluate", "--beam", "0"], ["--beam", "'0'"]),
    (["evaluate", "/", "/", "--lenpen", "nan"], ["--lenpen", "'nan'"]),
    (["evaluate", "/nonexistent-data-bin", "/nonexistent.pt"], ["DATA_BIN", "'/nonexistent-data-bin'"]),
    (["evaluate", "data-bin", "model.pt", "--frobnicate"], ["unrecognized arguments", "--frobnicate"]),
])
def test_bad_options_are_rejected_by_name(args, expected, tmp_path):
    result = run_corpus(*args, check=False)
    assert result.returncode == 2, (result.returncode, result.stderr)
    for fragment in expected:
        assert fragment in result.stderr, (fragment, result.stderr)
    assert result.stderr.startswith("corpus") and len(result.stderr.splitlines()) == 1, result.stderr


# ---------------------------------------------------------------------------- your own parallel text

def write_own_text(directory):
    """{train,valid,test}.{de,en} of raw text, as ``corpus prepare text --from`` takes it."""
    write_multi30k_slice(directory)
    for name, split in (("val", "valid"), ("test_2016_flickr", "test")):
        for lang in ("de", "en"):
            os.replace(directory / f"{name}.{lang}", directory / f"{split}.{lang}")


def test_own_parallel_text_is_prepared_as_a_corpus(tmp_path):
    mine, dest = tmp_path / "mine", tmp_path / "dest"
    write_own_text(mine)
    result = run_corpus("prepare", "text", "--from", mine, "--src", "de", "--tgt", "en", "--dest", dest,
                        "--workers", "1", "--bpe-merges", "50")
    assert f"Binarised data (de -> en) is in: {dest / 'data-bin'}" in result.stdout
    assert_binarised(dest / "data-bin", "de", "en")
    env = dict(line.split("=", 1) for line in lines(dest / "data-bin" / "recipe.env") if "=" in line)
    assert [env[key] for key in ("RECIPE", "SRC", "TGT", "LOWERCASE", "TEST_SET")] == ["text", "de", "en", "0", "test"]
    for split in ("train", "valid", "test"):  # every pair kept; Moses-tokenised ("the." -> "the ."), cased
        assert lines(dest / "raw" / f"{split}.en") == lines(mine / f"{split}.en")
        assert lines(dest / "tok" / f"{split}.en") == [line[:-1] + " ." for line in lines(mine / f"{split}.en")]
    assert lines(env["RAW_REF_test"]) == lines(mine / "test.en")


def test_bytes_that_are_not_utf8_are_named_not_replaced_silently(tmp_path):
    mine = tmp_path / "mine"
    write_own_text(mine)
    with open(mine / "train.de", "ab") as f:
        f.write(b"caf\xe9\n")
    with open(mine / "train.en", "a", encoding="utf-8") as f:
        f.write("cafe\n")
    result = run_corpus("prepare", "text", "--from", mine, "--src", "de", "--tgt", "en", "--dest", tmp_path / "dest",
                        "--workers", "1", "--bpe-merges", "50")
    assert f"warning: {mine / 'train.de'}: 1 lines have bytes that are not UTF-8, read as U+FFFD" in result.stderr


@pytest.mark.parametrize("split, damage, message", [
    ("train", "long", "line 301 of the train split (en) has "),
    ("test", "long", "line 51 of the test split (en) has "),
    ("valid", "empty", "the valid split has 0 lines in "),
])
def test_own_text_fairseq_cannot_take_is_refused_before_anything_is_written(tmp_path, split, damage, message):
    """A side longer than fairseq's models take (fairseq-generate stops on such a test sentence after all
    the training), or an empty split."""
    mine = tmp_path / "mine"
    write_own_text(mine)
    if damage == "long":
        with open(mine / f"{split}.en", "a", encoding="utf-8") as f:
            f.write(" ".join(["word"] * 2000) + "\n")
        with open(mine / f"{split}.de", "a", encoding="utf-8") as f:
            f.write("kurz\n")
    else:
        (mine / f"{split}.de").write_text("")
    result = run_corpus("prepare", "text", "--from", mine, "--src", "de", "--tgt", "en", "--dest", tmp_path / "dest",
                        "--workers", "1", "--bpe-merges", "50", check=False)
    error = result.stderr.strip().splitlines()[-1]
    assert result.returncode == 1 and error.startswith("corpus: error: ") and message in error, result.stderr
    if damage == "long":
        assert error.endswith("subword tokens after BPE; fairseq's models take at most 1023 (shorten or remove that "
                              "line)")
    assert not (tmp_path / "dest" / "data-bin").exists() and not (tmp_path / "dest" / "tok").exists()


# ---------------------------------------------------------------------------------------- the steps

def test_clean_follows_clean_corpus_n():
    src = ["a b c", "a", "  a   b  ", "", "x " * 176, "a|b c", "a b c d"]
    tgt = ["a b c", "a b c d", "a b", "a", "y " * 176, "a b", "a b c d e f g"]
    raw = [f"raw {i}" for i in range(len(src))]
    # kept: identical; squeezed "a b"; "ab c" (pipe removed) vs "a b"; dropped: ratio 4, empty, too long, 7/4
    assert corpus.clean([src, tgt, raw], 175, 1.5) == [["a b c", "a b", "ab c"], ["a b c", "a b", "a b"],
                                                       ["raw 0", "raw 2", "raw 5"]]


def test_bleu_scores_and_compound_split(tmp_path):
    ref = ["The well-known cat sat on the mat.", "It is raining today, isn't it?"]
    tok = ["the well @-@ known cat sat on the mat .", "it is raining today , isn &apos;t it ?"]
    write(tmp_path / "ref", ref)
    write(tmp_path / "tok", tok)
    write(tmp_path / "hyp", [x.lower() for x in ref])
    out, scores = corpus.bleu_scores(str(tmp_path / "hyp"), str(tmp_path / "ref"), str(tmp_path / "tok"),
                                     str(tmp_path / "tok"), lowercase=True, compound_split=True)
    assert re.search(r"^sacreBLEU \(detokenized, case-insensitive\) .*: BLEU = 100\.00", out, re.M), out
    assert "sacreBLEU signature: nrefs:1|case:lc|eff:no|tok:13a|smooth:exp|version:" in out
    assert re.search(r"^Tokenized BLEU \(case-insensitive; .*compound-split\) .*: BLEU = 100\.00", out, re.M), out
    assert scores["sacrebleu"] == scores["tokenized_bleu"] == 100.0 and scores["compound_split"]


# ------------------------------------------------------------------------------------------- evaluate

@pytest.mark.slow
def test_evaluate_end_to_end_on_a_tiny_transformer(m30k, m30k_slice, tmp_path):
    dest, _ = m30k
    databin = dest / "data-bin"
    save_dir = tmp_path / "ckpt"
    subprocess.run(
        [sys.executable, "-m", "fairseq_cli.train", str(databin), "--arch", "transformer",
         "--encoder-layers", "1", "--decoder-layers", "1", "--encoder-embed-dim", "16", "--decoder-embed-dim", "16",
         "--encoder-ffn-embed-dim", "32", "--decoder-ffn-embed-dim", "32", "--encoder-attention-heads", "2",
         "--decoder-attention-heads", "2", "--share-all-embeddings", "--optimizer", "adam", "--lr", "0.001",
         "--max-tokens", "2000", "--max-update", "5", "--save-dir", str(save_dir), "--no-epoch-checkpoints",
         "--no-progress-bar", "--seed", "1", "--disable-validation", "--cpu"],
        check=True, capture_output=True, text=True, timeout=300, env={**os.environ, "PYTHONWARNINGS": "ignore"})
    out_dir = tmp_path / "eval"
    # the reference defaults to the one prepare recorded; pass it explicitly as users would
    result = run_corpus("evaluate", databin, save_dir / "checkpoint_last.pt", "--gen-subset", "test", "--beam", "2",
                        "--ref", m30k_slice / "test_2016_flickr.en", "--out", out_dir, "--batch-size", "50",
                        "--", "--max-len-b", "12")
    out = result.stdout
    detok = re.search(r"^sacreBLEU \(detokenized, case-insensitive\) vs .*: BLEU = (\d+\.\d+) ", out, re.M)
    signature = re.search(r"^sacreBLEU signature: (nrefs:1\|case:lc\|eff:no\|tok:13a\|smooth:exp\|version:[\d.]+)$",
                          out, re.M)
    tokenized = re.search(r"^Tokenized BLEU \(case-insensitive; .*\) vs .*: BLEU = (\d+\.\d+) ", out, re.M)
    assert detok and signature and tokenized, out
    assert 0.0 <= float(detok.group(1)) <= 100.0 and 0.0 <= float(tokenized.group(1)) <= 100.0
    # every test sentence translated (none dropped by fairseq's batching), BPE removed, original order
    hyps = lines(out_dir / "hyp.tok")
    assert len(hyps) == len(lines(out_dir / "hyp.detok")) == 100
    assert not any("@@" in h for h in hyps)
    refs = lines(out_dir / "ref.fairseq.tok")
    expected = lines(dest / "tok" / "test.en")
    same = [r == e for r, e in zip(refs, expected) if "<unk>" not in r]
    assert len(refs) == 100 and all(same) and len(same) > 50
    scores = json.loads((out_dir / "scores.json").read_text())
    assert scores["sentences"] == 100 and scores["case_insensitive"]


# ----------------------------------------------------------------------- paper training recipes (dry runs)

def train_recipe(paper, data_bin, *args):
    """``examples/<paper>/train.sh DATA_BIN ARGS --dry-run``: its exit status, stdout and stderr."""
    from conftest import USER_DIR

    script = os.path.join(REPO_ROOT, "examples", paper, "train.sh")
    return subprocess.run(["bash", script, str(data_bin), *map(str, args), "--dry-run", "--user-dir", USER_DIR],
                          capture_output=True, text=True, timeout=60)


def parsed_recipe(paper, data_bin, *args):
    """The recipe's fairseq-train command, parsed by fairseq's own training parser."""
    import shlex

    from fairseq import options

    result = train_recipe(paper, data_bin, *args)
    assert result.returncode == 0, result.stderr
    argv = shlex.split(result.stdout)
    assert argv[0] == "fairseq-train" and argv[1] == str(data_bin)
    return options.parse_args_and_arch(options.get_training_parser(), argv[1:])


def test_mlrf_recipe_stage_1_is_the_papers_mle_training(tmp_path):
    """Wang et al. Sec. 4.2: MLE (no label smoothing), Adam (0.9, 0.98, 1e-9), lr = d^-0.5 min(t^-0.5,
    t 16k^-1.5), 80 sentences a batch, 40 epochs."""
    args = parsed_recipe("mlrf", tmp_path, "both-fnn-sa", "--gpus", "2")
    assert (args.arch, args.fuse_encoder, args.fuse_decoder, args.fusion_hops) == ("mlrf_iwslt_de_en", "fnn", "sa", 4)
    assert args.criterion == "cross_entropy" and args.optimizer == "adam" and args.adam_eps == 1e-9
    assert ast.literal_eval(args.adam_betas) == (0.9, 0.98)  # fairseq keeps the tuple as text
    assert args.lr_scheduler == "inverse_sqrt" and args.warmup_updates == 16000
    assert abs(args.lr[0] - 256 ** -0.5 * 16000 ** -0.5) < 1e-6
    assert args.batch_size * 2 == 80 and args.max_tokens is None and args.max_epoch == 40
    assert args.save_dir == "checkpoints/mlrf-iwslt-de-en/both-fnn-sa/stage1" and args.finetune_from_model is None


def sentences_per_update(args, gpus):
    """What fairseq's batching makes of the recipe's --batch-size on ``gpus`` GPUs, for a long run of
    sentences of equal length."""
    from fairseq.data import data_utils

    batches = data_utils.batch_by_size(np.arange(1000), lambda i: 10, max_sentences=args.batch_size,
                                       required_batch_size_multiple=args.required_batch_size_multiple)
    return len(batches[0]) * gpus


@pytest.mark.parametrize("gpus", [1, 2, 4, 8, 16])
def test_mlrf_recipe_updates_see_the_papers_80_and_32_sentences_on_any_gpu_count(gpus, tmp_path):
    """80/4 = 20 sentences a GPU would be rounded down to 16 by fairseq's default
    --required-batch-size-multiple 8: 64 sentences an update instead of 80."""
    stage_1 = parsed_recipe("mlrf", tmp_path, "both-fnn-sa", "--gpus", str(gpus))
    stage_2 = parsed_recipe("mlrf", tmp_path, "both-fnn-sa", "--gpus", str(gpus), "--stage", "2")
    assert (sentences_per_update(stage_1, gpus), sentences_per_update(stage_2, gpus)) == (80, 32)


def test_mlrf_recipe_stage_2_restarts_adam_from_stage_1(tmp_path):
    """Then "we restart Adam and continue the training for additional 20 epochs with a fixed learning
    rate 5e-5 and a smaller mini-batch of 32": the stage 1 weights with a fresh optimiser, schedule,
    meters and data loader (fairseq's --finetune-from-model), in a directory of its own."""
    args = parsed_recipe("mlrf", tmp_path, "dec-sa", "--stage", "2", "--hops", "6")
    assert args.finetune_from_model == "checkpoints/mlrf-iwslt-de-en/dec-sa-hops6/stage1/checkpoint_last.pt"
    assert (args.lr_scheduler, args.lr, args.batch_size, args.max_epoch) == ("fixed", [5e-5], 32, 20)
    assert (args.fuse_encoder, args.fuse_decoder, args.fusion_hops) == ("none", "sa", 6)
    assert args.save_dir == "checkpoints/mlrf-iwslt-de-en/dec-sa-hops6/stage2" and not args.reset_optimizer
    # NIST Zh-En: 6+6 layers at d=512 (its own peak lr), 10 + 5 epochs
    nist = parsed_recipe("mlrf", tmp_path, "baseline", "--setting", "nist-zh-en")
    assert (nist.arch, nist.fuse_decoder, nist.max_epoch, nist.fusion_independent_w1) == \
        ("fusion_transformer", "none", 10, False)
    assert abs(nist.lr[0] - 512 ** -0.5 * 16000 ** -0.5) < 1e-6
    assert parsed_recipe("mlrf", tmp_path, "baseline", "--setting", "nist-zh-en", "--stage", "2").max_epoch == 5


def test_mlrf_recipe_nist_best_system_is_the_mlrf_nist_zh_en_preset(tmp_path):
    """Table 3's Dec-SA + independent W1 through the recipe has every model setting of the preset."""
    from model_building import parse_model_args

    recipe = parsed_recipe("mlrf", tmp_path, "dec-sa+w1", "--setting", "nist-zh-en")
    preset = parse_model_args("mlrf_nist_zh_en")
    for key in ("encoder_layers", "decoder_layers", "encoder_embed_dim", "encoder_ffn_embed_dim",
                "decoder_attention_heads", "dropout", "fuse_encoder", "fuse_decoder", "fusion_hops",
                "fusion_attn_dim", "fusion_ffn_dim", "fusion_independent_w1", "fusion_no_layer_embedding"):
        assert getattr(recipe, key) == getattr(preset, key), key
    assert parsed_recipe("mlrf", tmp_path, "both-avg-sa", "--setting", "nist-zh-en").fuse_encoder == "avg"


@pytest.mark.parametrize("argv,message", [
    (["bogus"], "unknown VARIANT 'bogus'"),
    (["enc-fnn", "--stage", "3"], "--stage: invalid value '3' (expected 1 or 2)"),
    (["enc-fnn", "--setting", "wmt"], "--setting: invalid value 'wmt'"),
    (["enc-fnn", "--gpus", "3"], "--gpus 3"),
    (["enc-fnn", "--hops", "0"], "--hops: invalid value '0'"),
    (["enc-fnn+w1"], "+w1 is an option of self-attention fusion"),
])
def test_mlrf_recipe_refuses_bad_arguments(argv, message, tmp_path):
    result = train_recipe("mlrf", tmp_path, *argv)
    assert result.returncode == 2 and message in result.stderr, result.stderr


def test_mlrf_stage_2_without_stage_1_fails_before_training(tmp_path):
    script = os.path.join(REPO_ROOT, "examples", "mlrf", "train.sh")
    result = subprocess.run(["bash", script, str(tmp_path), "enc-fnn", "--stage", "2", "--gpus", "1",
                             "--save-root", str(tmp_path / "ckpt")], capture_output=True, text=True, timeout=60)
    assert result.returncode == 1 and "stage 1 checkpoint" in result.stderr and "not found" in result.stderr
    assert not (tmp_path / "ckpt").exists()


@pytest.mark.parametrize("variant,arch,flags", [
    ("4l-2", "dense_fconv_iwslt_de_en", {"dense_attention": "2"}),
    ("8l-1", "dense_fconv_iwslt_de_en_8l", {"dense_attention": "1"}),
    ("enc-4l", "dense_fconv_iwslt_de_en", {"no_dense_decoder": True, "no_dense_encoder": False}),
    ("base-8l", "dense_fconv_iwslt_de_en_8l", {"no_dense_decoder": True, "no_dense_encoder": True,
                                               "summary_every": 0, "dense_attention": "none"}),
    ("en-de-15", "dense_fconv_wmt_en_de", {}),
    ("convs2s", "fconv_wmt_en_de", {}),
])
def test_dense_nmt_recipe_is_the_papers_training_setting(variant, arch, flags, tmp_path):
    """Shen et al. Sec. 4.3: NAG, lr 0.25, shrink by 10 when the validation loss rises, stop below 1e-4,
    batch 32 sentences (48 on WMT14 En-De); no label smoothing."""
    args = parsed_recipe("dense_nmt", tmp_path, variant)
    assert args.arch == arch
    for key, value in flags.items():
        assert getattr(args, key) == value, key
    assert (args.optimizer, args.lr, args.momentum, args.lr_scheduler, args.lr_shrink, args.stop_min_lr) == \
        ("nag", [0.25], 0.99, "shrink_on_validation_increase", 0.1, 1e-4)
    # WMT14 En-De: every epoch from the first rise on, as Gehring et al.
    assert args.shrink_every_epoch_after_increase == (variant in ("en-de-15", "convs2s"))
    assert args.criterion == "cross_entropy" and args.batch_size == (48 if "en-de" in variant or variant == "convs2s" else 32)
    # one GPU: on more, every GPU would take a batch of its own and multiply the paper's (fairseq's
    # default world size is the visible GPU count, so the command itself must say it)
    words = train_recipe("dense_nmt", tmp_path, variant).stdout.split()
    assert words[words.index("--distributed-world-size") + 1] == "1" and args.distributed_world_size == 1


def test_dense_nmt_recipe_baselines_are_the_residual_convs2s(tmp_path):
    """BASE-4L / BASE-8L through the plugin have exactly the parameters of fairseq's residual ConvS2S
    of width 256 / 192 (the Table 1 and 2 baselines)."""
    from model_building import build_model, count_parameters

    def count(variant):
        args = parsed_recipe("dense_nmt", tmp_path, variant)
        return count_parameters(build_model(args.arch, *recipe_model_flags(variant), src_vocab=500, tgt_vocab=400))

    base4 = count_parameters(build_model("fconv_iwslt_de_en", "--decoder-layers", "[(256, 3)] * 4",
                                         src_vocab=500, tgt_vocab=400))
    base8 = count_parameters(build_model("fconv_iwslt_de_en", "--encoder-layers", "[(192, 3)] * 8",
                                         "--decoder-layers", "[(192, 3)] * 8", src_vocab=500, tgt_vocab=400))
    assert (count("base-4l"), count("base-8l")) == (base4, base8)


def recipe_model_flags(variant):
    """The model flags (after --arch ARCH, before the optimiser) the DenseNMT recipe prints for ``variant``."""
    import shlex

    words = shlex.split(train_recipe("dense_nmt", REPO_ROOT, variant).stdout)
    return words[words.index("--arch") + 2: words.index("--optimizer")]


@pytest.mark.parametrize("argv,message", [
    (["bogus"], "unknown VARIANT 'bogus'"),
    (["en-de-15", "--embed", "64"], "--embed 64: the smaller embeddings of Table 1 are IWSLT models"),
    (["4l-2", "--embed", "512"], "--embed 512: must not exceed the embedding size 256"),
    (["4l-2", "--summary-layer", "dense"], "--summary-layer: invalid value 'dense' (choose from: conv, linear)"),
    (["convs2s", "--summary-layer", "conv"], "--summary-layer conv: VARIANT convs2s has no summary layers"),
])
def test_dense_nmt_recipe_refuses_bad_arguments(argv, message, tmp_path):
    result = train_recipe("dense_nmt", tmp_path, *argv)
    assert result.returncode == 2 and message in result.stderr, result.stderr


def test_dense_nmt_recipe_small_embeddings(tmp_path):
    args = parsed_recipe("dense_nmt", tmp_path, "4l-2", "--embed", "64")
    assert args.embed_bottleneck_dim == 64 and args.save_dir == "checkpoints/densenmt/4l-2-embed64"


def test_dense_nmt_recipe_offers_both_summary_layer_readings(tmp_path):
    assert parsed_recipe("dense_nmt", tmp_path, "8l-2").summary_layer == "linear"  # the preset's
    args = parsed_recipe("dense_nmt", tmp_path, "8l-2", "--summary-layer", "conv")
    assert args.summary_layer == "conv" and args.save_dir == "checkpoints/densenmt/8l-2-conv"


def test_deep_representations_recipe_has_the_papers_88m_transformer_base(tmp_path):
    """Dou et al. Table 1: Transformer-Base has 88.0M parameters: source, target and softmax matrices
    of their own (all shared: about 61M); 88.1M (88,068,096) with 28.6K BPE types per side."""
    from model_building import build_model, count_parameters

    args = parsed_recipe("deep_representations", tmp_path, "vanilla", "--gpus", "1")
    assert not args.share_all_embeddings and not args.share_decoder_input_output_embed
    model = build_model(args.arch, src_vocab=28600, tgt_vocab=28600)
    assert round(count_parameters(model) / 1e6, 1) == 88.1


@pytest.mark.parametrize("variant, arch", [("vanilla", "transformer_vaswani_wmt_en_de_big"),
                                           ("hierarchical+div", "deeprep_transformer_wmt_en_de_big")])
def test_deep_representations_recipe_big_is_vaswanis_big_setting(variant, arch, tmp_path):
    """Dou et al. follow Vaswani et al.'s settings: Big trains at dropout 0.3 for 300K updates, peak lr
    d^-0.5 * 4000^-0.5 at d = 1024; its checkpoints stay apart from Base's."""
    args = parsed_recipe("deep_representations", tmp_path, variant, "--big", "--gpus", "1", "--vanilla", "v.pt")
    assert (args.arch, args.dropout, args.max_update, args.encoder_embed_dim) == (arch, 0.3, 300000, 1024)
    assert args.lr == [pytest.approx(1024 ** -0.5 * 4000 ** -0.5, rel=1e-3)]
    assert args.save_dir == f"checkpoints/deeprep-wmt14-en-de-big/{variant}"
    base = parsed_recipe("deep_representations", tmp_path, "vanilla", "--gpus", "1")
    assert (base.arch, base.dropout, base.max_update, base.lr) == ("transformer_wmt_en_de", 0.1, 100000, [7e-4])


def test_surface_fusion_recipe_released_variant_and_lr(tmp_path):
    """The authors' released training command: peak lr 5e-4 after 4000 warm-up steps; +released trains
    SurfaceFusion as their code does."""
    args = parsed_recipe("surface_fusion", tmp_path, "soft+released", "--gpus", "1")
    assert (args.surface_fusion, args.surface_fusion_variant, args.lr) == ("soft", "released", [5e-4])
    assert args.attention_dropout == 0.1  # the released code's base_architecture
    paper = parsed_recipe("surface_fusion", tmp_path, "hard", "--gpus", "1")
    assert (paper.surface_fusion_variant, paper.attention_dropout) == ("paper", 0.0)
    result = train_recipe("surface_fusion", tmp_path, "fgla+released")
    assert result.returncode == 2 and "+released is a SurfaceFusion variant" in result.stderr


def test_layerwise_coordination_recipe_batch_counts_concatenated_pairs(tmp_path):
    """He et al. Sec. 4.3 batch "roughly 4096 tokens" of concatenated source + target sentences;
    fairseq's --max-tokens counts max(source, target) per pair: 2048."""
    for name in ("dict.src.txt", "dict.tgt.txt"):
        (tmp_path / name).write_text("a 1\nb 1\n")
    args = parsed_recipe("layerwise_coordination", tmp_path, "coordination")
    assert args.max_tokens == 2048 and args.lr == [0.000988] and args.warmup_updates == 4000


@pytest.mark.slow
def test_iwslt14_recipe_he2018_test_set_subword_filter_and_separate_dictionaries(tmp_path):
    """--test-set he2018 leaves TEDX.dev2012 out (He et al. 2018 Sec. 4.1); --max-subwords drops train
    and valid pairs with a side over N subwords after BPE, keeping the valid references in step (Wang et
    al. 2018: 100); --no-joined-dictionary gives each language its own dictionary (Wang et al.'s
    8,389 / 6,428 types)."""
    archive, _, test_numbers = write_fake_iwslt14(tmp_path / "orig")
    dest = tmp_path / "dest"
    run_corpus("prepare", "iwslt14", f"--from={archive}", "--dest", dest, "--workers", "1", "--bpe-merges", "300",
               "--test-set", "he2018", "--max-subwords", "11", "--no-joined-dictionary")
    dev2012 = {n for n in test_numbers if (n - 1000) // 100 == TEST_SETS.index("IWSLT14.TEDX.dev2012")}
    assert [number_of(x) for x in lines(dest / "tok" / "test.en")] == [n for n in test_numbers if n not in dev2012]
    unfiltered = tmp_path / "unfiltered"
    run_corpus("prepare", "iwslt14", f"--from={archive}", "--dest", unfiltered, "--workers", "1", "--bpe-merges", "300")
    for split in ("train", "valid"):
        pairs = list(zip(lines(dest / f"{split}.de"), lines(dest / f"{split}.en")))
        assert pairs and all(len(de.split()) <= 11 and len(en.split()) <= 11 for de, en in pairs)
        assert len(pairs) < len(lines(unfiltered / f"{split}.de"))
        for lang in ("de", "en"):
            assert [unbpe(x) for x in lines(dest / f"{split}.{lang}")] == lines(dest / "tok" / f"{split}.{lang}")
    assert len(lines(dest / "raw" / "valid.en")) == len(lines(dest / "valid.en"))
    assert lines(dest / "data-bin" / "dict.de.txt") != lines(dest / "data-bin" / "dict.en.txt")


def test_layerwise_coordination_recipe_pre_norm_option(tmp_path):
    """--pre-norm: pre-norm layers for the coordination stack and for the Transformer baseline (whose
    tensor2tensor original is pre-norm); post-norm by default."""
    for name in ("dict.src.txt", "dict.tgt.txt"):
        (tmp_path / name).write_text("a 1\nb 1\n")
    assert not parsed_recipe("layerwise_coordination", tmp_path, "coordination").normalize_before
    assert parsed_recipe("layerwise_coordination", tmp_path, "coordination", "--pre-norm").normalize_before
    baseline = parsed_recipe("layerwise_coordination", tmp_path, "transformer", "--pre-norm")
    assert baseline.encoder_normalize_before and baseline.decoder_normalize_before
    assert baseline.save_dir.endswith("transformer-prenorm")


# ------------------------------------------------------------ paper training recipes: their save folder

# writes every name as fairseq-train may (open by name, copy onto a name), then checkpoint_last.pt
FAKE_FAIRSEQ_TRAIN = """#!/usr/bin/env bash
while [[ $# -gt 0 ]]; do if [[ $1 == --save-dir ]]; then save_dir=$2; fi; shift; done
for name in dummy checkpoint1.pt checkpoint_1_2.pt checkpoint.best_nll_loss_1.234.pt checkpoint_last.pt.tmp; do
    echo fairseq > "$save_dir/$name"
done
echo fairseq > "$save_dir/checkpoint_last.pt"
cp "$save_dir/checkpoint_last.pt" "$save_dir/checkpoint_best.pt"
"""


def run_recipe(paper, data_bin, save_root, *args, extra=(), fairseq_train=None):
    """``examples/<paper>/train.sh DATA_BIN ARGS --save-root SAVE_ROOT -- EXTRA`` run (not a dry run), with
    ``fairseq_train`` (a script's text) as fairseq-train when given: exit status, stdout and stderr."""
    from conftest import USER_DIR

    path = os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"]
    if fairseq_train is not None:
        stub = save_root.parent / "stub"
        stub.mkdir(exist_ok=True)
        (stub / "fairseq-train").write_text(fairseq_train)
        (stub / "fairseq-train").chmod(0o755)
        path = f"{stub}{os.pathsep}{path}"
    script = os.path.join(REPO_ROOT, "examples", paper, "train.sh")
    return subprocess.run(["bash", script, str(data_bin), *map(str, args), "--save-root", str(save_root), "--gpus", "1",
                           "--user-dir", USER_DIR, "--", *map(str, extra)], capture_output=True, text=True,
                          timeout=600, env={**os.environ, "PATH": path, "PYTHONWARNINGS": "ignore"})


def test_recipe_writes_no_checkpoint_through_a_link_in_its_save_folder(tmp_path):
    """fairseq-train writes dummy and its checkpoint names by name: a link (or a hard-linked file) there was
    written through (a user's file emptied, another overwritten by a checkpoint). The links among those
    names are removed first; the user's other files and links stay; a link named the save folder is followed."""
    user, disk, root = tmp_path / "user", tmp_path / "disk", tmp_path / "sr"
    user.mkdir()
    (disk / "vanilla").mkdir(parents=True)
    root.mkdir()
    (root / "vanilla").symlink_to(disk / "vanilla")  # the save folder on another disk: followed
    save_dir = disk / "vanilla"
    save_dir.chmod(0o777)
    names = ["dummy", "checkpoint_best.pt", "checkpoint1.pt", "checkpoint_1_2.pt", "checkpoint.best_nll_loss_1.234.pt",
             "checkpoint_last.pt.tmp"]
    for name in names + ["notes", "kept.pt"]:
        (user / name).write_text(f"the user's {name}\n")
    for name in names[:-1] + ["notes"]:
        (save_dir / name).symlink_to(user / name)
    os.link(user / "checkpoint_last.pt.tmp", save_dir / "checkpoint_last.pt.tmp")  # a hard link
    os.link(user / "kept.pt", save_dir / "kept.pt")  # not a name fairseq writes: stays
    result = run_recipe("surface_fusion", tmp_path, root, "vanilla", fairseq_train=FAKE_FAIRSEQ_TRAIN)
    assert result.returncode == 0, result.stderr
    for name in names + ["notes", "kept.pt"]:
        assert (user / name).read_text() == f"the user's {name}\n", name
    assert (save_dir / "notes").is_symlink() and (save_dir / "kept.pt").stat().st_nlink == 2
    assert (save_dir / "checkpoint_best.pt").read_text() == "fairseq\n" and not (save_dir / "checkpoint_best.pt").is_symlink()
    assert save_dir.stat().st_mode & 0o022 == 0 and (root / "vanilla").is_symlink()


def test_recipe_refuses_to_resume_another_commands_checkpoint(tmp_path):
    """The save folder depends on the variant only: a second run differing in an extra flag (--lr) resumed
    the first one's checkpoint_last.pt, and trained nothing if that one had reached --max-update. It is
    refused, naming the folder and the flag; the same command resumes; a folder of an older recipe (no
    train_command.txt) resumes with a warning."""
    root = tmp_path / "sr"
    save_dir = root / "vanilla"

    def run(*extra):
        return run_recipe("surface_fusion", tmp_path, root, "vanilla", extra=extra, fairseq_train=FAKE_FAIRSEQ_TRAIN)

    assert run("--lr", "5e-4").returncode == 0
    recorded = (save_dir / "train_command.txt").read_text()
    assert recorded.splitlines()[0] == "fairseq-train" and recorded.splitlines()[-2:] == ["--lr", "5e-4"]
    (save_dir / "checkpoint_last.pt").write_text("the first run's\n")
    refused = run("--lr", "1e-3")
    assert refused.returncode == 1 and refused.stderr.count("\n") == 1, refused.stderr
    assert f"save folder {save_dir} holds the checkpoint_last.pt of another fairseq-train command" in refused.stderr
    assert "(--lr 1e-3 here, --lr 5e-4 in " in refused.stderr and "another --save-root" in refused.stderr
    assert (save_dir / "checkpoint_last.pt").read_text() == "the first run's\n"
    assert (save_dir / "train_command.txt").read_text() == recorded
    added = run("--lr", "5e-4", "--seed", "2")
    assert added.returncode == 1 and "(--seed 2 here, nothing in " in added.stderr, added.stderr
    resumed = run("--lr", "5e-4")  # the same command: fairseq-train resumes
    assert resumed.returncode == 0 and resumed.stderr == "", resumed.stderr
    (save_dir / "train_command.txt").unlink()
    older = run("--lr", "1e-3")
    assert older.returncode == 0 and "warning: " in older.stderr and "no train_command.txt" in older.stderr
    assert (save_dir / "train_command.txt").read_text().splitlines()[-2:] == ["--lr", "1e-3"]
    (save_dir / "checkpoint_last.pt").unlink()  # no checkpoint to resume: any command trains
    assert run("--lr", "2e-3").returncode == 0


TINY_TRANSFORMER = ["--encoder-layers", "1", "--decoder-layers", "1", "--encoder-embed-dim", "16",
                    "--decoder-embed-dim", "16", "--encoder-ffn-embed-dim", "32", "--decoder-ffn-embed-dim", "32",
                    "--encoder-attention-heads", "2", "--decoder-attention-heads", "2", "--cpu", "--no-progress-bar",
                    "--seed", "1"]


@pytest.mark.slow
def test_recipe_save_folder_with_fairseq_train(tiny_joined_data_bin, tmp_path):
    """The reproductions, with fairseq-train itself: dummy and checkpoint_best.pt linked to a user's files
    (the first was emptied, the second got a checkpoint); then another --lr in the same folder."""
    user, root = tmp_path / "user", tmp_path / "sr"
    user.mkdir()
    (root / "vanilla").mkdir(parents=True)
    for name in ("e.txt", "f.txt"):
        (user / name).write_text(f"the user's {name}\n")
    (root / "vanilla" / "dummy").symlink_to(user / "e.txt")
    (root / "vanilla" / "checkpoint_best.pt").symlink_to(user / "f.txt")
    first = run_recipe("surface_fusion", tiny_joined_data_bin, root, "vanilla", "--max-update", "1",
                       extra=TINY_TRANSFORMER)
    assert first.returncode == 0, first.stderr[-3000:]
    assert [(user / name).read_text() for name in ("e.txt", "f.txt")] == ["the user's e.txt\n", "the user's f.txt\n"]
    assert (root / "vanilla" / "checkpoint_best.pt").stat().st_size > 1000
    last = (root / "vanilla" / "checkpoint_last.pt").read_bytes()
    refused = run_recipe("surface_fusion", tiny_joined_data_bin, root, "vanilla", "--max-update", "1",
                         extra=TINY_TRANSFORMER + ["--lr", "1e-3"])
    assert refused.returncode == 1 and "(--lr 1e-3 here, nothing in " in refused.stderr, refused.stderr[-3000:]
    assert (root / "vanilla" / "checkpoint_last.pt").read_bytes() == last


RECIPES_WITH_PAPER_TABLES = ("mlrf", "deep_representations", "surface_fusion", "layerwise_coordination", "dense_nmt")


@pytest.mark.parametrize("recipe", RECIPES_WITH_PAPER_TABLES)
def test_recipe_readme_has_one_differences_from_the_paper_table(recipe):
    """Each paper's README lists what it still does differently from the paper in one section,
    ``## Differences from the paper``, holding one markdown table with the columns what / the paper /
    this recipe / why and at least three rows, each with a cell per column."""
    with open(os.path.join(REPO_ROOT, "examples", recipe, "README.md"), encoding="utf-8") as f:
        lines_ = f.read().splitlines()
    headings = [i for i, line in enumerate(lines_) if line.strip() == "## Differences from the paper"]
    assert len(headings) == 1, f"{recipe}: {len(headings)} '## Differences from the paper' sections"
    assert not [line for line in lines_ if line.startswith("#") and "differences from the paper" in line.lower()
                and line.strip() != "## Differences from the paper"], f"{recipe}: a second differences heading"
    section = []
    for line in lines_[headings[0] + 1:]:
        if re.match(r"#{1,2} ", line):
            break
        section.append(line)

    def cells(row):
        return [cell.strip() for cell in re.split(r"(?<!\\)\|", row.strip())[1:-1]]

    tables, current = [], None
    for line in section:
        if line.lstrip().startswith("|"):
            if current is None:
                current = []
                tables.append(current)
            current.append(line)
        else:
            current = None
    assert len(tables) == 1, f"{recipe}: {len(tables)} tables in 'Differences from the paper'"
    header, separator, *rows = tables[0]
    assert cells(header) == ["what", "the paper", "this recipe", "why"]
    assert all(re.fullmatch(r":?-{3,}:?", cell) for cell in cells(separator)) and len(cells(separator)) == 4
    assert len(rows) >= 3, f"{recipe}: {len(rows)} rows"
    for row in rows:
        assert len(cells(row)) == 4 and all(cells(row)), f"{recipe}: malformed row {row!r}"


@pytest.mark.parametrize("recipe", RECIPES_WITH_PAPER_TABLES)
def test_recipe_help_prints_its_usage_and_runs_nothing(recipe):
    """A command in backquotes inside the usage text ran when --help printed it (`corpus prepare iwslt14`:
    "corpus: command not found", and a blank where the command's name should be)."""
    result = subprocess.run(["bash", os.path.join(REPO_ROOT, "examples", recipe, "train.sh"), "--help"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and result.stderr == ""
    assert result.stdout.startswith("Usage: ") and "``" not in result.stdout
