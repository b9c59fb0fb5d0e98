#!/usr/bin/env python3
"""Text processing used by the data recipes in scripts/ (prepare-*.sh, evaluate.sh).

One sub-command per pipeline step, all line-preserving and written for streaming large corpora:

  extract       unpack a .tgz/.tar.gz/.tar/.zip (or gunzip a .gz) into a directory
  train-tags    IWSLT train.tags.* -> plain text (drop <url>/<talkid>/<keywords> lines, strip
                <title>/<description> tags), as fairseq's prepare-iwslt14.sh does
  xml-segs      text of the <seg id="N"> lines of WIT3 XML / WMT SGML files (’ -> ')
  tokenize      sacremoses: optional punctuation normalisation (normalize-punctuation.perl), removal of
                non-printing characters (remove-non-printing-char.perl), Moses tokenisation
                (tokenizer.perl, XML-escaping as the perl script does), optional lowercasing
  clean         length / ratio filter with the semantics of Moses' clean-corpus-n.perl
  learn-bpe     joint BPE codes with subword-nmt (learned on the concatenation of the given files)
  apply-bpe     apply codes with subword-nmt or fastBPE (identical segmentation, see below)
  codes-to-fastbpe / codes-from-fastbpe   convert between the two codes formats
  hyps          hypotheses (and references) from fairseq-generate output, in the original order
  detok         sacremoses detokenisation
  bleu          detokenised sacreBLEU (with signature) and tokenised BLEU

BPE codes formats.  subword-nmt writes ``#version: 0.2`` followed by one merge ``a b`` per line, in
merge order; a word-final unit carries ``</w>`` (``e r</w>``).  fastBPE reads ``a b count`` lines with
the same ``</w>`` convention and ranks merges by line order (the count is ignored when applying).
So converting is: drop the header, append a count; duplicates keep their first occurrence, as
subword-nmt does.  Both implementations then split a word into characters, attach ``</w>`` to the last
one, greedily apply the lowest-ranked merge everywhere (left to right), drop ``</w>`` and join units
with ``@@ ``: the segmentations are identical (tests/test_recipes.py checks this on Multi30k text).
Lines are stripped of leading/trailing spaces before either implementation sees them.
"""

import argparse
import gzip
import io
import json
import os
import re
import shutil
import sys
import tarfile
import zipfile
from multiprocessing import Pool

CHUNK = 2000


def open_in(path):
    if path in (None, "-"):
        return io.TextIOWrapper(sys.stdin.buffer, encoding="utf-8", errors="replace", newline="\n")
    if path.endswith(".gz"):
        return gzip.open(path, "rt", encoding="utf-8", errors="replace", newline="\n")
    return open(path, encoding="utf-8", errors="replace", newline="\n")


def open_out(path, append=False):
    if path in (None, "-"):
        return io.TextIOWrapper(sys.stdout.buffer, encoding="utf-8", newline="\n")
    return open(path, "a" if append else "w", encoding="utf-8", newline="\n")


def read_lines(path):
    with open_in(path) as f:
        return [line.rstrip("\n") for line in f]


def chunks(f, size=CHUNK):
    batch = []
    for line in f:
        batch.append(line.rstrip("\n"))
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


def die(message):
    sys.stderr.write(f"recipe_tool: error: {message}\n")
    sys.exit(1)


# ---------------------------------------------------------------------------------------------- extract

def cmd_extract(args):
    os.makedirs(args.dest, exist_ok=True)
    path = args.archive
    name = os.path.basename(path)
    if zipfile.is_zipfile(path):
        with zipfile.ZipFile(path) as z:
            for member in z.namelist():
                target = os.path.realpath(os.path.join(args.dest, member))
                if not target.startswith(os.path.realpath(args.dest) + os.sep) and target != os.path.realpath(args.dest):
                    die(f"{path}: unsafe path in archive: {member}")
            z.extractall(args.dest)
    elif tarfile.is_tarfile(path):
        with tarfile.open(path) as t:
            try:
                t.extractall(args.dest, filter="data")
            except TypeError:  # Python without extraction filters
                t.extractall(args.dest)
    elif name.endswith(".gz"):
        with gzip.open(path, "rb") as src, open(os.path.join(args.dest, name[:-3]), "wb") as dst:
            shutil.copyfileobj(src, dst)
    else:
        die(f"{path}: not a .tgz/.tar.gz/.tar/.zip/.gz archive")


# ------------------------------------------------------------------------------------ IWSLT / WMT text

TRAIN_TAGS_DROP = ("<url>", "<talkid>", "<keywords>")
TRAIN_TAGS_STRIP = ("<title>", "</title>", "<description>", "</description>")


def cmd_train_tags(args):
    with open_in(args.input) as fin, open_out(args.output) as fout:
        for line in fin:
            if any(tag in line for tag in TRAIN_TAGS_DROP):
                continue
            for tag in TRAIN_TAGS_STRIP:
                line = line.replace(tag, "")
            fout.write(line if line.endswith("\n") else line + "\n")


SEG_OPEN = re.compile(r'<seg id="[0-9]*">\s*')
SEG_CLOSE = re.compile(r"\s*</seg>\s*")


def cmd_xml_segs(args):
    with open_out(args.output) as fout:
        for path in args.inputs:
            with open_in(path) as fin:
                for line in fin:
                    if "<seg id" not in line:
                        continue
                    line = SEG_CLOSE.sub("", SEG_OPEN.sub("", line.rstrip("\n")))
                    fout.write(line.replace("\u2019", "'") + "\n")


# ------------------------------------------------------------------------------------------- tokenize

_PROCESSOR = None

RO_COMMA_BELOW = str.maketrans({"\u015e": "\u0218", "\u015f": "\u0219", "\u0162": "\u021a", "\u0163": "\u021b"})
RO_STRIP = str.maketrans({
    "\u0218": "S", "\u0219": "s", "\u021a": "T", "\u021b": "t", "\u015e": "S", "\u015f": "s", "\u0162": "T",
    "\u0163": "t", "\u0102": "A", "\u0103": "a", "\u00c2": "A", "\u00e2": "a", "\u00ce": "I", "\u00ee": "i",
})


class Processor:
    def __init__(self, opts):
        import regex
        from sacremoses import MosesPunctNormalizer, MosesTokenizer

        self.opts = opts
        self.tokenizer = MosesTokenizer(lang=opts["lang"])
        self.normalizer = MosesPunctNormalizer(lang=opts["lang"], perl_parity=True) if opts["normalize_punct"] else None
        self.non_printing = regex.compile(r"\p{C}") if opts["remove_non_printing"] else None

    def __call__(self, line):
        o = self.opts
        if self.normalizer is not None:
            line = self.normalizer.normalize(line)
        if o["romanian_normalize"]:
            line = line.translate(RO_COMMA_BELOW)
        if o["remove_diacritics"]:
            line = line.translate(RO_STRIP)
        if self.non_printing is not None:
            line = self.non_printing.sub(" ", line)
        line = self.tokenizer.tokenize(line, aggressive_dash_splits=o["aggressive_dash_splits"],
                                       escape=o["escape"], return_str=True)
        if o["lowercase"]:
            line = line.lower()
        return line


def _init_processor(opts):
    global _PROCESSOR
    _PROCESSOR = Processor(opts)


def _process_chunk(batch):
    return [_PROCESSOR(line) for line in batch]


def io_pairs(args):
    """(input, output) pairs from -i/-o and any number of --io IN OUT."""
    pairs = [tuple(p) for p in (args.io or [])]
    if args.input is not None or args.output is not None or not pairs:
        pairs.insert(0, (args.input or "-", args.output or "-"))
    return pairs


def map_chunks(init, init_arg, func, pairs, workers):
    """Run ``func`` over chunks of lines of each (input, output) pair, in order, with one pool for all files."""
    if workers <= 1:
        init(init_arg)
        for src, dst in pairs:
            with open_in(src) as fin, open_out(dst) as fout:
                for batch in chunks(fin):
                    fout.writelines(line + "\n" for line in func(batch))
        return
    with Pool(workers, initializer=init, initargs=(init_arg,)) as pool:
        for src, dst in pairs:
            with open_in(src) as fin, open_out(dst) as fout:
                for out in pool.imap(func, chunks(fin), chunksize=1):
                    fout.writelines(line + "\n" for line in out)


def cmd_tokenize(args):
    opts = dict(lang=args.lang, lowercase=args.lowercase, aggressive_dash_splits=args.aggressive_dash_splits,
                escape=not args.no_escape, normalize_punct=args.normalize_punct,
                remove_non_printing=args.remove_non_printing, romanian_normalize=args.romanian_normalize,
                remove_diacritics=args.remove_diacritics)
    map_chunks(_init_processor, opts, _process_chunk, io_pairs(args), args.workers)


# ---------------------------------------------------------------------------------------------- clean

WS = re.compile(r"[ \t\n\r\f\v]+")


def clean_side(line):
    return WS.sub(" ", line.replace("|", "")).strip(" ")


def cmd_clean(args):
    """clean-corpus-n.perl: remove '|', squeeze whitespace, drop pairs with an empty side, a side longer
    than --max or shorter than --min words, a length ratio above --ratio (either way), or a word longer
    than --max-word-length characters.  --also-in/--also-out filter further parallel files (e.g. the
    untokenised text) with the same decisions."""
    if len(args.also_in) != len(args.also_out):
        die("--also-in and --also-out need the same number of files")
    ins = [open_in(args.src_in), open_in(args.tgt_in)] + [open_in(p) for p in args.also_in]
    outs = [open_out(args.src_out), open_out(args.tgt_out)] + [open_out(p) for p in args.also_out]
    total = kept = 0
    try:
        for lines in zip(*ins):
            total += 1
            src, tgt = clean_side(lines[0].rstrip("\n")), clean_side(lines[1].rstrip("\n"))
            if not src or not tgt:
                continue
            src_words, tgt_words = src.split(" "), tgt.split(" ")
            ns, nt = len(src_words), len(tgt_words)
            if ns > args.max or nt > args.max or ns < args.min or nt < args.min:
                continue
            if ns / nt > args.ratio or nt / ns > args.ratio:
                continue
            if args.max_word_length > 0 and max(len(w) for w in src_words + tgt_words) > args.max_word_length:
                continue
            kept += 1
            outs[0].write(src + "\n")
            outs[1].write(tgt + "\n")
            for line, out in zip(lines[2:], outs[2:]):
                out.write(line.rstrip("\n") + "\n")
        extra = [f.readline() for f in ins]
        if any(extra):
            die("clean: the parallel files have different numbers of lines")
    finally:
        for f in ins + outs:
            f.close()
    sys.stderr.write(f"clean: kept {kept} of {total} sentence pairs\n")


# ------------------------------------------------------------------------------------------------ BPE

def cmd_learn_bpe(args):
    from subword_nmt.learn_bpe import learn_bpe

    joint = args.out + ".joint-input"
    with open(joint, "wb") as dst:
        for path in args.inputs:
            with open(path, "rb") as src:
                shutil.copyfileobj(src, dst)
    try:
        with open(joint, encoding="utf-8") as fin, open(args.out, "w", encoding="utf-8") as fout:
            learn_bpe(fin, fout, args.merges, min_frequency=args.min_frequency, num_workers=args.workers)
    finally:
        os.remove(joint)


def read_subword_nmt_codes(path):
    with open(path, encoding="utf-8") as f:
        first = f.readline()
        if not first.startswith("#version:"):
            die(f"{path}: no '#version: 0.2' header; only subword-nmt >= 0.2 codes (with </w> on word-final "
                "units) can be converted")
        version = first.split()[-1]
        if not version.startswith("0.2"):
            die(f"{path}: codes version {version} is not supported (need 0.2)")
        pairs, seen = [], set()
        for n, line in enumerate(f, start=2):
            item = tuple(line.strip("\r\n ").split(" "))
            if item == ("",):
                continue
            if len(item) != 2:
                die(f"{path}:{n}: expected two units, got {line!r}")
            if item not in seen:  # subword-nmt keeps the first instance of a duplicate
                seen.add(item)
                pairs.append(item)
    return pairs


def codes_to_fastbpe(src, dst):
    pairs = read_subword_nmt_codes(src)
    with open(dst, "w", encoding="utf-8") as f:
        for rank, (a, b) in enumerate(pairs):
            f.write(f"{a} {b} {len(pairs) - rank}\n")  # pseudo count, decreasing with rank; fastBPE ranks by line
    return dst


def cmd_codes_to_fastbpe(args):
    codes_to_fastbpe(args.input, args.output)


def cmd_codes_from_fastbpe(args):
    with open(args.input, encoding="utf-8") as fin, open(args.output, "w", encoding="utf-8") as fout:
        fout.write("#version: 0.2\n")
        for n, line in enumerate(fin, start=1):
            parts = line.split()
            if len(parts) != 3:
                die(f"{args.input}:{n}: expected 'a b count', got {line!r}")
            fout.write(f"{parts[0]} {parts[1]}\n")


_BPE = None


def _init_subword_nmt(codes):
    global _BPE
    from subword_nmt.apply_bpe import BPE

    with open(codes, encoding="utf-8") as f:
        _BPE = BPE(f)


def _apply_subword_nmt(batch):
    return [_BPE.process_line(line.strip("\r\n ")) for line in batch]


def _init_fastbpe(codes):
    global _BPE
    import fastBPE

    _BPE = fastBPE.fastBPE(codes)


_WORDS = {}


def _apply_fastbpe(batch):
    """fastBPE on the words not seen before (its python API has no cache), then one lookup per word.
    Empty tokens (double spaces) are dropped, as both subword-nmt and fastBPE do."""
    if len(_WORDS) > 5_000_000:
        _WORDS.clear()
    split = [line.strip("\r\n ").split(" ") for line in batch]
    new = list(dict.fromkeys(w for words in split for w in words if w and w not in _WORDS))
    if new:
        _WORDS.update(zip(new, _BPE.apply(new)))
    return [" ".join(_WORDS[w] for w in words if w) for words in split]


def fastbpe_codes_for(codes):
    """A fastBPE-format copy of subword-nmt codes (``CODES.fastbpe``), rebuilt when older than CODES."""
    with open(codes, encoding="utf-8") as f:
        is_subword_nmt = f.readline().startswith("#version:")
    if not is_subword_nmt:
        return codes  # already fastBPE format
    converted = codes + ".fastbpe"
    if not os.path.exists(converted) or os.path.getmtime(converted) < os.path.getmtime(codes):
        codes_to_fastbpe(codes, converted)
    return converted


def cmd_apply_bpe(args):
    if args.impl == "fastbpe":
        try:
            import fastBPE  # noqa: F401
        except ImportError:
            die("--bpe fastbpe needs the fastBPE python module: "
                "pip install Cython && pip install --no-build-isolation fastBPE==0.1.0")
        init, func, codes, workers = _init_fastbpe, _apply_fastbpe, fastbpe_codes_for(args.codes), args.workers
    else:
        init, func, codes, workers = _init_subword_nmt, _apply_subword_nmt, args.codes, args.workers
    map_chunks(init, codes, func, io_pairs(args), workers)


# ----------------------------------------------------------------------------------------- evaluation

BPE_MARK = re.compile(r"(@@ )|(@@ ?$)")


def parse_generate(path):
    """{id: text} for H (hypothesis), T (target) and S (source) lines of fairseq-generate output."""
    found = {"H": {}, "T": {}, "S": {}}
    with open_in(path) as f:
        for line in f:
            line = line.rstrip("\n")
            m = re.match(r"^([HTS])-(\d+)\t", line)
            if not m:
                continue
            kind, i, fields = m.group(1), int(m.group(2)), line.split("\t")
            text = (fields[2] if len(fields) > 2 else "") if kind == "H" else fields[1]
            found[kind].setdefault(i, text)  # with --nbest, the first (best) hypothesis
    return found


def cmd_hyps(args):
    found = parse_generate(args.generate_output)
    hyps = found["H"]
    if not hyps:
        die(f"{args.generate_output}: no hypotheses (H-* lines); did fairseq-generate fail?")
    ids = sorted(hyps)
    if args.expect is not None and len(ids) != args.expect:
        die(f"{args.generate_output}: {len(ids)} hypotheses for {args.expect} reference lines: fairseq-generate "
            "skipped sentences (too long for the model? --skip-invalid-size-inputs-valid-test? a last batch dropped "
            "by --required-batch-size-multiple?), or the reference is not that of this subset")
    if ids != list(range(len(ids))):
        die(f"{args.generate_output}: hypotheses for sentence ids {ids[0]}..{ids[-1]} are not contiguous "
            f"({len(ids)} found)")
    with open_out(args.hyp) as f:
        for i in ids:
            f.write(BPE_MARK.sub("", hyps[i]) + "\n")
    if args.ref:
        with open_out(args.ref) as f:
            for i in ids:
                f.write(BPE_MARK.sub("", found["T"].get(i, "")) + "\n")


def cmd_detok(args):
    from sacremoses import MosesDetokenizer

    detok = MosesDetokenizer(lang=args.lang)
    with open_in(args.input) as fin, open_out(args.output) as fout:
        for line in fin:
            fout.write(detok.detokenize(line.split(), unescape=True) + "\n")


COMPOUND = re.compile(r"(\S)-(\S)")


def compound_split(line):
    """fairseq's get_compound_split_bleu.sh: perl -ple 's{(\\S)-(\\S)}{$1 ##AT##-##AT## $2}g'."""
    return COMPOUND.sub(r"\1 ##AT##-##AT## \2", line)


def cmd_bleu(args):
    from sacrebleu.metrics import BLEU

    hyp, ref = read_lines(args.hyp_detok), read_lines(args.ref)
    if len(hyp) != len(ref):
        die(f"{len(hyp)} hypotheses but {len(ref)} reference lines in {args.ref}: is it the reference of this "
            "subset (and untouched by cleaning)?")
    case = "case-insensitive" if args.lowercase else "case-sensitive"
    detok = BLEU(lowercase=args.lowercase)
    detok_score = detok.corpus_score(hyp, [ref])
    signature = str(detok.get_signature())
    print(f"sacreBLEU (detokenized, {case}) vs {args.ref}: {detok_score}")
    print(f"sacreBLEU signature: {signature}")

    hyp_tok, ref_tok = read_lines(args.hyp_tok), read_lines(args.tok_ref)
    if len(hyp_tok) != len(ref_tok):
        die(f"{len(hyp_tok)} hypotheses but {len(ref_tok)} lines in tokenized reference {args.tok_ref}")
    if args.compound_split:
        hyp_tok, ref_tok = [compound_split(x) for x in hyp_tok], [compound_split(x) for x in ref_tok]
    tok = BLEU(tokenize="none", lowercase=args.lowercase, force=True)
    tok_score = tok.corpus_score(hyp_tok, [ref_tok])
    how = "sacrebleu --tokenize none on Moses-tokenized text, as multi-bleu.perl"
    if args.compound_split:
        how += ", compound-split"
    print(f"Tokenized BLEU ({case}; {how}) vs {args.tok_ref}: {tok_score}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({
                "sacrebleu": round(detok_score.score, 2), "sacrebleu_signature": signature,
                "sacrebleu_full": str(detok_score), "tokenized_bleu": round(tok_score.score, 2),
                "tokenized_bleu_full": str(tok_score), "tokenized_bleu_signature": str(tok.get_signature()),
                "case_insensitive": bool(args.lowercase), "compound_split": bool(args.compound_split),
                "reference": os.path.abspath(args.ref), "tokenized_reference": os.path.abspath(args.tok_ref),
                "sentences": len(hyp),
            }, f, indent=2)
            f.write("\n")


# ----------------------------------------------------------------------------------------------- main

def build_parser():
    p = argparse.ArgumentParser(prog="recipe_tool.py", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)

    s = sub.add_parser("extract")
    s.add_argument("archive")
    s.add_argument("dest")
    s.set_defaults(func=cmd_extract)

    s = sub.add_parser("train-tags")
    s.add_argument("-i", "--input", required=True)
    s.add_argument("-o", "--output", required=True)
    s.set_defaults(func=cmd_train_tags)

    s = sub.add_parser("xml-segs")
    s.add_argument("inputs", nargs="+")
    s.add_argument("-o", "--output", required=True)
    s.set_defaults(func=cmd_xml_segs)

    s = sub.add_parser("tokenize")
    s.add_argument("--lang", required=True)
    s.add_argument("-i", "--input")
    s.add_argument("-o", "--output")
    s.add_argument("--io", nargs=2, action="append", metavar=("IN", "OUT"), help="more files (repeatable)")
    s.add_argument("--lowercase", action="store_true")
    s.add_argument("--aggressive-dash-splits", action="store_true", help="tokenizer.perl -a")
    s.add_argument("--no-escape", action="store_true", help="tokenizer.perl -no-escape")
    s.add_argument("--normalize-punct", action="store_true", help="normalize-punctuation.perl -l LANG first")
    s.add_argument("--remove-non-printing", action="store_true", help="remove-non-printing-char.perl first")
    s.add_argument("--romanian-normalize", action="store_true", help="ş ţ (cedilla) -> ș ț (comma below)")
    s.add_argument("--remove-diacritics", action="store_true", help="Romanian ă â î ș ț -> a a i s t")
    s.add_argument("--workers", type=int, default=1)
    s.set_defaults(func=cmd_tokenize)

    s = sub.add_parser("clean")
    s.add_argument("--src-in", required=True)
    s.add_argument("--tgt-in", required=True)
    s.add_argument("--src-out", required=True)
    s.add_argument("--tgt-out", required=True)
    s.add_argument("--also-in", nargs="*", default=[])
    s.add_argument("--also-out", nargs="*", default=[])
    s.add_argument("--ratio", type=float, default=1.5)
    s.add_argument("--min", type=int, default=1)
    s.add_argument("--max", type=int, default=175)
    s.add_argument("--max-word-length", type=int, default=1000)
    s.set_defaults(func=cmd_clean)

    s = sub.add_parser("learn-bpe")
    s.add_argument("inputs", nargs="+")
    s.add_argument("--merges", type=int, required=True)
    s.add_argument("--out", required=True)
    s.add_argument("--min-frequency", type=int, default=2)
    s.add_argument("--workers", type=int, default=1)
    s.set_defaults(func=cmd_learn_bpe)

    s = sub.add_parser("apply-bpe")
    s.add_argument("--impl", choices=["subword_nmt", "fastbpe"], default="subword_nmt")
    s.add_argument("--codes", required=True, help="subword-nmt codes (converted for fastBPE automatically)")
    s.add_argument("-i", "--input")
    s.add_argument("-o", "--output")
    s.add_argument("--io", nargs=2, action="append", metavar=("IN", "OUT"), help="more files (repeatable)")
    s.add_argument("--workers", type=int, default=1)
    s.set_defaults(func=cmd_apply_bpe)

    s = sub.add_parser("codes-to-fastbpe")
    s.add_argument("input")
    s.add_argument("output")
    s.set_defaults(func=cmd_codes_to_fastbpe)

    s = sub.add_parser("codes-from-fastbpe")
    s.add_argument("input")
    s.add_argument("output")
    s.set_defaults(func=cmd_codes_from_fastbpe)

    s = sub.add_parser("hyps")
    s.add_argument("generate_output")
    s.add_argument("--hyp", required=True, help="write BPE-free hypotheses here, in the original order")
    s.add_argument("--ref", help="also write the BPE-free T-* references here")
    s.add_argument("--expect", type=int, help="number of sentences there must be")
    s.set_defaults(func=cmd_hyps)

    s = sub.add_parser("detok")
    s.add_argument("--lang", required=True)
    s.add_argument("-i", "--input", default="-")
    s.add_argument("-o", "--output", default="-")
    s.set_defaults(func=cmd_detok)

    s = sub.add_parser("bleu")
    s.add_argument("--hyp-detok", required=True)
    s.add_argument("--ref", required=True, help="raw (untokenised) reference")
    s.add_argument("--hyp-tok", required=True)
    s.add_argument("--tok-ref", required=True)
    s.add_argument("--lowercase", action="store_true")
    s.add_argument("--compound-split", action="store_true")
    s.add_argument("--json")
    s.set_defaults(func=cmd_bleu)
    return p


def main(argv=None):
    args = build_parser().parse_args(argv)
    args.func(args)


if __name__ == "__main__":
    main()
