"""The synthetic language pair: deterministic, sizes honoured, and its grammar (agreement,
reordering) visible on the generated text."""

import filecmp
import os
import subprocess
import sys

import pytest

from fusion_lab import synthetic
from fusion_lab.synthetic import (
    CONJUNCTIONS, PREPOSITIONS, PUNCT, TGT_ADJ_AGR, TGT_DET, TGT_VERB_AGR, TGT_VERB_TENSE,
    SRC_FUNCTION_WORDS, TGT_FUNCTION_WORDS, Clause, Entry, NounPhrase, Sentence, build_lexicon, generate_sentences,
    write_corpus,
)

FILES = [f"{split}.{lang}" for split in ("train", "valid", "test") for lang in ("src", "tgt")]
SMALL = dict(train_size=200, valid_size=30, test_size=20)


@pytest.fixture(scope="module")
def lexicon():
    return build_lexicon(0)


@pytest.fixture(scope="module")
def sentences(lexicon):
    return generate_sentences([("sample", 400)], seed=3, lexicon=lexicon)["sample"]


def read_lines(path):
    with open(path, encoding="utf-8") as f:
        return f.read().splitlines()


# ---- determinism and sizes -------------------------------------------------------------------
def test_same_seed_gives_identical_files(tmp_path):
    write_corpus(str(tmp_path / "a"), seed=5, **SMALL)
    write_corpus(str(tmp_path / "b"), seed=5, **SMALL)
    match, mismatch, errors = filecmp.cmpfiles(tmp_path / "a", tmp_path / "b", FILES, shallow=False)
    assert sorted(match) == sorted(FILES) and not mismatch and not errors


def test_different_seeds_give_different_corpora(tmp_path):
    write_corpus(str(tmp_path / "a"), seed=5, **SMALL)
    write_corpus(str(tmp_path / "b"), seed=6, **SMALL)
    for name in FILES:
        assert read_lines(tmp_path / "a" / name) != read_lines(tmp_path / "b" / name), name
    # the lexicon seed changes the vocabulary itself
    assert build_lexicon(0).nouns != build_lexicon(1).nouns
    sentences = [generate_sentences([("s", 20)], seed=5, lexicon_seed=seed)["s"] for seed in (0, 1)]
    assert [(s.src(), s.tgt()) for s in sentences[0]] != [(s.src(), s.tgt()) for s in sentences[1]]


def test_sizes_honoured_and_splits_disjoint(tmp_path):
    paths = write_corpus(str(tmp_path), train_size=123, valid_size=17, test_size=9, seed=2)
    assert set(paths) == {"train", "valid", "test"}
    sizes = {"train": 123, "valid": 17, "test": 9}
    sources = {}
    for split, (src_path, tgt_path) in paths.items():
        src, tgt = read_lines(src_path), read_lines(tgt_path)
        assert len(src) == len(tgt) == sizes[split]
        assert all(line.strip() and line.endswith(" " + PUNCT) for line in src + tgt)
        sources[split] = set(src)
    assert not sources["train"] & sources["valid"]
    assert not sources["train"] & sources["test"]
    assert not sources["valid"] & sources["test"]


def test_zero_size_split_is_an_empty_file(tmp_path):
    write_corpus(str(tmp_path), train_size=5, valid_size=0, test_size=1)
    assert read_lines(tmp_path / "valid.src") == [] and read_lines(tmp_path / "valid.tgt") == []


@pytest.mark.slow
def test_command_line_writes_the_same_corpus(tmp_path):
    subprocess.run(
        [sys.executable, "-m", "fusion_lab.synthetic", "--out", str(tmp_path / "cli"), "--train-size", "50",
         "--valid-size", "7", "--test-size", "5", "--seed", "4"],
        check=True, capture_output=True, text=True, env={**os.environ, "PYTHONWARNINGS": "ignore"},
    )
    write_corpus(str(tmp_path / "api"), train_size=50, valid_size=7, test_size=5, seed=4)
    match, mismatch, errors = filecmp.cmpfiles(tmp_path / "cli", tmp_path / "api", FILES, shallow=False)
    assert sorted(match) == sorted(FILES)
    assert len(read_lines(tmp_path / "cli" / "train.src")) == 50


def test_bilingual_dictionary_lists_translations_seen_in_the_corpus(lexicon, tmp_path):
    paths = write_corpus(str(tmp_path), train_size=400, valid_size=0, test_size=0, seed=3)
    lines = read_lines(synthetic.dictionary_path(str(tmp_path)))
    pairs = [tuple(line.split()) for line in lines]
    assert all(len(pair) == 2 for pair in pairs)
    assert len(pairs) == 2 * len(lexicon.nouns) + len(PREPOSITIONS) + len(CONJUNCTIONS) == len(set(pairs))
    noun = lexicon.nouns[0]
    assert (noun.src, noun.tgt) in pairs
    assert (synthetic.src_noun(noun, "pl"), synthetic.tgt_noun(noun, "pl")) in pairs
    assert ("with", PREPOSITIONS["with"]) in pairs
    # a source noun in a sentence comes with its dictionary translation on the target side
    translation = dict(pairs)
    src_lines, tgt_lines = read_lines(paths["train"][0]), read_lines(paths["train"][1])
    checked = 0
    for src, tgt in zip(src_lines, tgt_lines):
        for word in src.split():
            if word in translation:
                assert translation[word] in tgt.split(), (word, src, tgt)
                checked += 1
    assert checked > 1000


def test_command_line_refuses_an_out_holding_the_users_files(tmp_path, capsys):
    """--out's train.src was replaced without a word."""
    (tmp_path / "train.src").write_text("mine\n")
    with pytest.raises(SystemExit) as exit_info:
        synthetic.main(["--out", str(tmp_path), "--train-size", "5"])
    assert exit_info.value.code == 2
    assert f"--out '{tmp_path}' holds files that fusion-fairseq-synthetic did not write: train.src" in capsys.readouterr().err
    assert (tmp_path / "train.src").read_text() == "mine\n"
    synthetic.main(["--out", str(tmp_path), "--train-size", "5", "--force"])
    assert len(read_lines(tmp_path / "train.src")) == 5
    synthetic.main(["--out", str(tmp_path), "--train-size", "6"])  # its own folder now
    assert len(read_lines(tmp_path / "train.src")) == 6


def test_command_line_rejects_negative_sizes(tmp_path):
    with pytest.raises(SystemExit):
        synthetic.main(["--out", str(tmp_path), "--train-size", "-1"])


def test_vocabulary_size_and_shared_suffixes(lexicon, tmp_path):
    paths = write_corpus(str(tmp_path), train_size=3000, valid_size=0, test_size=0)
    src_types = {w for line in read_lines(paths["train"][0]) for w in line.split()}
    tgt_types = {w for line in read_lines(paths["train"][1]) for w in line.split()}
    assert 200 <= len(src_types) <= 2000 and 300 <= len(tgt_types) <= 2500
    assert src_types <= set(lexicon.src_analysis) | SRC_FUNCTION_WORDS
    assert tgt_types <= set(lexicon.tgt_analysis) | TGT_FUNCTION_WORDS
    # the same agreement suffix recurs on many different stems: something for BPE to learn
    past_msg = {w for w in tgt_types if lexicon.tgt_analysis.get(w, ("",))[0] == "verb"
                and w.endswith(TGT_VERB_TENSE["past"] + TGT_VERB_AGR["m", "sg"])}
    assert len(past_msg) >= 10


# ---- a hand-built example: the exact rules ---------------------------------------------------
def test_a_known_sentence_is_translated_by_the_rules():
    dog = Entry("dog", "kan", gender="m")
    cat = Entry("cat", "gat", gender="f")
    house = Entry("haus", "kas", gender="n")
    big, black = Entry("big", "grand"), Entry("black", "ner")
    chase = Entry("chas", "kur", transitive=True)
    sleep = Entry("sleep", "dorm", transitive=False)
    main = Clause(NounPhrase(dog, "pl", True, [big, black]), chase, "past",
                  obj=NounPhrase(cat, "sg", False, []), preposition="near", pp_object=NounPhrase(house, "sg", True, [big]))
    sub = Clause(NounPhrase(cat, "sg", True, [black]), sleep, "fut")
    sentence = Sentence(main, "because", sub)
    assert sentence.src() == "the big black dogs chased a cat near the big haus because the black cat will sleep ."
    # S PP O V, adjectives after the noun in mirror order, agreement with the noun, verb agreeing
    # with the subject (m.pl / f.sg), future marked on the verb, verb-final in the subordinate clause
    assert sentence.tgt() == "li kanen neri grandi lu kas grandum pres una gat kuretaki porke la gat nera dormovek ."
    present = Sentence(Clause(NounPhrase(cat, "sg", False, []), sleep, "pres"))
    assert present.src() == "a cat sleeps ."
    assert present.tgt() == "una gat dormek ."
    plural = Sentence(Clause(NounPhrase(house, "pl", False, []), sleep, "pres"))
    assert plural.src() == "some hauss sleep ."
    assert plural.tgt() == "unia kasar dormoki ."


# ---- the grammar holds on generated text -----------------------------------------------------
def parse_target_clauses(line, lexicon):
    """Split a target sentence into clauses (at conjunctions) and each clause into noun phrases
    [(det, noun, [adjectives]), ...], postpositions and the verb, using the lexicon's analyses."""
    tokens = line.split()
    assert tokens[-1] == PUNCT
    clauses, current = [], []
    for token in tokens[:-1]:
        if token in CONJUNCTIONS.values():
            clauses.append(current)
            current = []
        else:
            current.append(token)
    clauses.append(current)
    parsed = []
    for clause in clauses:
        items, i = [], 0
        while i < len(clause):
            token = clause[i]
            if token in PREPOSITIONS.values():
                items.append(("postp", token))
                i += 1
                continue
            category, entry, features = lexicon.tgt_analysis[token] if token in lexicon.tgt_analysis else ("det", None, ())
            if category == "det":
                noun_category, noun, (number,) = lexicon.tgt_analysis[clause[i + 1]]
                assert noun_category == "noun", clause
                adjectives, j = [], i + 2
                while j < len(clause) and lexicon.tgt_analysis.get(clause[j], ("",))[0] == "adj":
                    adjectives.append(lexicon.tgt_analysis[clause[j]])
                    j += 1
                items.append(("np", token, noun, number, adjectives))
                i = j
            else:
                assert category == "verb", (token, clause)
                items.append(("verb", entry, features))
                i += 1
        parsed.append(items)
    return parsed


def test_target_agreement_holds(sentences, lexicon):
    checked_adjectives = checked_verbs = 0
    for sentence in sentences:
        for clause in parse_target_clauses(sentence.tgt(), lexicon):
            noun_phrases = [item for item in clause if item[0] == "np"]
            for _, det, noun, number, adjectives in noun_phrases:
                # the determiner agrees with the noun's lexical gender and number
                assert det in (TGT_DET[True][noun.gender, number], TGT_DET[False][noun.gender, number])
                for _, adjective, features in adjectives:
                    assert features == (noun.gender, number)
                    checked_adjectives += 1
            _, det, subject, subject_number, _ = noun_phrases[0]
            _, verb, (tense, gender, number) = clause[-1]
            # the verb agrees with the subject (first noun phrase of its clause)
            assert (gender, number) == (subject.gender, subject_number)
            checked_verbs += 1
    assert checked_adjectives > 100 and checked_verbs > len(sentences)


def test_target_is_verb_final_with_postpositions(sentences, lexicon):
    with_pp = 0
    for sentence in sentences:
        for clause in parse_target_clauses(sentence.tgt(), lexicon):
            kinds = [item[0] for item in clause]
            assert kinds.count("verb") == 1 and kinds[-1] == "verb", kinds
            for i, kind in enumerate(kinds):
                if kind == "postp":  # a postposition closes the noun phrase before it
                    assert kinds[i - 1] == "np"
                    with_pp += 1
    assert with_pp > 50


def test_source_is_svo_with_prenominal_adjectives(sentences, lexicon):
    for sentence in sentences:
        for clause in (sentence.main, sentence.subordinate):
            if clause is None:
                continue
            words = clause.src()
            n_subject = len(clause.subject.adjectives) + 2
            # DET ADJ* NOUN ...: adjectives in front of their noun
            assert [lexicon.src_analysis[w][0] for w in words[1:n_subject]] == ["adj"] * (n_subject - 2) + ["noun"]
            # ... then the verb right after the subject (SVO)
            verb_word = words[n_subject + (1 if words[n_subject] == synthetic.SRC_FUTURE else 0)]
            assert lexicon.src_analysis[verb_word][0] == "verb"
            assert lexicon.src_analysis[verb_word][1] == clause.verb


def test_reordering_between_source_and_target(sentences, lexicon):
    mirrored = moved_pp = 0
    for sentence in sentences:
        for clause in (sentence.main, sentence.subordinate):
            if clause is None:
                continue
            src, tgt = clause.src(), clause.tgt()
            # the verb moves from after the subject (source) to the end of the clause (target)
            assert lexicon.tgt_analysis[tgt[-1]][1] == clause.verb
            # adjectives: before the noun in mirror order in the source, after it in the target
            for np in (clause.subject, clause.obj, clause.pp_object):
                if np is None or len(np.adjectives) < 2:
                    continue
                src_adjs = [w for w in np.src() if lexicon.src_analysis.get(w, ("",))[0] == "adj"]
                tgt_adjs = [lexicon.tgt_analysis[w][1].src for w in np.tgt() if lexicon.tgt_analysis.get(w, ("",))[0] == "adj"]
                assert tgt_adjs == list(reversed(src_adjs))
                assert np.tgt()[2:] == [a.tgt + TGT_ADJ_AGR[np.noun.gender, np.number] for a in reversed(np.adjectives)]
                mirrored += 1
            # the prepositional phrase: last in the source clause, before the object in the target
            if clause.preposition is not None:
                assert src[-len(clause.pp_object.src()) - 1] == clause.preposition
                pp = clause.pp_object.tgt() + [PREPOSITIONS[clause.preposition]]
                start = len(clause.subject.tgt())
                assert tgt[start:start + len(pp)] == pp
                moved_pp += 1
    assert mirrored > 10 and moved_pp > 50


def test_source_does_not_mark_gender(sentences, lexicon):
    """Gender is a lexical property of the target noun: the source word of a noun phrase looks the
    same whatever its target gender (what makes the agreement depend on word identity)."""
    by_gender = {g: set() for g in ("m", "f", "n")}
    for sentence in sentences:
        np = sentence.main.subject
        by_gender[np.noun.gender].add(tuple(w for w in np.src() if w not in (synthetic.SRC_DEFINITE,)))
    for gender, phrases in by_gender.items():
        assert phrases, gender
    determiners = {g: {s.main.subject.src()[0] for s in sentences if s.main.subject.noun.gender == g} for g in by_gender}
    assert determiners["m"] == determiners["f"] == determiners["n"]
