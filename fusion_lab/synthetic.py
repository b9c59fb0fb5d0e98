"""A deterministic synthetic language pair for smoke-testing and demonstrating layer fusion.

Pure Python, no download: a *lexicon seed* draws the vocabulary, a *corpus seed* the sentences;
same seeds, same files, byte for byte. The source is English-like (SVO, adjectives before the
noun), the target verb-final with postpositions, adjectives after the noun in mirror order and
agreement suffixes; the grammar in full: examples/README.md, "The synthetic language pair".

Why translating it needs the lower layers: the target's agreement suffixes are decided by *lexical*
features (a noun stem's gender, the source noun's number suffix) that live in the embeddings and the
lowest layers, and must be copied onto words elsewhere in the sentence (a verb agrees with a subject
that a postpositional phrase and the object may separate from it), while the clause is reordered
(SVO -> S PP O V, adjectives mirrored behind their noun): the positional work of the higher layers.
"""

import argparse
import os
import random
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

from fusion_lab.common import claim_out_dir, non_negative_int
from fusion_lab.corpus import SPLITS, write_lines, write_splits

GENDERS = ("m", "f", "n")
NUMBERS = ("sg", "pl")
TENSES = ("pres", "past", "fut")
AGREEMENT = [(g, n) for g in GENDERS for n in NUMBERS]  # (m, sg), (m, pl), (f, sg) ...

# ---- target morphology: (gender, number) -> suffix or determiner, in the order of AGREEMENT ----
TGT_NOUN_PLURAL = {"m": "en", "f": "es", "n": "ar"}
TGT_ADJ_AGR = dict(zip(AGREEMENT, "o i a e um ia".split()))
TGT_VERB_TENSE = {"pres": "", "past": "et", "fut": "ov"}
TGT_VERB_AGR = dict(zip(AGREEMENT, "ak aki ek eki ok oki".split()))
TGT_DET = {True: dict(zip(AGREEMENT, "lo li la le lu lia".split())),  # definite
           False: dict(zip(AGREEMENT, "un uni una une unu unia".split()))}

# ---- source function words and their target counterparts -----------------------------------
SRC_DEFINITE = "the"
SRC_FUTURE = "will"
PREPOSITIONS = {"in": "mi", "on": "su", "near": "pres", "under": "sot", "behind": "dor", "with": "kon"}
CONJUNCTIONS = {"because": "porke", "while": "mentre", "although": "benke", "when": "kwando", "after": "dopo"}
PUNCT = "."

SRC_FUNCTION_WORDS = {SRC_DEFINITE, "a", "some", SRC_FUTURE, PUNCT, *PREPOSITIONS, *CONJUNCTIONS}
TGT_FUNCTION_WORDS = {PUNCT, *PREPOSITIONS.values(), *CONJUNCTIONS.values(),
                      *TGT_DET[True].values(), *TGT_DET[False].values()}

# Syllables (onsets, vowels, codas): the two languages look different, and every stem ends in a
# consonant so that stem+suffix splits are unambiguous.
SRC_SYLLABLES = ("b d f g k l m n p r s t v z br tr st pl gr".split(), "a e i o u ai".split(), "l m n r t k".split())
TGT_SYLLABLES = ("b d g h j k l m n p r s t w y sh ch th zh".split(), "a e i o u ei ou".split(), "d l m n r s t x".split())
LEXICON_SIZES = (("noun", 80), ("adj", 40), ("verb", 50))
TRANSITIVE_RATIO = 0.7
# sentence sampling: plural, definite, 0/1/2 adjectives, a prepositional phrase, a subordinate clause
P_PLURAL, P_DEFINITE, ADJECTIVE_WEIGHTS, P_PP, P_SUBORDINATE = 0.35, 0.5, (0.5, 0.35, 0.15), 0.4, 0.35


@dataclass(frozen=True)
class Entry:
    """A source stem, its target stem, and (nouns) the target gender or (verbs) transitivity."""

    src: str
    tgt: str
    gender: Optional[str] = None
    transitive: Optional[bool] = None


@dataclass
class Lexicon:
    nouns: List[Entry]
    adjectives: List[Entry]
    verbs: List[Entry]
    # inflected form -> ("noun"|"adj"|"verb", Entry, features), one table a language
    tgt_analysis: Dict[str, Tuple[str, Entry, tuple]] = field(repr=False)
    src_analysis: Dict[str, Tuple[str, Entry, tuple]] = field(repr=False)

    def word_pairs(self) -> List[Tuple[str, str]]:
        """The one-to-one translations, for the aligned-embedding analysis (Liu et al. 2021, Table 3):
        every noun in both numbers, every preposition and conjunction. Adjectives and verbs agree on
        the target side, so a source form has no single aligned target word."""
        pairs = [(src_noun(noun, n), tgt_noun(noun, n)) for noun in self.nouns for n in NUMBERS]
        return pairs + sorted(PREPOSITIONS.items()) + sorted(CONJUNCTIONS.items())


def src_noun(entry: Entry, number: str) -> str:
    return entry.src + ("s" if number == "pl" else "")


def tgt_noun(entry: Entry, number: str) -> str:
    return entry.tgt + (TGT_NOUN_PLURAL[entry.gender] if number == "pl" else "")


def src_verb(entry: Entry, tense: str, subject_number: str) -> List[str]:
    if tense == "fut":
        return [SRC_FUTURE, entry.src]
    return [entry.src + ("ed" if tense == "past" else "s" if subject_number == "sg" else "")]


def tgt_verb(entry: Entry, tense: str, gender: str, number: str) -> str:
    return entry.tgt + TGT_VERB_TENSE[tense] + TGT_VERB_AGR[gender, number]


def inflections(category, entry):
    """({source form: features}, {target form: features}) of a lexicon entry."""
    if category == "noun":
        return {src_noun(entry, n): (n,) for n in NUMBERS}, {tgt_noun(entry, n): (n,) for n in NUMBERS}
    if category == "adj":
        return {entry.src: ()}, {entry.tgt + TGT_ADJ_AGR[a]: a for a in AGREEMENT}
    return ({entry.src: ("bare",), entry.src + "s": ("3sg",), entry.src + "ed": ("past",)},
            {tgt_verb(entry, t, g, n): (t, g, n) for t in TENSES for g, n in AGREEMENT})


def _stem(rng: random.Random, syllables) -> str:
    onsets, vowels, codas = syllables
    count = rng.choice((1, 2, 2, 3))
    return "".join(rng.choice(onsets) + rng.choice(vowels) for _ in range(count)) + rng.choice(codas)


def build_lexicon(seed: int = 0) -> Lexicon:
    """Draw the vocabulary: invented stems for both languages, noun genders, verb transitivity.
    Rejects any stem whose inflected forms would collide with another word's."""
    rng = random.Random(f"fusion-fairseq-synthetic-lexicon-{seed}")
    src_forms, tgt_forms = {}, {}
    categories = {category: [] for category, _ in LEXICON_SIZES}
    for category, count in LEXICON_SIZES:
        while len(categories[category]) < count:
            entry = Entry(src=_stem(rng, SRC_SYLLABLES), tgt=_stem(rng, TGT_SYLLABLES),
                          gender=rng.choice(GENDERS) if category == "noun" else None,
                          transitive=(rng.random() < TRANSITIVE_RATIO) if category == "verb" else None)
            src, tgt = inflections(category, entry)
            if any(f in src_forms or f in SRC_FUNCTION_WORDS for f in src) or \
                    any(f in tgt_forms or f in TGT_FUNCTION_WORDS for f in tgt):
                continue
            src_forms.update({f: (category, entry, feats) for f, feats in src.items()})
            tgt_forms.update({f: (category, entry, feats) for f, feats in tgt.items()})
            categories[category].append(entry)
    return Lexicon(categories["noun"], categories["adj"], categories["verb"], tgt_forms, src_forms)


@dataclass
class NounPhrase:
    noun: Entry
    number: str
    definite: bool
    adjectives: List[Entry]

    def src(self) -> List[str]:
        det = SRC_DEFINITE if self.definite else ("a" if self.number == "sg" else "some")
        return [det] + [a.src for a in self.adjectives] + [src_noun(self.noun, self.number)]

    def tgt(self) -> List[str]:
        agreement = self.noun.gender, self.number
        return ([TGT_DET[self.definite][agreement], tgt_noun(self.noun, self.number)]
                + [a.tgt + TGT_ADJ_AGR[agreement] for a in reversed(self.adjectives)])


@dataclass
class Clause:
    subject: NounPhrase
    verb: Entry
    tense: str
    obj: Optional[NounPhrase] = None
    preposition: Optional[str] = None
    pp_object: Optional[NounPhrase] = None

    def src(self) -> List[str]:  # S V O PP
        words = self.subject.src() + src_verb(self.verb, self.tense, self.subject.number)
        words += self.obj.src() if self.obj else []
        return words + ([self.preposition] + self.pp_object.src() if self.preposition else [])

    def tgt(self) -> List[str]:  # S PP O V
        words = self.subject.tgt()
        words += self.pp_object.tgt() + [PREPOSITIONS[self.preposition]] if self.preposition else []
        words += self.obj.tgt() if self.obj else []
        return words + [tgt_verb(self.verb, self.tense, self.subject.noun.gender, self.subject.number)]


@dataclass
class Sentence:
    main: Clause
    conjunction: Optional[str] = None
    subordinate: Optional[Clause] = None

    def src(self) -> str:
        words = self.main.src() + ([self.conjunction] + self.subordinate.src() if self.subordinate else [])
        return " ".join(words + [PUNCT])

    def tgt(self) -> str:
        words = self.main.tgt() + ([CONJUNCTIONS[self.conjunction]] + self.subordinate.tgt() if self.subordinate else [])
        return " ".join(words + [PUNCT])


def sample_noun_phrase(lexicon: Lexicon, rng: random.Random) -> NounPhrase:
    n_adjectives = rng.choices(range(len(ADJECTIVE_WEIGHTS)), weights=ADJECTIVE_WEIGHTS)[0]
    return NounPhrase(noun=rng.choice(lexicon.nouns), number="pl" if rng.random() < P_PLURAL else "sg",
                      definite=rng.random() < P_DEFINITE, adjectives=rng.sample(lexicon.adjectives, n_adjectives))


def sample_clause(lexicon: Lexicon, rng: random.Random) -> Clause:
    verb = rng.choice(lexicon.verbs)
    clause = Clause(sample_noun_phrase(lexicon, rng), verb, rng.choice(TENSES))
    if verb.transitive:
        clause.obj = sample_noun_phrase(lexicon, rng)
    if rng.random() < P_PP:
        clause.preposition = rng.choice(sorted(PREPOSITIONS))
        clause.pp_object = sample_noun_phrase(lexicon, rng)
    return clause


def generate_sentences(sizes: Sequence[Tuple[str, int]], seed: int = 1, lexicon: Optional[Lexicon] = None,
                       lexicon_seed: int = 0) -> Dict[str, List[Sentence]]:
    """Sentences for each ``(split, size)``, drawn in order from one generator seeded with ``seed``.
    A sentence whose source side occurs in an earlier split is redrawn: the splits do not overlap."""
    lexicon = lexicon or build_lexicon(lexicon_seed)
    rng = random.Random(f"fusion-fairseq-synthetic-corpus-{seed}")
    seen, result = set(), {}
    for split, size in sizes:
        result[split] = []
        while len(result[split]) < size:
            sentence = Sentence(sample_clause(lexicon, rng))
            if rng.random() < P_SUBORDINATE:
                sentence.conjunction = rng.choice(sorted(CONJUNCTIONS))
                sentence.subordinate = sample_clause(lexicon, rng)
            if sentence.src() not in seen:
                result[split].append(sentence)
        seen |= {sentence.src() for sentence in result[split]}
    return result


def dictionary_path(out_dir: str, src_lang: str = "src", tgt_lang: str = "tgt") -> str:
    return os.path.join(out_dir, f"dict.{src_lang}-{tgt_lang}.txt")


def write_corpus(out_dir: str, train_size: int = 8000, valid_size: int = 300, test_size: int = 300,
                 seed: int = 1, lexicon_seed: int = 0, src_lang: str = "src", tgt_lang: str = "tgt"):
    """Write ``{train,valid,test}.{src_lang,tgt_lang}`` and the bilingual dictionary (:meth:`Lexicon.word_pairs`)
    into ``out_dir``, never through a link; returns ``{split: (source_path, target_path)}``."""
    lexicon = build_lexicon(lexicon_seed)
    corpus = generate_sentences(list(zip(SPLITS, (train_size, valid_size, test_size))), seed, lexicon=lexicon)
    write_lines(dictionary_path(out_dir, src_lang, tgt_lang), [f"{src} {tgt}" for src, tgt in lexicon.word_pairs()])
    write_splits({split: {src_lang: [s.src() for s in sentences], tgt_lang: [s.tgt() for s in sentences]}
                  for split, sentences in corpus.items()}, out_dir, (src_lang, tgt_lang))
    return {split: tuple(os.path.join(out_dir, f"{split}.{lang}") for lang in (src_lang, tgt_lang)) for split in SPLITS}


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m fusion_lab.synthetic",
        description="Write a deterministic synthetic parallel corpus (SVO source -> SOV target with "
        "agreement morphology): OUT/{train,valid,test}.{src,tgt} and the bilingual dictionary OUT/dict.src-tgt.txt.")
    parser.add_argument("--out", required=True, help="output directory (created if missing)")
    for split, size in zip(SPLITS, (8000, 300, 300)):
        parser.add_argument(f"--{split}-size", type=non_negative_int, default=size)
    parser.add_argument("--seed", type=int, default=1, help="seed of the sentences")
    parser.add_argument("--lexicon-seed", type=int, default=0, help="seed of the vocabulary")
    parser.add_argument("--force", action="store_true", help="write into an --out holding files it did not write")
    args = parser.parse_args(argv)
    names = [f"{split}.{lang}" for split in SPLITS for lang in ("src", "tgt")] + [os.path.basename(dictionary_path(""))]
    claim_out_dir(args.out, names, "fusion-fairseq synthetic", args.force, "fusion-fairseq-synthetic", parser.error)
    sizes = [getattr(args, f"{split}_size") for split in SPLITS]
    for split, paths in write_corpus(args.out, *sizes, args.seed, args.lexicon_seed).items():
        print(f"{split}: {' '.join(paths)}")
    print(f"bilingual dictionary: {dictionary_path(args.out)}")


if __name__ == "__main__":
    main()
