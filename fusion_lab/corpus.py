"""One data pipeline: prepare a parallel corpus for fairseq, and evaluate a model on it.

Prepare: raw text (downloaded, or found in ``--from``: a folder or an archive) -> sacremoses' Moses
tokenisation -> clean-corpus-n cleaning -> joint subword-nmt BPE -> ``fairseq-preprocess``; each
corpus is data (a :class:`Corpus` in :data:`CORPORA`), your own parallel text too (``text``). Evaluate:
``fairseq-generate`` -> sacremoses detokenisation -> sacreBLEU against the raw reference, and tokenised
BLEU (as multi-bleu.perl). Outputs and commands: examples/data/README.md.
"""

import argparse
import contextlib
import functools
import gzip
import io
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import urllib.request
import zipfile
from dataclasses import dataclass
from multiprocessing import Pool

from fusion_fairseq.cli import user_dir
from fusion_lab.analysis import checked, finite
from fusion_lab.common import (claim_out_dir, make_own_folder, positive_int, python_module_command, replace_atomically,
                               write_file)

SPLITS = ("train", "valid", "test")


@dataclass(frozen=True)
class Corpus:
    """A corpus as data. File names may hold ``{lang}``, ``{src}``, ``{tgt}``, ``{test}``; ``a|b`` are
    alternative names of one file. ``valid``: its files, or N (every N-th cleaned training pair)."""

    langs: tuple  # the first two are the default --src and --tgt; none: any, --src and --tgt required
    dest: str
    urls: tuple  # none: local only, --from required
    train: tuple  # concatenated
    tests: dict  # --test-set NAME -> its files, concatenated; the first is the default
    valid: "int | tuple"
    merges: int
    lowercase: bool
    steps: tuple = ()  # sacremoses steps before tokenising: normalize, non_printing; aggressive: -a
    train_steps: tuple = ()  # steps of the training text only (valid held out from it included)
    clean: tuple = ("none", 0, 0.0)  # when (tok / bpe), max tokens, max ratio
    compound_split: bool = False


WMT16 = "http://data.statmt.org/wmt16/translation-task/"
#: Multi30k's files at one commit of the dataset's repository (as examples/comparison/multi30k.sh downloads).
MULTI30K = "https://raw.githubusercontent.com/multi30k/dataset/a3d2e0d26b56f3846f66a952536ffed4e401d05a/"


def wmt16_sgm(name):
    """One side of a WMT16 SGML dev/test set: this direction's file first (enro for en->ro)."""
    return "|".join(f"{name}-{pair}-{side}.{{lang}}.sgm" for pair in ("{src}{tgt}", "{tgt}{src}")
                    for side in ("src", "ref"))


CORPORA = {
    "multi30k": Corpus(
        langs=("de", "en", "fr", "cs"), dest="multi30k.tokenized.{src}-{tgt}",
        urls=tuple(f"{MULTI30K}data/task1/raw/{s}.{{lang}}.gz" for s in ("train", "val", "{test}")),
        train=("train.{lang}|train.{lang}.gz",), valid=("val.{lang}|val.{lang}.gz",),
        tests={t: (f"{t}.{{lang}}|{t}.{{lang}}.gz",) for t in
               ("test_2016_flickr", "test_2017_flickr", "test_2017_mscoco", "test_2018_flickr")},
        merges=10000, lowercase=True, steps=("normalize",)),
    "iwslt14": Corpus(
        langs=("de", "en"), dest="iwslt14.tokenized.{src}-{tgt}",
        urls=("https://dl.fbaipublicfiles.com/fairseq/data/iwslt14/de-en.tgz",),
        train=("train.tags.de-en.{lang}",), valid=23, merges=10000, lowercase=True, clean=("tok", 175, 1.5),
        tests={name: tuple(f"IWSLT14.{t}.de-en.{{lang}}.xml" for t in sets) for name, sets in (
            ("fairseq", ("TED.dev2010", "TEDX.dev2012", "TED.tst2010", "TED.tst2011", "TED.tst2012")),
            ("he2018", ("TED.dev2010", "TED.tst2010", "TED.tst2011", "TED.tst2012")))}),
    "wmt14-en-de": Corpus(
        langs=("en", "de"), dest="wmt14_{src}_{tgt}",
        urls=("http://statmt.org/wmt13/training-parallel-europarl-v7.tgz",
              "http://statmt.org/wmt13/training-parallel-commoncrawl.tgz",
              "http://statmt.org/wmt14/training-parallel-nc-v9.tgz",  # WMT14's News Commentary (fairseq: --icml17)
              "http://statmt.org/wmt14/test-full.tgz"),
        train=("europarl-v7.de-en.{lang}", "commoncrawl.de-en.{lang}", "news-commentary-v9.de-en.{lang}"),
        valid=100, tests={"newstest2014": ("newstest2014-deen-src.{lang}.sgm|newstest2014-deen-ref.{lang}.sgm",)},
        merges=40000, lowercase=False, steps=("aggressive",), train_steps=("normalize", "non_printing"),
        clean=("bpe", 250, 1.5), compound_split=True),  # fairseq's script normalises no test text
    "wmt16-en-ro": Corpus(
        langs=("en", "ro"), dest="wmt16_{src}_{tgt}",
        urls=(WMT16 + "training-parallel-ep-v8.tgz", "https://object.pouta.csc.fi/OPUS-SETIMES/v2/moses/en-ro.txt.zip",
              WMT16 + "dev.tgz", WMT16 + "test.tgz"),
        train=("europarl-v8.ro-en.{lang}|europarl-v8.en-ro.{lang}",
               "SETIMES.en-ro.{lang}|SETIMES2.en-ro.{lang}|SETIMES2.ro-en.{lang}"),
        valid=(wmt16_sgm("newsdev2016"),), tests={"newstest2016": (wmt16_sgm("newstest2016"),)},
        merges=32000, lowercase=False, steps=("normalize", "non_printing", "aggressive", "romanian"),
        clean=("bpe", 250, 1.5)),
    "text": Corpus(  # your own: --from DIR holding train, valid and test .SRC and .TGT files of raw text
        langs=(), dest="text.{src}-{tgt}", urls=(), train=("train.{lang}",), valid=("valid.{lang}",),
        tests={"test": ("test.{lang}",)}, merges=8000, lowercase=False),
}


def log(message):
    print(f"[corpus] {message}", file=sys.stderr, flush=True)


class Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, no usage block
        self.exit(2, f"{self.prog}: error: {message}\n")


usage_error = Parser(prog="corpus").error  # a bad flag or value: one line, exit status 2, before any work


def write_lines(path, lines):
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    write_file(path, "".join(line + "\n" for line in lines))


def read_lines(path):
    """The lines of a text file, gzip-compressed when its name ends in .gz."""
    with (gzip.open if path.endswith(".gz") else open)(path, "rt", encoding="utf-8", errors="replace",
                                                        newline="\n") as f:
        return [line.rstrip("\n") for line in f]


def write_splits(text, directory, langs):
    for split in text:
        for lang in langs:
            write_lines(os.path.join(directory, f"{split}.{lang}"), text[split][lang])


def run_fairseq(tool, args, log_path=None, env=None, on_line=None):
    """``fairseq-TOOL ARGS`` (``python -m fairseq_cli.TOOL``: this interpreter's fairseq), its output after the
    command line in ``log_path``, each line handed to ``on_line``; the CPU seconds it used (its own, also when
    several run at once). A failure is an error naming the tool and ending with the output's last lines."""
    command, ended = [*python_module_command(f"fairseq_cli.{tool}"), *map(str, args)], {}

    def run(log_file):
        tail = ""
        log_file.write(("$ " + " ".join(command) + "\n").encode())
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1,
                                   env=env or {**os.environ, "PYTHONWARNINGS": "ignore"})
        for line in process.stdout:
            log_file.write(line.encode())
            log_file.flush()
            tail = (tail + line)[-4000:]
            if on_line is not None:
                on_line(line.rstrip("\n"))
        process.stdout.close()
        _, status, usage = os.wait4(process.pid, 0)
        ended.update(code=os.waitstatus_to_exitcode(status), tail=tail, cpu=usage.ru_utime + usage.ru_stime)

    # the log appears under its name when the tool ends (also when it fails or is interrupted)
    replace_atomically(log_path, run, keep_partial=True) if log_path else run(io.BytesIO())
    if ended["code"]:
        where = f"; log {log_path}" if log_path else ""
        raise SystemExit(f"error: fairseq-{tool} failed (exit {ended['code']}){where}:\n{ended['tail'].rstrip()}")
    return ended["cpu"]


def download(url, directory, timeout):
    """``url`` into ``directory`` unless it is there already (a failed download leaves nothing)."""
    path = os.path.join(directory, url.rsplit("/", 1)[-1])
    if os.path.isfile(path) and not os.path.islink(path) and os.path.getsize(path):
        return log(f"using the already downloaded {path}")
    os.makedirs(directory, exist_ok=True)
    log(f"downloading {url}")
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            replace_atomically(path, lambda f: shutil.copyfileobj(response, f))
    except (OSError, ValueError) as error:
        raise SystemExit(f"corpus: error: download of {url} failed ({error}; offline, or the server moved?): download "
                         "it on a machine with internet access and run again with --from PATH (a folder holding the "
                         "files or archives, or the archive itself)") from None


def extract(archive, destination):
    """Unpack a .tgz/.tar/.zip into ``destination``; no member leaves it (zipfile drops '..' and a leading '/')."""
    if zipfile.is_zipfile(archive):
        with zipfile.ZipFile(archive) as z:
            return z.extractall(destination)
    if not tarfile.is_tarfile(archive):
        raise SystemExit(f"corpus: error: --from: cannot unpack '{archive}' (expected a .tgz/.tar.gz/.tar/.zip)")
    with tarfile.open(archive) as t:
        t.extractall(destination, filter="data")


@functools.lru_cache(maxsize=None)  # once per link: every file a recipe looks for walks the tree again
def warn_link_skipped(path, root):
    log(f"warning: {path} is a link, not followed: walks stay inside {root}")


def files_below(root):
    """(folder, sorted file names) for every folder under ``root``, in sorted order. ``root`` may itself be a link
    (the user named it); a link below it, to a file or a folder, is skipped with a warning: following one would
    read outside the tree, or walk back into it without end (two links up made the walk grow without bound)."""
    for directory, folders, files in sorted(os.walk(root)):  # followlinks=False: a link to a folder is not entered
        for name in sorted(folders + files):
            if os.path.islink(os.path.join(directory, name)):
                warn_link_skipped(os.path.join(directory, name), root)
        yield directory, sorted(name for name in files if not os.path.islink(os.path.join(directory, name)))


def find(names, root, work):
    """The first of ``names`` (``a|b``) under ``root``, else in its archives (which the first miss unpacks)."""
    unpacked = os.path.join(work, "unpacked")
    for folder in (root, unpacked):
        for name in names.split("|"):
            for directory, files in files_below(folder):
                if name in files:
                    return os.path.join(directory, name)
        if not os.path.isdir(unpacked):
            os.makedirs(unpacked)
            for entry in next(files_below(root), (root, []))[1]:
                if entry.endswith((".tgz", ".tar.gz", ".tar", ".zip")):
                    extract(os.path.join(root, entry), os.path.join(unpacked, entry + ".d"))
    raise SystemExit(f"corpus: error: cannot find {names.replace('|', ' or ')} under {root}")


def read_raw_file(path):
    """The text of a corpus file: plain or .gz lines; the <seg> text of XML/SGML (’ -> ', as fairseq's
    prepare-iwslt14.sh); IWSLT's train.tags without <url>/<talkid>/<keywords> lines and <title>/<description> tags."""
    lines = [line.replace("\r", "") for line in read_lines(path)]
    replaced = sum("\ufffd" in line for line in lines)
    if replaced:  # read_lines replaces bytes that are not UTF-8
        log(f"warning: {path}: {replaced:,} lines have bytes that are not UTF-8, read as U+FFFD")
    if path.endswith((".xml", ".sgm")):
        return [re.sub(r'<seg id="[0-9]*">\s*|\s*</seg>\s*', "", x).replace("\u2019", "'")
                for x in lines if "<seg id" in x]
    if os.path.basename(path).startswith("train.tags"):
        return [re.sub(r"</?(title|description)>", "", x) for x in lines
                if not any(tag in x for tag in ("<url>", "<talkid>", "<keywords>"))]
    return lines


def read_raw(corpus, args, work):
    """{split: {lang: raw lines}} of the corpus (no valid when it is held out from train), from --from (a
    folder, or an archive unpacked into ``work``) or from its downloads (kept in DEST/orig)."""
    root = args.from_
    if args.from_ and os.path.isfile(args.from_):
        root = os.path.join(work, "from")
        extract(args.from_, root)
    elif not args.from_:
        root = os.path.join(args.dest, "orig")
        for pattern in corpus.urls:
            for lang in (args.src, args.tgt) if "{lang}" in pattern else (None,):
                url = pattern.format(lang=lang, test=args.test_set)
                download(f"{args.mirror.rstrip('/')}/{url.rsplit('/', 1)[-1]}" if args.mirror else url, root,
                         args.timeout)
    splits = {"train": corpus.train, "test": corpus.tests[args.test_set]}
    if not isinstance(corpus.valid, int):
        splits["valid"] = corpus.valid
    text, langs = {}, (args.src, args.tgt)
    for split, patterns in splits.items():
        files = {lang: [find(p.format(lang=lang, src=args.src, tgt=args.tgt, test=args.test_set), root, work)
                        for p in patterns] for lang in langs}
        text[split] = {lang: [line for path in files[lang] for line in read_raw_file(path)] for lang in langs}
        sizes = [len(text[split][lang]) for lang in langs]
        if sizes[0] != sizes[1] or not sizes[0]:
            raise SystemExit(f"corpus: error: the {split} split has {sizes[0]} lines in {' + '.join(files[args.src])} "
                             f"and {sizes[1]} in {' + '.join(files[args.tgt])} (expected pairs of lines, at least one)")
    return text


RO_COMMA_BELOW = str.maketrans("\u015e\u015f\u0162\u0163", "\u0218\u0219\u021a\u021b")
RO_STRIP = str.maketrans("\u0218\u0219\u021a\u021b\u015e\u015f\u0162\u0163\u0102\u0103\u00c2\u00e2\u00ce\u00ee",
                         "SsTtSsTtAaAaIi")


class Tokeniser:
    """Moses' normalize-punctuation, remove-non-printing-char and tokenizer.perl (XML-escaping), by sacremoses."""

    def __init__(self, lang, steps, lowercase):
        import regex
        from sacremoses import MosesPunctNormalizer, MosesTokenizer

        non_printing = regex.compile(r"\p{C}")
        known = {"normalize": MosesPunctNormalizer(lang=lang, perl_parity=True).normalize,
                 "romanian": lambda line: line.translate(RO_COMMA_BELOW),
                 "no_diacritics": lambda line: line.translate(RO_STRIP),
                 "non_printing": lambda line: non_printing.sub(" ", line)}
        # in this order; the Romanian letters (and diacritics) are changed on the Romanian side only
        self.steps = [known[name] for name in known
                      if name in steps and (lang == "ro" or name not in ("romanian", "no_diacritics"))]
        self.tokenizer, self.aggressive, self.lowercase = MosesTokenizer(lang=lang), "aggressive" in steps, lowercase

    def __call__(self, line):
        for step in self.steps:
            line = step(line)
        line = self.tokenizer.tokenize(line, aggressive_dash_splits=self.aggressive, escape=True, return_str=True)
        return line.lower() if self.lowercase else line


class Segmenter:
    """subword-nmt's apply-bpe (lines stripped first); codes without merges leave the text as it is."""

    def __init__(self, codes):
        from subword_nmt.apply_bpe import BPE

        with open(codes, encoding="utf-8") as f:
            self.bpe = BPE(f) if len(f.readlines()) > 1 else None

    def __call__(self, line):
        return self.bpe.process_line(line.strip()) if self.bpe else line.strip()


def _start(factory, args):
    global _worker
    _worker = factory(*args)


def _run(line):
    return _worker(line)


def parallel_map(factory, args, lines, workers):
    """``factory(*args)`` applied to every line, in chunks of 2000 lines over ``workers`` processes."""
    if workers <= 1 or len(lines) <= 2000:
        return list(map(factory(*args), lines))
    with Pool(workers, initializer=_start, initargs=(factory, args)) as pool:
        return pool.map(_run, lines, chunksize=2000)


def clean(columns, max_len, ratio, min_len=1, max_word_length=1000):
    """Moses' clean-corpus-n.perl on the first two columns (source, target): '|' removed, spaces
    squeezed, pairs dropped with an empty side, a side outside min_len..max_len words, a length ratio
    above ``ratio`` or a word longer than ``max_word_length``. Other columns follow the same choice."""
    kept = [[] for _ in columns]
    for row in zip(*columns):
        src, tgt = (" ".join(side.replace("|", "").split()) for side in row[:2])
        ns, nt = len(src.split()), len(tgt.split())
        if not (min_len <= ns <= max_len and min_len <= nt <= max_len) or max(ns / nt, nt / ns) > ratio:
            continue
        if max(len(w) for w in (src + " " + tgt).split()) > max_word_length:
            continue
        for column, value in zip(kept, (src, tgt, *row[2:])):
            column.append(value)
    return kept


def keep_pairs(text, splits, kinds, langs, max_len, ratio):
    """:func:`clean` on ``text[kinds[0]]``'s pairs of ``splits``, the other kinds kept in step."""
    for split in splits:
        columns = clean([text[kind][split][lang] for kind in kinds for lang in langs], max_len, ratio)
        for i, kind in enumerate(kinds):
            text[kind][split] = dict(zip(langs, columns[2 * i:2 * i + 2]))


def learn_and_apply_bpe(text, src, tgt, merges, codes, workers=1):
    """Joint BPE ``codes`` learnt by subword-nmt on ``text['train']``, applied to every split of ``text``."""
    from subword_nmt.learn_bpe import learn_bpe

    joint = [line + "\n" for lang in (src, tgt) for line in text["train"][lang]]
    learnt = io.StringIO()
    if any(len(word) > 1 for line in joint for word in line.split()):
        with contextlib.redirect_stderr(io.StringIO()):  # no progress bar
            learn_bpe(joint, learnt, merges, min_frequency=2)
    else:  # nothing to merge (subword-nmt fails on max() of no pairs)
        learnt.write("#version: 0.2\n")
    write_file(codes, learnt.getvalue())
    return {split: {lang: parallel_map(Segmenter, (codes,), text[split][lang], workers) for lang in (src, tgt)}
            for split in text}


def binarise(text_dir, databin, src, tgt, workers=1, joined=True, log_path=None, dictionaries=None, splits=SPLITS):
    """``fairseq-preprocess`` of ``text_dir/SPLIT.{src,tgt}``; its earlier outputs in ``databin`` are
    removed first (it refuses existing dictionaries, and would write through links), the files its workers
    2..N write and merge (``SPLIT.SRC-TGT.LANG.ptK.bin``) among them."""
    make_own_folder(databin)
    parts = [""] + [f".pt{worker}" for worker in range(1, int(workers))]
    for name in [f"dict.{src}.txt", f"dict.{tgt}.txt", "preprocess.log"] + [
            f"{s}.{src}-{tgt}.{lang}{part}.{ext}" for s in splits for lang in (src, tgt) for part in parts
            for ext in ("bin", "idx")]:
        with contextlib.suppress(FileNotFoundError):
            os.remove(os.path.join(databin, name))
    dictionary = ["--srcdict", dictionaries[0], "--tgtdict", dictionaries[1]] if dictionaries else \
        ["--joined-dictionary"] if joined else []
    run_fairseq("preprocess", ["--source-lang", src, "--target-lang", tgt, *dictionary, "--destdir", databin,
                               *[x for s in splits for x in (f"--{s}pref", os.path.join(text_dir, s))],
                               "--workers", workers], log_path)


def check_lengths(bpe, most=1023):
    """Refused before anything is written: a line of more subwords than fairseq's models take (``most``: its
    default --max-source/target-positions, 1024, less </s>); fairseq-generate would stop on such a test
    sentence after all the training, fairseq-train skips such pairs."""
    for split, sides in bpe.items():
        for lang, lines in sides.items():
            for number, line in enumerate(lines, 1):
                if len(line.split()) > most:
                    raise SystemExit(f"corpus: error: line {number} of the {split} split ({lang}) has "
                                     f"{len(line.split()):,} subword tokens after BPE; fairseq's models take at most "
                                     f"{most} (shorten or remove that line)")


def check_outputs(args):
    """Before any work: --from must not be --dest (or hold it), and what the recipe writes must not
    exist yet unless --force; outputs that are links are removed then (their targets stay)."""
    if args.from_ and not os.path.exists(args.from_):
        usage_error(f"--from: '{args.from_}' does not exist")
    if args.from_ and os.path.isdir(args.from_):
        source = os.path.realpath(args.from_)
        for sub in ("", "raw", "tok"):
            if os.path.realpath(os.path.join(args.dest, sub)) == source:
                usage_error(f"--from '{args.from_}' is --dest{' ' + sub if sub else ''} "
                            f"('{os.path.join(args.dest, sub)}'): the recipe writes its outputs there and would "
                            "replace the raw text it reads; give another --dest")
        if (os.path.realpath(args.dest) + os.sep).startswith(source + os.sep):
            usage_error(f"--dest '{args.dest}' is inside --from '{args.from_}': the recipe searches --from for its raw "
                        "files and would find the ones it writes; give a --dest outside it")
    outputs = ["raw", "tok", "code"] + [f"{s}.{lang}" for lang in (args.src, args.tgt) for s in SPLITS]
    found = [path for path in (os.path.join(args.dest, name) for name in sorted(outputs)) if os.path.lexists(path)]
    if os.path.islink(args.databin) or (os.path.isdir(args.databin) and os.listdir(args.databin)):
        found.append(f"{args.databin} ({'a link' if os.path.islink(args.databin) else 'not empty'})")
    if found and not args.force:
        usage_error(f"--dest '{args.dest}' already holds what this recipe writes: {' '.join(found)}; pass --force to "
                    "replace them, or give another --dest/--databin")
    claim_out_dir(args.dest, [*outputs, "data-bin", "orig"], PREPARE_STAMP, args.force, "corpus prepare", usage_error,
                  flag="--dest")  # links among the outputs removed: never written through
    if os.path.islink(args.databin):  # another corpus's data-bin, say: replaced by a folder of its own
        os.remove(args.databin)


def tokenising_steps(corpus, split, remove_diacritics=False):
    """The :class:`Tokeniser` steps of ``split``: the corpus's, its training text's own on train."""
    return (corpus.steps + (corpus.train_steps if split == "train" else ())
            + (("no_diacritics",) if remove_diacritics else ()))


def prepare(corpus, args):
    langs = (src, tgt) = (args.src, args.tgt)
    with tempfile.TemporaryDirectory(prefix=".work.", dir=args.dest) as work:
        raw = read_raw(corpus, args, work)
    steps = {split: tokenising_steps(corpus, split, args.remove_diacritics) for split in raw}
    log(f"tokenising (sacremoses; {', '.join(steps['train']) or 'plain'}; lowercase={int(args.lowercase)})")
    text = {"raw": raw, "tok": {split: {lang: parallel_map(Tokeniser, (lang, steps[split], args.lowercase),
                                                           raw[split][lang], args.workers) for lang in langs}
                                for split in raw}}
    stage, max_len, ratio = corpus.clean
    max_len = args.max_len or max_len
    if stage == "tok":
        keep_pairs(text, ["train"], ("tok", "raw"), langs, max_len, ratio)
    every = args.valid_every or corpus.valid
    for kind in text.values() if isinstance(corpus.valid, int) else ():  # valid = every N-th pair, train the rest
        kind["valid"] = {lang: kind["train"][lang][every - 1::every] for lang in langs}
        kind["train"] = {lang: [x for i, x in enumerate(kind["train"][lang], 1) if i % every] for lang in langs}
    log(f"learning {args.bpe_merges} joint BPE merges (subword-nmt) on train.{{{src},{tgt}}} and applying them")
    codes = os.path.join(args.dest, "code")
    text["bpe"] = learn_and_apply_bpe(text["tok"], src, tgt, args.bpe_merges, codes, args.workers)
    held_out = ["train", "valid"] if isinstance(corpus.valid, int) else ["train"]
    for limits in ([(max_len, ratio)] if stage == "bpe" else []) + (
            [(args.max_subwords, math.inf)] if args.max_subwords else []):
        keep_pairs(text, held_out, ("bpe", "tok", "raw"), langs, *limits)
    check_lengths(text["bpe"])
    for kind, directory in (("raw", "raw"), ("tok", "tok"), ("bpe", "")):
        write_splits(text[kind], os.path.join(args.dest, directory), langs)
    log(f"binarising with fairseq-preprocess into {args.databin}")
    binarise(args.dest, args.databin, src, tgt, args.workers, args.joined)
    refs = [f"{kind.upper()}_REF_{split}={os.path.abspath(os.path.join(args.dest, kind, f'{split}.{tgt}'))}"
            for split in ("valid", "test") for kind in ("raw", "tok")]
    write_lines(os.path.join(args.databin, "recipe.env"), [
        "# written by fusion_lab.corpus prepare; read by its evaluate", f"RECIPE={args.corpus}", f"SRC={src}",
        f"TGT={tgt}", f"LOWERCASE={int(args.lowercase)}", "BPE=subword_nmt", f"BPE_MERGES={args.bpe_merges}",
        f"COMPOUND_SPLIT={int(corpus.compound_split and tgt == 'de')}", f"TEST_SET={args.test_set}", *refs])
    log("sentence pairs: " + ", ".join(f"{split} {len(text['bpe'][split][src]):,}" for split in SPLITS))
    print(f"Binarised data ({src} -> {tgt}) is in: {os.path.abspath(args.databin)}")
    print(f"BPE'd text and codes are in: {os.path.abspath(args.dest)}")


LANGUAGE, SWITCH = (r"[A-Za-z][A-Za-z0-9_-]*", "a language code such as de"), ("[01]", "0 or 1")
RECIPE_VALUES = {"SRC": LANGUAGE, "TGT": LANGUAGE, "LOWERCASE": SWITCH, "COMPOUND_SPLIT": SWITCH}


def read_recipe_env(data_bin):
    """``data_bin/recipe.env`` as data (KEY=VALUE lines; CRLF endings allowed; never executed): {} when
    there is none; a value that does not fit its key is refused naming the file."""
    path = os.path.join(data_bin, "recipe.env")
    if not os.path.isfile(path):
        return {}
    values = {}
    for line in read_lines(path):
        key, _, value = line.rstrip("\r").partition("=")
        if key and not key.startswith("#") and _ and key not in values:
            pattern, allowed = RECIPE_VALUES.get(key, (".*", ""))
            if not re.fullmatch(pattern, value):
                raise SystemExit(f"corpus: error: {path}: {key} '{value}' is not allowed (allowed: {allowed})")
            values[key] = value
    return values


def hypotheses(generate_output, expect=None):
    """The BPE-free hypotheses (H-) and targets (T-) of fairseq-generate's output, in sentence order."""
    found = {"H": {}, "T": {}}
    for line in read_lines(generate_output):
        match = re.match(r"([HT])-(\d+)\t", line)
        if match:  # H-id, score, text; T-id, text (the first hypothesis when there are several)
            kind, fields = match.group(1), line.split("\t")[1:] + [""]
            found[kind].setdefault(int(match.group(2)), fields[1] if kind == "H" else fields[0])
    ids = sorted(found["H"])
    if not ids:
        raise SystemExit(f"corpus: error: {generate_output}: no hypotheses (H-* lines); did fairseq-generate fail?")
    if expect is not None and len(ids) != expect:
        raise SystemExit(f"corpus: error: {generate_output}: {len(ids)} hypotheses for {expect} reference lines: "
                         "fairseq-generate skipped sentences, or the reference is not that of this subset")
    if ids != list(range(len(ids))):
        raise SystemExit(f"corpus: error: {generate_output}: the hypotheses' sentence ids are not 0..{len(ids) - 1}")
    unbpe = lambda text: re.sub(r"(@@ )|(@@ ?$)", "", text)
    return [unbpe(found["H"][i]) for i in ids], [unbpe(found["T"].get(i, "")) for i in ids]


def bleu_scores(hyp_detok, ref, hyp_tok, tok_ref, lowercase=False, compound_split=False):
    """sacreBLEU of detokenised hypotheses against the raw reference, and tokenised BLEU, printed: (report, scores)."""
    from sacrebleu.metrics import BLEU

    hyp, refs, hyp_t, refs_t = (read_lines(path) for path in (hyp_detok, ref, hyp_tok, tok_ref))
    for hyps, references, path in ((hyp, refs, ref), (hyp_t, refs_t, tok_ref)):
        if len(hyps) != len(references):
            raise SystemExit(f"corpus: error: {len(hyps)} hypotheses but {len(references)} lines in the reference "
                             f"{path}: is it the reference of this subset (and untouched by cleaning)?")
    if compound_split:  # fairseq's get_compound_split_bleu.sh
        hyp_t, refs_t = ([re.sub(r"(\S)-(\S)", r"\1 ##AT##-##AT## \2", x) for x in side] for side in (hyp_t, refs_t))
    case = "case-insensitive" if lowercase else "case-sensitive"
    detok, tok = BLEU(lowercase=lowercase), BLEU(tokenize="none", lowercase=lowercase, force=True)
    detok_score, tok_score = detok.corpus_score(hyp, [refs]), tok.corpus_score(hyp_t, [refs_t])
    how = "sacrebleu --tokenize none on Moses-tokenized text, as multi-bleu.perl"
    how += ", compound-split" if compound_split else ""
    report = (f"sacreBLEU (detokenized, {case}) vs {ref}: {detok_score}\nsacreBLEU signature: {detok.get_signature()}\n"
              f"Tokenized BLEU ({case}; {how}) vs {tok_ref}: {tok_score}")
    scores = {"sacrebleu": round(detok_score.score, 2), "sacrebleu_signature": str(detok.get_signature()),
              "sacrebleu_full": str(detok_score), "tokenized_bleu": round(tok_score.score, 2),
              "tokenized_bleu_full": str(tok_score), "tokenized_bleu_signature": str(tok.get_signature()),
              "case_insensitive": lowercase, "compound_split": compound_split, "reference": os.path.abspath(ref),
              "tokenized_reference": os.path.abspath(tok_ref), "sentences": len(hyp)}
    print(report)
    return report, scores


EVAL_OUTPUTS = ("generate-{subset}.txt", "generate-{subset}.log", "hyp.tok", "hyp.detok", "ref.fairseq.tok", "bleu.txt",
                "scores.json")
EVAL_STAMP, PREPARE_STAMP = "fusion-fairseq corpus evaluate", "fusion-fairseq corpus prepare"


def evaluate(args):
    data, subset = args.data_bin, args.gen_subset
    if not os.path.isdir(data):
        usage_error(f"DATA_BIN: '{data}' is not a directory")
    if not os.path.isfile(args.checkpoint):
        usage_error(f"CHECKPOINT: '{args.checkpoint}' does not exist")
    recipe = read_recipe_env(data)
    src, tgt = args.src or recipe.get("SRC"), args.tgt or recipe.get("TGT")
    if not (src and tgt):
        pairs = sorted({name.split(".")[1] for name in os.listdir(data)
                        if re.fullmatch(rf"{re.escape(subset)}\.[^.]+-[^.]+\..+\.idx", name)})
        if len(pairs) != 1:
            usage_error(f"--gen-subset: no binarised '{subset}' data in {data}" if not pairs else
                        f"several language pairs in {data} ({' '.join(pairs)}); pass --src and --tgt")
        src, tgt = src or pairs[0].split("-")[0], tgt or pairs[0].split("-")[1]
    if not os.path.isfile(os.path.join(data, f"{subset}.{src}-{tgt}.{src}.idx")):
        usage_error(f"--gen-subset: no binarised '{subset}' data for {src}-{tgt} in {data}")
    ref, tok_ref = args.ref or recipe.get(f"RAW_REF_{subset}"), args.tok_ref or recipe.get(f"TOK_REF_{subset}")
    for flag, path in (("--ref", ref), ("--tok-ref", tok_ref)):
        if path and not os.path.isfile(path):
            usage_error(f"{flag}: '{path}' does not exist")
    if not ref:
        usage_error(f"--ref is required: the raw (untokenised) {tgt} reference of '{subset}'")
    lowercase = recipe.get("LOWERCASE", "0") == "1" if args.lowercase is None else args.lowercase
    compound = recipe.get("COMPOUND_SPLIT", "0") == "1" if args.compound_split is None else args.compound_split
    require_dictionaries_of(args.checkpoint, data, src, tgt)
    out = args.out or os.path.join(os.path.dirname(args.checkpoint), f"eval-{subset}-beam{args.beam}")
    claim_out_dir(out, [name.format(subset=subset) for name in EVAL_OUTPUTS], EVAL_STAMP, args.force, "corpus evaluate",
                  usage_error)
    generated = os.path.join(out, f"generate-{subset}.txt")  # fairseq-generate's name in --results-path
    generate_log = os.path.join(out, f"generate-{subset}.log")
    log(f"fairseq-generate {subset} ({src} -> {tgt}), beam {args.beam} -> {generated}")
    try:
        run_generate(args, data, subset, src, tgt, out, generate_log)
    except SystemExit as failed:  # its report ends with the output's last 4000 characters: the error line only
        raise SystemExit(f"{str(failed).splitlines()[0]} {error_line(generate_log)}") from None
    score(generated, out, tgt, ref, tok_ref, lowercase, compound)


def run_generate(args, data, subset, src, tgt, out, log_path):
    run_fairseq("generate", [
        data, "--path", args.checkpoint, "--gen-subset", subset, "--source-lang", src, "--target-lang", tgt,
        "--beam", args.beam, "--lenpen", args.lenpen, "--remove-bpe", "@@ ", "--results-path", out,
        # fairseq's batch_by_size drops a last batch that is not a multiple of this (default 8)
        "--required-batch-size-multiple", "1",
        *(["--max-tokens", args.max_tokens] if args.max_tokens else ["--batch-size", args.batch_size]),
        # the plugin lets torch >= 2.6's safe loader read fairseq's checkpoints
        *([] if args.no_user_dir else ["--user-dir", args.user_dir or user_dir()]), *args.extra], log_path)


# a logging record (fairseq's format, or Python's before logging is configured), not the error
LOG_RECORD = re.compile(r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d \| )?(DEBUG|INFO|WARNING)\b")


def error_line(log_path):
    """What a failed tool said last: the last line of its output that is neither indented (a traceback's frames,
    a message's continuation) nor a logging record: Python's ``Type: message``, argparse's ``prog: error: ...``."""
    lines = [line for line in read_lines(log_path)[1:] if line.strip() and not line[0].isspace()
             and not LOG_RECORD.match(line)]  # the first line is the command
    return lines[-1] if lines else "it printed nothing"


def require_dictionaries_of(checkpoint, data, src, tgt):
    """A model has an embedding row per type of the dictionaries it was trained with; DATA_BIN's dictionaries of
    another size fail fairseq-generate's strict load, named here in one line with the dictionary file."""
    from fairseq.data import Dictionary

    from fusion_fairseq.checkpoint_safety import CheckpointContentError, read_checkpoint_state

    try:
        weights = read_checkpoint_state(checkpoint)["model"]
    except CheckpointContentError as error:  # it names the file
        usage_error(f"CHECKPOINT {error}")
    for name, lang in (("encoder.embed_tokens.weight", src), ("decoder.embed_tokens.weight", tgt),
                       ("decoder.output_projection.weight", tgt)):
        dictionary = os.path.join(data, f"dict.{lang}.txt")
        if name not in weights or not os.path.isfile(dictionary):
            continue
        rows, types = len(weights[name]), len(Dictionary.load(dictionary))
        if rows != types:
            usage_error(f"CHECKPOINT {checkpoint}: parameter {name} has {rows} rows, one per type of the dictionary "
                        f"it was trained with, but {dictionary} has {types} types: the checkpoint was trained on "
                        "another dictionary; evaluate it on the DATA_BIN it was trained with")


def score(generated, out, tgt, ref, tok_ref=None, lowercase=False, compound_split=False):
    """hyp.tok, ref.fairseq.tok, hyp.detok, bleu.txt and scores.json in ``out`` from fairseq-generate's output."""
    from sacremoses import MosesDetokenizer

    hyps, targets = hypotheses(generated, expect=len(read_lines(ref)))
    detokenizer = MosesDetokenizer(lang=tgt)
    path = {name: os.path.join(out, name) for name in ("hyp.tok", "ref.fairseq.tok", "hyp.detok")}
    for name, text in zip(path, (hyps, targets, [detokenizer.detokenize(h.split(), unescape=True) for h in hyps])):
        write_lines(path[name], text)
    if not tok_ref:
        log("no tokenised reference given or recorded: tokenised BLEU uses fairseq's T- lines (may contain <unk>)")
    report, scores = bleu_scores(path["hyp.detok"], ref, path["hyp.tok"], tok_ref or path["ref.fairseq.tok"],
                                 lowercase, compound_split)
    write_lines(os.path.join(out, "bleu.txt"), [report])
    write_lines(os.path.join(out, "scores.json"), [json.dumps(scores, indent=2)])
    return scores


def build_parser():
    p = Parser(prog="corpus", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser("prepare", help="download (or read --from), tokenise, clean, BPE and binarise a corpus")
    s.add_argument("corpus", choices=list(CORPORA))
    s.add_argument("--from", dest="from_", help="a folder holding the corpus files or archives, or an archive "
                   "(text: required, with train, valid and test .SRC and .TGT files)")
    s.add_argument("--dest", help="output folder (default: e.g. multi30k.tokenized.de-en)")
    s.add_argument("--databin", help="binarised output (default: DEST/data-bin)")
    for flag, text in (("--src", "source language (default: the corpus's)"), ("--tgt", "target language")):
        s.add_argument(flag, type=checked(flag, str, re.compile(LANGUAGE[0]).fullmatch, LANGUAGE[1]), help=text)
    s.add_argument("--test-set", help="which test set (default: the corpus's standard one)")
    s.add_argument("--bpe-merges", type=positive_int, help="joint BPE merges (default: the corpus's)")
    s.add_argument("--lowercase", action=argparse.BooleanOptionalAction, help="lowercase (default: the corpus's)")
    s.add_argument("--joined-dictionary", dest="joined", action=argparse.BooleanOptionalAction, default=True)
    s.add_argument("--valid-every", type=checked("--valid-every", int, lambda n: n >= 2, "an integer >= 2"),
                   help="valid = every N-th cleaned training pair (iwslt14, wmt14)")
    s.add_argument("--max-len", type=positive_int, help="cleaning: most tokens a side (default: the corpus's)")
    s.add_argument("--max-subwords", type=positive_int, help="after BPE, drop train/valid pairs with a longer side")
    s.add_argument("--remove-diacritics", action="store_true", help="Romanian source: ă â î ș ț -> a a i s t")
    s.add_argument("--workers", type=positive_int, default=min(os.cpu_count() or 1, 8))
    s.add_argument("--mirror", help="download every file from MIRROR/FILE-NAME instead")
    s.add_argument("--timeout", type=positive_int, default=20, help="seconds a download may wait for the server")
    s.add_argument("--force", action="store_true", help="replace the outputs of an earlier run")
    e = sub.add_parser("evaluate", help="fairseq-generate a binarised subset and score it (sacreBLEU, tokenised BLEU)")
    e.add_argument("data_bin")
    e.add_argument("checkpoint")
    subset_name = re.compile(r"[A-Za-z0-9_.-]+").fullmatch  # a file name part of fairseq's binarised data
    e.add_argument("--gen-subset", default="test", type=checked("--gen-subset", str, subset_name, "a subset name"))
    e.add_argument("--beam", type=positive_int, default=5)
    e.add_argument("--lenpen", type=finite("--lenpen"), default=1.0)
    e.add_argument("--batch-size", type=positive_int, default=128)
    e.add_argument("--max-tokens", type=positive_int)
    e.add_argument("--src", help="default: as recorded, else the one pair binarised")
    e.add_argument("--tgt")
    e.add_argument("--ref", help="raw reference (default: recorded in DATA_BIN/recipe.env)")
    e.add_argument("--tok-ref", help="tokenised reference (default: recorded, else fairseq's T- lines)")
    e.add_argument("--lowercase", action=argparse.BooleanOptionalAction, help="case-insensitive (default: as recorded)")
    e.add_argument("--compound-split", action=argparse.BooleanOptionalAction, help="default: as recorded")
    e.add_argument("--user-dir", help="fairseq --user-dir (default: this plugin)")
    e.add_argument("--no-user-dir", action="store_true")
    e.add_argument("--out", help="default: CHECKPOINT_DIR/eval-SUBSET-beamN")
    e.add_argument("--force", action="store_true", help="replace files in --out that evaluate did not write")
    return p


def corpora_where(test) -> str:
    return ", ".join(name for name, corpus in CORPORA.items() if test(corpus))


def prepare_args(args):
    """The corpus's defaults for what was not given, then the values and outputs checked before any work."""
    corpus = CORPORA[args.corpus]
    if not (corpus.urls or args.from_) or not (corpus.langs or args.src and args.tgt):
        usage_error(f"{args.corpus} needs --from DIR, --src and --tgt: a folder holding train, valid and test "
                    "files of raw text named by their language (train.de, train.en, ...)")
    args.src, args.tgt = args.src or corpus.langs[0], args.tgt or corpus.langs[1]
    for flag, lang in (("--src", args.src), ("--tgt", args.tgt)):
        if corpus.langs and lang not in corpus.langs:
            usage_error(f"{flag}: invalid value '{lang}' (choose from: {', '.join(corpus.langs)})")
    if args.src == args.tgt:
        usage_error(f"--src and --tgt are both '{args.src}'")
    args.test_set = args.test_set or next(iter(corpus.tests))
    if args.test_set not in corpus.tests:
        usage_error(f"--test-set: invalid value '{args.test_set}' (choose from: {', '.join(corpus.tests)})")
    if args.remove_diacritics and args.src != "ro":
        usage_error("--remove-diacritics is for the Romanian source side (wmt16-en-ro --src ro --tgt en)")
    if args.valid_every and not isinstance(corpus.valid, int):
        usage_error(f"--valid-every {args.valid_every}: {args.corpus} has validation files of its own; it holds out "
                    f"every N-th training pair for {corpora_where(lambda c: isinstance(c.valid, int))}")
    if args.max_len and corpus.clean[0] == "none":
        usage_error(f"--max-len {args.max_len}: {args.corpus} is not cleaned by length; it is for "
                    f"{corpora_where(lambda c: c.clean[0] != 'none')}")
    if args.from_ and args.mirror:
        usage_error(f"--mirror {args.mirror}: --from {args.from_} reads the files there, nothing is downloaded")
    args.bpe_merges = args.bpe_merges or corpus.merges
    args.lowercase = corpus.lowercase if args.lowercase is None else args.lowercase
    args.dest = args.dest or corpus.dest.format(src=args.src, tgt=args.tgt)
    args.databin = args.databin or os.path.join(args.dest, "data-bin")
    if os.path.exists(args.dest) and not os.path.isdir(args.dest):
        usage_error(f"--dest '{args.dest}' is not a directory")
    check_outputs(args)
    return corpus


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    cut = argv.index("--") if "--" in argv else len(argv)  # evaluate: what follows goes to fairseq-generate
    args = build_parser().parse_args(argv[:cut])
    if args.command == "prepare":
        prepare(prepare_args(args), args)
    else:
        args.extra = argv[cut + 1:]
        evaluate(args)


if __name__ == "__main__":
    main()
