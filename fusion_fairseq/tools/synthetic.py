"""A deterministic synthetic language pair for smoke-testing and demonstrating layer fusion.

The project generates this corpus itself (pure Python, no download), from two seeds: the
*lexicon seed* draws the vocabulary (invented word stems and their genders) and the *corpus
seed* draws the sentences. Same seeds, same files, byte for byte.

Source language ``src`` (English-like: SVO, adjectives before the noun, little morphology)::

    SENTENCE -> CLAUSE [CONJ CLAUSE] "."
    CLAUSE   -> NP_subj VERB [NP_obj] [PREP NP]          (object only for transitive verbs)
    NP       -> DET ADJ{0,2} NOUN
    DET      -> "the" | "a" (indefinite singular) | "some" (indefinite plural)
    NOUN     -> stem | stem+"s" (plural)
    VERB     -> stem+"s" (present, singular subject) | stem (present, plural subject)
              | stem+"ed" (past) | "will" stem (future)

Target language ``tgt`` (verb-final with postpositions, adjectives after the noun, rich agreement)::

    SENTENCE -> CLAUSE [CONJ' CLAUSE] "."
    CLAUSE   -> NP_subj [NP POSTP] [NP_obj] VERB          (SOV: verb-final in every clause,
                                                            main and subordinate)
    NP       -> DET[g,n] NOUN[n] ADJ[g,n]{0,2}            (adjectives follow the noun, in mirror
                                                            order: "the big red car" -> "DET car red big")
    NOUN     -> stem | stem+{m:"en", f:"es", n:"ar"}      (plural suffix chosen by the noun's gender)
    ADJ      -> stem+{m:"o"/"i", f:"a"/"e", n:"um"/"ia"}  (singular/plural, agreeing with the noun)
    VERB     -> stem+TENSE+AGR                            TENSE: present "", past "et", future "ov"
                                                          AGR: the subject's gender and number
                                                               {m:"ak"/"aki", f:"ek"/"eki", n:"ok"/"oki"}
    DET      -> definite {lo, li, la, le, lu, lia} | indefinite {un, uni, una, une, unu, unia}
                (masculine/feminine/neuter x singular/plural)

Every target noun has a lexical gender (m/f/n) that the source never shows. All words are an
invented stem plus regular suffixes, so joint BPE learns the suffixes as subword units and splits
the rarer inflected forms into stem + suffix.

Why translating it needs the lower layers: the target's agreement suffixes (on determiners,
adjectives and verbs) are decided by *lexical* features -- the gender of a noun stem and the
number suffix of the source noun -- that live in the word embeddings and the lowest layers, and
they must be copied onto words that sit elsewhere in the sentence (a verb's suffix depends on the
subject, which may be separated from the verb by a postpositional phrase and the object). At the
same time the clause must be reordered (SVO -> S PP O V, adjectives moved behind their noun in
mirror order), which is the more abstract, positional information built up by the higher layers.
A model whose decoder only sees the top encoder layer has to carry the fine-grained morphology
through every layer; layer fusion (MLRF) gives it direct access to the lower layers.

Command line::

    python -m fusion_fairseq.tools.synthetic --out DIR --train-size 8000 --valid-size 300 --test-size 300

writes ``DIR/{train,valid,test}.{src,tgt}`` (one sentence per line, tokens separated by spaces).
"""

import argparse
import os
import random
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

SRC_LANG = "src"
TGT_LANG = "tgt"
SPLITS = ("train", "valid", "test")

GENDERS = ("m", "f", "n")
NUMBERS = ("sg", "pl")
TENSES = ("pres", "past", "fut")

# ---- target morphology --------------------------------------------------------------------
TGT_NOUN_PLURAL = {"m": "en", "f": "es", "n": "ar"}
TGT_ADJ_AGR = {
    ("m", "sg"): "o", ("m", "pl"): "i",
    ("f", "sg"): "a", ("f", "pl"): "e",
    ("n", "sg"): "um", ("n", "pl"): "ia",
}
TGT_VERB_TENSE = {"pres": "", "past": "et", "fut": "ov"}
TGT_VERB_AGR = {
    ("m", "sg"): "ak", ("m", "pl"): "aki",
    ("f", "sg"): "ek", ("f", "pl"): "eki",
    ("n", "sg"): "ok", ("n", "pl"): "oki",
}
TGT_DET = {
    True: {("m", "sg"): "lo", ("m", "pl"): "li", ("f", "sg"): "la", ("f", "pl"): "le",
           ("n", "sg"): "lu", ("n", "pl"): "lia"},
    False: {("m", "sg"): "un", ("m", "pl"): "uni", ("f", "sg"): "una", ("f", "pl"): "une",
            ("n", "sg"): "unu", ("n", "pl"): "unia"},
}

# ---- source function words and their target counterparts -----------------------------------
SRC_DEFINITE = "the"
SRC_INDEF_SG = "a"
SRC_INDEF_PL = "some"
SRC_FUTURE = "will"
SRC_NOUN_PLURAL = "s"
SRC_VERB_3SG = "s"
SRC_VERB_PAST = "ed"
PREPOSITIONS = {"in": "mi", "on": "su", "near": "pres", "under": "sot", "behind": "dor", "with": "kon"}
CONJUNCTIONS = {"because": "porke", "while": "mentre", "although": "benke", "when": "kwando", "after": "dopo"}
PUNCT = "."

SRC_FUNCTION_WORDS = {SRC_DEFINITE, SRC_INDEF_SG, SRC_INDEF_PL, SRC_FUTURE, PUNCT, *PREPOSITIONS, *CONJUNCTIONS}
TGT_FUNCTION_WORDS = {PUNCT, *PREPOSITIONS.values(), *CONJUNCTIONS.values(),
                      *TGT_DET[True].values(), *TGT_DET[False].values()}

# Syllable inventories: the two languages look different, and every stem ends in a consonant so
# that stem+suffix splits are unambiguous.
SRC_ONSETS = "b d f g k l m n p r s t v z br tr st pl gr".split()
SRC_VOWELS = "a e i o u ai".split()
SRC_CODAS = "l m n r t k".split()
TGT_ONSETS = "b d g h j k l m n p r s t w y sh ch th zh".split()
TGT_VOWELS = "a e i o u ei ou".split()
TGT_CODAS = "d l m n r s t x".split()


@dataclass(frozen=True)
class Entry:
    """One lexical item: a source stem, its target stem, and (nouns) the target gender or
    (verbs) transitivity."""

    src: str
    tgt: str
    gender: Optional[str] = None
    transitive: Optional[bool] = None


@dataclass
class Lexicon:
    nouns: List[Entry]
    adjectives: List[Entry]
    verbs: List[Entry]
    seed: int = 0
    # inflected target form -> ("noun"|"adj"|"verb", Entry, features)
    tgt_analysis: Dict[str, Tuple[str, Entry, tuple]] = field(default_factory=dict, repr=False)
    # inflected source form -> ("noun"|"adj"|"verb", Entry, features)
    src_analysis: Dict[str, Tuple[str, Entry, tuple]] = field(default_factory=dict, repr=False)

    def src_types(self):
        return set(self.src_analysis) | SRC_FUNCTION_WORDS

    def tgt_types(self):
        return set(self.tgt_analysis) | TGT_FUNCTION_WORDS

    def word_pairs(self) -> List[Tuple[str, str]]:
        """The one-to-one translations of the lexicon, for the aligned-embedding analysis (Liu et
        al. 2021, Table 3): every noun in both numbers, every preposition and conjunction.
        Adjectives and verbs are left out because their target form depends on agreement, so a
        source form has no single aligned target word."""
        pairs = [(src_noun(noun, n), tgt_noun(noun, n)) for noun in self.nouns for n in NUMBERS]
        return pairs + sorted(PREPOSITIONS.items()) + sorted(CONJUNCTIONS.items())


# ---- inflection ------------------------------------------------------------------------------
def src_noun(entry: Entry, number: str) -> str:
    return entry.src + (SRC_NOUN_PLURAL if number == "pl" else "")


def tgt_noun(entry: Entry, number: str) -> str:
    return entry.tgt + (TGT_NOUN_PLURAL[entry.gender] if number == "pl" else "")


def tgt_adjective(entry: Entry, gender: str, number: str) -> str:
    return entry.tgt + TGT_ADJ_AGR[gender, number]


def src_verb(entry: Entry, tense: str, subject_number: str) -> List[str]:
    if tense == "fut":
        return [SRC_FUTURE, entry.src]
    if tense == "past":
        return [entry.src + SRC_VERB_PAST]
    return [entry.src + (SRC_VERB_3SG if subject_number == "sg" else "")]


def tgt_verb(entry: Entry, tense: str, gender: str, number: str) -> str:
    return entry.tgt + TGT_VERB_TENSE[tense] + TGT_VERB_AGR[gender, number]


# ---- lexicon ---------------------------------------------------------------------------------
def _stem(rng: random.Random, onsets, vowels, codas, syllables: int) -> str:
    word = "".join(rng.choice(onsets) + rng.choice(vowels) for _ in range(syllables))
    return word + rng.choice(codas)


DEFAULT_LEXICON_SIZES = {"n_nouns": 80, "n_adjectives": 40, "n_verbs": 50}


def build_lexicon(seed: int = 0, n_nouns: int = 80, n_adjectives: int = 40, n_verbs: int = 50,
                  transitive_ratio: float = 0.7) -> Lexicon:
    """Draw the vocabulary: invented stems for both languages, noun genders, verb transitivity.
    Rejects any stem whose inflected forms would collide with another word's."""
    rng = random.Random(f"fusion-fairseq-synthetic-lexicon-{seed}")
    src_forms: Dict[str, Tuple[str, Entry, tuple]] = {}
    tgt_forms: Dict[str, Tuple[str, Entry, tuple]] = {}
    categories = {"noun": [], "adj": [], "verb": []}

    def forms(category, entry):
        if category == "noun":
            src = {src_noun(entry, n): (n,) for n in NUMBERS}
            tgt = {tgt_noun(entry, n): (n,) for n in NUMBERS}
        elif category == "adj":
            src = {entry.src: ()}
            tgt = {tgt_adjective(entry, g, n): (g, n) for g in GENDERS for n in NUMBERS}
        else:
            src = {entry.src: ("bare",), entry.src + SRC_VERB_3SG: ("3sg",), entry.src + SRC_VERB_PAST: ("past",)}
            tgt = {tgt_verb(entry, t, g, n): (t, g, n) for t in TENSES for g in GENDERS for n in NUMBERS}
        return src, tgt

    for category, count in (("noun", n_nouns), ("adj", n_adjectives), ("verb", n_verbs)):
        while len(categories[category]) < count:
            entry = Entry(
                src=_stem(rng, SRC_ONSETS, SRC_VOWELS, SRC_CODAS, rng.choice((1, 2, 2, 3))),
                tgt=_stem(rng, TGT_ONSETS, TGT_VOWELS, TGT_CODAS, rng.choice((1, 2, 2, 3))),
                gender=rng.choice(GENDERS) if category == "noun" else None,
                transitive=(rng.random() < transitive_ratio) if category == "verb" else None,
            )
            src, tgt = forms(category, entry)
            if any(f in src_forms or f in SRC_FUNCTION_WORDS for f in src):
                continue
            if any(f in tgt_forms or f in TGT_FUNCTION_WORDS for f in tgt):
                continue
            src_forms.update({f: (category, entry, feats) for f, feats in src.items()})
            tgt_forms.update({f: (category, entry, feats) for f, feats in tgt.items()})
            categories[category].append(entry)
    return Lexicon(categories["noun"], categories["adj"], categories["verb"], seed, tgt_forms, src_forms)


# ---- sentence structure ----------------------------------------------------------------------
@dataclass
class NounPhrase:
    noun: Entry
    number: str
    definite: bool
    adjectives: List[Entry]

    def src(self) -> List[str]:
        det = SRC_DEFINITE if self.definite else (SRC_INDEF_SG if self.number == "sg" else SRC_INDEF_PL)
        return [det] + [a.src for a in self.adjectives] + [src_noun(self.noun, self.number)]

    def tgt(self) -> List[str]:
        g, n = self.noun.gender, self.number
        return ([TGT_DET[self.definite][g, n], tgt_noun(self.noun, n)]
                + [tgt_adjective(a, g, n) for a in reversed(self.adjectives)])


@dataclass
class Clause:
    subject: NounPhrase
    verb: Entry
    tense: str
    obj: Optional[NounPhrase] = None
    preposition: Optional[str] = None
    pp_object: Optional[NounPhrase] = None

    def src(self) -> List[str]:
        words = self.subject.src() + src_verb(self.verb, self.tense, self.subject.number)
        if self.obj is not None:
            words += self.obj.src()
        if self.preposition is not None:
            words += [self.preposition] + self.pp_object.src()
        return words

    def tgt(self) -> List[str]:
        words = self.subject.tgt()
        if self.preposition is not None:
            words += self.pp_object.tgt() + [PREPOSITIONS[self.preposition]]
        if self.obj is not None:
            words += self.obj.tgt()
        return words + [tgt_verb(self.verb, self.tense, self.subject.noun.gender, self.subject.number)]


@dataclass
class Sentence:
    main: Clause
    conjunction: Optional[str] = None
    subordinate: Optional[Clause] = None

    def src(self) -> str:
        words = self.main.src()
        if self.subordinate is not None:
            words += [self.conjunction] + self.subordinate.src()
        return " ".join(words + [PUNCT])

    def tgt(self) -> str:
        words = self.main.tgt()
        if self.subordinate is not None:
            words += [CONJUNCTIONS[self.conjunction]] + self.subordinate.tgt()
        return " ".join(words + [PUNCT])


class SentenceSampler:
    """Draws random sentences of the grammar from a lexicon (probabilities of the optional parts
    are constructor arguments)."""

    def __init__(self, lexicon: Lexicon, rng: random.Random, p_plural=0.35, p_definite=0.5,
                 adjective_weights=(0.5, 0.35, 0.15), p_pp=0.4, p_subordinate=0.35):
        self.lexicon, self.rng = lexicon, rng
        self.p_plural, self.p_definite = p_plural, p_definite
        self.adjective_weights, self.p_pp, self.p_subordinate = adjective_weights, p_pp, p_subordinate

    def noun_phrase(self) -> NounPhrase:
        rng = self.rng
        n_adj = rng.choices(range(len(self.adjective_weights)), weights=self.adjective_weights)[0]
        return NounPhrase(
            noun=rng.choice(self.lexicon.nouns),
            number="pl" if rng.random() < self.p_plural else "sg",
            definite=rng.random() < self.p_definite,
            adjectives=rng.sample(self.lexicon.adjectives, n_adj),
        )

    def clause(self) -> Clause:
        rng = self.rng
        verb = rng.choice(self.lexicon.verbs)
        clause = Clause(self.noun_phrase(), verb, rng.choice(TENSES))
        if verb.transitive:
            clause.obj = self.noun_phrase()
        if rng.random() < self.p_pp:
            clause.preposition = rng.choice(sorted(PREPOSITIONS))
            clause.pp_object = self.noun_phrase()
        return clause

    def sentence(self) -> Sentence:
        sentence = Sentence(self.clause())
        if self.rng.random() < self.p_subordinate:
            sentence.conjunction = self.rng.choice(sorted(CONJUNCTIONS))
            sentence.subordinate = self.clause()
        return sentence


def generate_sentences(sizes: Sequence[Tuple[str, int]], seed: int = 1, lexicon: Optional[Lexicon] = None,
                       lexicon_seed: int = 0) -> Dict[str, List[Sentence]]:
    """Sentences for each ``(split, size)``, drawn in order from one generator seeded with ``seed``.
    Sentences whose source side already occurs in an earlier split are redrawn, so the valid and
    test sets do not overlap the training set (nor each other)."""
    lexicon = lexicon or build_lexicon(lexicon_seed)
    sampler = SentenceSampler(lexicon, random.Random(f"fusion-fairseq-synthetic-corpus-{seed}"))
    seen, result = set(), {}
    for split, size in sizes:
        sentences, own = [], set()
        while len(sentences) < size:
            sentence = sampler.sentence()
            source = sentence.src()
            if source in seen:
                continue
            sentences.append(sentence)
            own.add(source)
        seen |= own
        result[split] = sentences
    return result


def generate_pairs(size: int, seed: int = 1, lexicon_seed: int = 0) -> List[Tuple[str, str]]:
    """``size`` (source, target) sentence pairs."""
    return [(s.src(), s.tgt()) for s in generate_sentences([("pairs", size)], seed, lexicon_seed=lexicon_seed)["pairs"]]


def dictionary_path(out_dir: str, src_lang: str = SRC_LANG, tgt_lang: str = TGT_LANG) -> str:
    """Where :func:`write_corpus` puts the bilingual dictionary."""
    return os.path.join(out_dir, f"dict.{src_lang}-{tgt_lang}.txt")


def write_corpus(out_dir: str, train_size: int = 8000, valid_size: int = 300, test_size: int = 300,
                 seed: int = 1, lexicon_seed: int = 0, src_lang: str = SRC_LANG, tgt_lang: str = TGT_LANG,
                 **lexicon_sizes):
    """Write ``{train,valid,test}.{src_lang,tgt_lang}`` and the bilingual dictionary
    ``dict.{src_lang}-{tgt_lang}.txt`` (:meth:`Lexicon.word_pairs`, one ``source target`` pair per
    line) into ``out_dir`` (created if missing; other files there are left alone).
    ``lexicon_sizes``: ``n_nouns``, ``n_adjectives``, ``n_verbs`` of :func:`build_lexicon`.
    Returns ``{split: (source_path, target_path)}``."""
    os.makedirs(out_dir, exist_ok=True)
    sizes = [("train", train_size), ("valid", valid_size), ("test", test_size)]
    lexicon = build_lexicon(lexicon_seed, **lexicon_sizes)
    corpus = generate_sentences(sizes, seed, lexicon=lexicon)
    from fusion_fairseq.tools.corpus import write_lines  # never writes through a link

    write_lines(dictionary_path(out_dir, src_lang, tgt_lang), [f"{src} {tgt}" for src, tgt in lexicon.word_pairs()])
    paths = {}
    for split, _ in sizes:
        paths[split] = tuple(os.path.join(out_dir, f"{split}.{lang}") for lang in (src_lang, tgt_lang))
        write_lines(paths[split][0], [sentence.src() for sentence in corpus[split]])
        write_lines(paths[split][1], [sentence.tgt() for sentence in corpus[split]])
    return paths


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m fusion_fairseq.tools.synthetic",
        description="Write a deterministic synthetic parallel corpus (SVO source -> SOV target with "
        "agreement morphology): OUT/{train,valid,test}.{src,tgt} and the bilingual dictionary OUT/dict.src-tgt.txt.",
    )
    parser.add_argument("--out", required=True, help="output directory (created if missing)")
    parser.add_argument("--train-size", type=int, default=8000)
    parser.add_argument("--valid-size", type=int, default=300)
    parser.add_argument("--test-size", type=int, default=300)
    parser.add_argument("--seed", type=int, default=1, help="seed of the sentences")
    parser.add_argument("--lexicon-seed", type=int, default=0, help="seed of the vocabulary")
    parser.add_argument("--nouns", type=int, default=DEFAULT_LEXICON_SIZES["n_nouns"], help="noun stems")
    parser.add_argument("--adjectives", type=int, default=DEFAULT_LEXICON_SIZES["n_adjectives"], help="adjective stems")
    parser.add_argument("--verbs", type=int, default=DEFAULT_LEXICON_SIZES["n_verbs"], help="verb stems")
    parser.add_argument("--src-lang", default=SRC_LANG)
    parser.add_argument("--tgt-lang", default=TGT_LANG)
    args = parser.parse_args(argv)
    for name in ("train_size", "valid_size", "test_size"):
        if getattr(args, name) < 0:
            parser.error(f"--{name.replace('_', '-')} must be >= 0")
    for name in ("nouns", "adjectives", "verbs"):
        if getattr(args, name) < 2:
            parser.error(f"--{name} must be >= 2")
    paths = write_corpus(args.out, args.train_size, args.valid_size, args.test_size, args.seed,
                         args.lexicon_seed, args.src_lang, args.tgt_lang,
                         n_nouns=args.nouns, n_adjectives=args.adjectives, n_verbs=args.verbs)
    for split, (src_path, tgt_path) in paths.items():
        print(f"{split}: {src_path} {tgt_path}")
    print(f"bilingual dictionary: {dictionary_path(args.out, args.src_lang, args.tgt_lang)}")


if __name__ == "__main__":
    main()
