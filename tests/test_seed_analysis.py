"""The paired-seed analysis (fusion_lab/seed_analysis.py): BLEU from sufficient statistics, the
paired test, Holm, power, the learning-rate rule, and the simulation of the new and the old verdict rule
under no effect at the seed spread of the committed 6+6 comparison."""

import json
import math
import os

import numpy as np
import pytest
from scipy import stats

from fusion_lab import seed_analysis as sa
import seed_simulation as sim
from fusion_lab.comparison_report import corpus_bleu, sentence_statistics

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEEP = os.path.join(REPO, "examples", "comparison", "deep", "results.json")
FINE_TUNED = ("transformer_continued", "deeprep_finetuned")  # 1,000 updates from the Transformer's model


def synthetic_statistics(rng, sentences, quality):
    """sacreBLEU-shaped statistics of ``sentences`` made-up sentences whose n-gram precision grows with quality."""
    ref_len = rng.integers(6, 20, sentences)
    sys_len = np.maximum(ref_len + rng.integers(-3, 4, sentences), 1)
    totals = np.stack([np.maximum(sys_len - n, 0) for n in range(4)], axis=1)
    matches = rng.binomial(totals, np.clip(quality - 0.12 * np.arange(4), 0.01, 0.99))
    return np.column_stack([matches, totals, sys_len, ref_len]).astype(np.int64)


# --- BLEU --------------------------------------------------------------------------------------------------

def test_bleu_equals_sacrebleus_compute_bleu_including_smoothing_and_brevity():
    rng = np.random.default_rng(0)
    cases = [synthetic_statistics(rng, rng.integers(1, 30), rng.uniform(0.05, 0.9)).sum(0) for _ in range(200)]
    cases += [np.array([3, 0, 0, 0, 5, 4, 3, 2, 5, 9]), np.array([0, 0, 0, 0, 5, 4, 3, 2, 5, 5]),
              np.array([2, 1, 0, 0, 2, 1, 0, 0, 2, 7])]  # a zero match, no match, an order with no n-gram
    expected = [corpus_bleu(c) for c in cases]
    assert np.allclose(sa.bleu(np.array(cases)), expected, atol=1e-9)
    assert np.allclose([sa.bleu(c) for c in cases], expected, atol=1e-9)


def test_bleu_without_brevity_penalty_differs_only_for_short_output():
    short = np.array([8, 6, 4, 2, 10, 9, 8, 7, 10, 12])
    long = np.array([8, 6, 4, 2, 10, 9, 8, 7, 10, 9])
    assert sa.bleu(short, brevity_penalty=False) == pytest.approx(corpus_bleu(short) / math.exp(1 - 12 / 10))
    assert sa.bleu(long, brevity_penalty=False) == pytest.approx(corpus_bleu(long))


def test_the_sentence_bootstrap_draws_the_same_sentences_for_every_run():
    rng = np.random.default_rng(1)
    run = synthetic_statistics(rng, 300, 0.6)
    other = synthetic_statistics(rng, 300, 0.6)
    found = sa.sentence_bootstrap_bleu([run, other, run], 700, seed=5, chunk=256)
    assert found.shape == (700, 3)
    assert np.array_equal(found[:, 0], found[:, 2])  # one draw per replicate, shared
    assert not np.array_equal(found[:, 0], found[:, 1])
    assert np.array_equal(found, sa.sentence_bootstrap_bleu([run, other, run], 700, seed=5))  # fixed generator
    assert abs(found[:, 0].mean() - sa.bleu(run.sum(0))) < 0.3
    with pytest.raises(ValueError, match="sentence counts differ"):
        sa.sentence_bootstrap_bleu([run, other[:-1]], 10)


# --- one comparison, Holm, power -----------------------------------------------------------------------------

def test_without_sentence_variance_the_test_is_the_paired_t_test():
    system, baseline = np.array([34.1, 34.6, 33.8, 34.4]), np.array([33.7, 33.9, 33.9, 33.8])
    found = sa.paired_test(system - baseline, 0.0)
    assert found["p_value"] == pytest.approx(stats.ttest_rel(system, baseline).pvalue)
    low, high = stats.t.interval(0.95, 3, loc=found["difference"], scale=stats.sem(system - baseline))
    assert found["ci"] == pytest.approx([low, high])


def test_sentence_variance_widens_the_interval_and_raises_p():
    d = [0.3, 0.5, 0.1, 0.4, 0.2, 0.6]
    alone, combined = sa.paired_test(d, 0.0), sa.paired_test(d, 0.04)
    assert combined["se"] == pytest.approx(math.sqrt(np.var(d, ddof=1) / 6 + 0.04))
    assert combined["ci"][0] < alone["ci"][0] and combined["ci"][1] > alone["ci"][1]
    assert combined["p_value"] > alone["p_value"]


def test_one_seed_or_a_negative_variance_is_refused():
    with pytest.raises(ValueError, match="at least 2"):
        sa.paired_test([0.4], 0.0)
    with pytest.raises(ValueError, match="sentence_variance"):
        sa.paired_test([0.4, 0.2], -0.1)
    with pytest.raises(ValueError, match="at least 2"):
        sa.minimum_detectable_effect(0.3, 1)


def test_holm_adjusts_step_down_and_stays_monotone():
    assert sa.holm({"a": 0.01, "b": 0.04, "c": 0.03}) == pytest.approx({"a": 0.03, "b": 0.06, "c": 0.06})
    assert sa.holm({"a": 0.5, "b": 0.6}) == pytest.approx({"a": 1.0, "b": 1.0})


def test_the_minimum_detectable_effect_is_found_with_the_stated_power():
    rng = np.random.default_rng(2)
    sd, n = 0.32, 6
    effect = sa.minimum_detectable_effect(sd, n)
    d = rng.normal(effect, sd, (40000, n))
    p = 2 * stats.t.sf(np.abs(d.mean(1)) / (d.std(1, ddof=1) / math.sqrt(n)), n - 1)
    assert np.mean(p <= sa.ALPHA) == pytest.approx(sa.POWER, abs=0.01)
    # many seeds: the normal approximation (z_0.975 + z_0.8) x SE
    assert sa.minimum_detectable_effect(1.0, 10000, 0.0) == pytest.approx(2.8016 / 100, rel=1e-3)
    assert sa.minimum_detectable_effect(sd, n, 0.05) > effect  # sentence variance costs resolution


# --- the family ----------------------------------------------------------------------------------------------

def family(rng, sentences=400, seeds=(1, 2, 3, 4, 5, 6)):
    quality = {"base": 0.50, "same": 0.50, "good": 0.56, "bad": 0.44}
    return {name: {k: synthetic_statistics(rng, sentences, q + rng.normal(0, 0.005)) for k in seeds}
            for name, q in quality.items()}


def test_the_family_finds_real_effects_and_not_the_null():
    runs = family(np.random.default_rng(3))
    found = sa.compare_with_baselines(runs, {"same": "base", "good": "base", "bad": "base"})
    assert found["good"]["verdict"] == "better" and found["bad"]["verdict"] == "worse"
    assert found["same"]["verdict"] == "undecided"
    for f in found.values():
        assert f["p_holm"] >= f["p_value"]
        assert f["monte_carlo"]["bound_se"] < sa.MAX_MONTE_CARLO_SE and f["monte_carlo"]["settled"]
        assert f["minimum_detectable_effect"]["holm_first_step"] > f["minimum_detectable_effect"]["holm_last_step"]
        k = 2
        assert f["per_seed"][k] == pytest.approx(float(sa.bleu(runs[[n for n in runs if found.get(n) is f][0]][k]
                                                               .sum(0)) - sa.bleu(runs["base"][k].sum(0))))
    again = sa.compare_with_baselines(runs, {"same": "base", "good": "base", "bad": "base"})
    assert again == found  # a fixed generator: the same numbers every time


def test_an_undecidable_bound_gets_more_replicates_not_a_verdict_by_chance():
    # an effect whose Holm-adjusted p sits at 0.05 up to Monte-Carlo error makes the replicates double
    runs = family(np.random.default_rng(4), sentences=150)
    loose = sa.compare_with_baselines(runs, {"good": "base"}, replicates=200)
    assert loose["good"]["monte_carlo"]["replicates"] > 200  # 200 alone leaves the bound's SE above 0.01
    assert loose["good"]["monte_carlo"]["bound_se"] < sa.MAX_MONTE_CARLO_SE


def test_seeds_that_do_not_pair_are_refused():
    runs = family(np.random.default_rng(5), sentences=50)
    del runs["good"][6]
    with pytest.raises(ValueError, match=r"good has seeds \[1, 2, 3, 4, 5\] and its baseline base"):
        sa.compare_with_baselines(runs, {"good": "base"})
    with pytest.raises(ValueError, match="no runs of 'nothing'"):
        sa.compare_with_baselines(runs, {"nothing": "base"})


def test_holm_not_the_raw_p_decides_the_verdict():
    # each raw p is below alpha; Holm's adjusted p of both is 0.06
    assert sa._verdicts({"a": 0.03, "b": 0.04}, {"a": 1.0, "b": -1.0}, 0.05) == {"a": "undecided", "b": "undecided"}
    assert sa._verdicts({"a": 0.02, "b": 0.04}, {"a": 1.0, "b": -1.0}, 0.05) == {"a": "better", "b": "worse"}


def test_a_difference_that_is_not_finite_is_refused():
    with pytest.raises(ValueError, match=r"differences: \[0.3, nan, 0.2\] are not all finite"):
        sa.paired_test([0.3, float("nan"), 0.2], 0.01)
    with pytest.raises(ValueError, match="not all finite"):
        sa.paired_test([0.3, float("inf")], 0.01)


def shared_test_set_runs(rng, configurations, seeds=(1, 2, 3, 4, 5, 6), sentences=150, interaction=0.06):
    """No configuration better than another, on one test set: every run translates the same sentences (their
    reference lengths fixed), each configuration is a little better on some sentences and worse on others
    (its per-sentence offset, the same for all its seeds, mean 0), and seed k moves every configuration alike."""
    ref_len = rng.integers(6, 20, sentences)
    seed_effect = {k: rng.normal(0, 0.005) for k in seeds}
    runs = {}
    for name in configurations:
        offset = rng.normal(0, interaction, sentences)
        runs[name] = {}
        for k in seeds:
            sys_len = np.maximum(ref_len + rng.integers(-3, 4, sentences), 1)
            totals = np.stack([np.maximum(sys_len - n, 0) for n in range(4)], axis=1)
            quality = 0.5 + seed_effect[k] + offset + rng.normal(0, 0.005)
            matches = rng.binomial(totals, np.clip(quality[:, None] - 0.12 * np.arange(4), 0.01, 0.99))
            runs[name][k] = np.column_stack([matches, totals, sys_len, ref_len]).astype(np.int64)
    return runs


def test_the_sentence_variance_is_the_bootstrap_variance_of_the_mean_paired_difference():
    """Recomputed apart from the analysis: its own resamples (indices, not counts), BLEU per run, the difference
    per seed, their mean over the seeds, the variance of that mean."""
    runs = shared_test_set_runs(np.random.default_rng(7), ["base", "x"])
    found = sa.compare_with_baselines(runs, {"x": "base"})["x"]
    rng, sentences, means = np.random.default_rng(70), 150, []
    for _ in range(8):
        picks = rng.integers(0, sentences, (500, sentences))
        bleu = {key: sa.bleu(runs[key[0]][key[1]][picks].sum(1)) for key in [(n, k) for n in runs for k in runs[n]]}
        means.append(np.mean([bleu["x", k] - bleu["base", k] for k in runs["x"]], axis=0))
    direct = np.concatenate(means).var(ddof=1)
    assert found["sentence_variance"] == pytest.approx(direct, rel=0.15)
    assert found["sentence_variance"] > found["paired_sd"] ** 2 / 6  # here the sentence term dominates, as it did


@pytest.mark.slow
def test_the_rule_as_it_decides_keeps_its_false_positive_rate_with_no_effect():
    """Null families run through compare_with_baselines itself: 12 configurations and their baseline, each its
    own test set draw; the raw p of a comparison falls at or below alpha at most at the nominal rate, and
    Holm's verdict almost never decides."""
    rng = np.random.default_rng(8)
    configurations = ["base", *(f"c{i}" for i in range(12))]
    p_values, decided = [], 0
    for _ in range(12):
        found = sa.compare_with_baselines(shared_test_set_runs(rng, configurations),
                                          {name: "base" for name in configurations[1:]})
        p_values += [f["p_value"] for f in found.values()]
        decided += any(f["verdict"] != "undecided" for f in found.values())
    assert np.mean(np.array(p_values) <= sa.ALPHA) <= 0.06
    assert decided <= 1


# --- beside BLEU ---------------------------------------------------------------------------------------------

def test_secondary_metrics_per_test_set_and_together():
    from sacrebleu.metrics import BLEU, CHRF

    refs = {"a": ["a man rides a red bike down the street .", "two dogs play in the snow ."],
            "b": ["a woman is reading a book in the park .", "children are playing football on the beach ."]}
    hyps = {"a": ["a man rides a bike down the street .", "two dogs play in snow ."],
            "b": ["a woman reads a book .", "children play football on a beach ."]}
    found = sa.secondary_metrics(hyps, refs)
    assert sorted(found) == ["a", "all", "b"]
    every_h, every_r = hyps["a"] + hyps["b"], refs["a"] + refs["b"]
    assert found["all"]["bleu"] == pytest.approx(BLEU(lowercase=True).corpus_score(every_h, [every_r]).score)
    assert found["b"]["chrf"] == pytest.approx(CHRF(lowercase=True).corpus_score(hyps["b"], [refs["b"]]).score)
    assert found["b"]["length_ratio"] < 1 and found["b"]["bleu_without_brevity_penalty"] > found["b"]["bleu"]
    with pytest.raises(ValueError, match="test sets"):
        sa.secondary_metrics(hyps, {"a": refs["a"]})


def test_secondary_summary_pairs_the_seeds():
    run = lambda bleu, chrf: {"all": {"bleu": bleu, "chrf": chrf, "bleu_without_brevity_penalty": bleu,
                                      "length_ratio": 1.0}}
    metrics = {"base": {1: run(30, 50), 2: run(32, 52)}, "m": {1: run(31, 49), 2: run(34, 52)}}
    found = sa.secondary_summary(metrics, {"m": "base"})
    assert found["m"]["all"]["bleu"] == {"mean": 32.5, "difference": 1.5}
    assert found["m"]["all"]["chrf"] == {"mean": 50.5, "difference": -0.5}
    assert found["base"]["all"]["bleu"]["difference"] is None


# --- the learning rate ----------------------------------------------------------------------------------------

def test_the_learning_rate_rule():
    assert sa.choose_learning_rate({5e-4: 2.70, 1e-3: 2.64, 2e-3: 2.60}) == 2e-3
    assert sa.choose_learning_rate({5e-4: 2.70, 1e-3: 2.62, 2e-3: 2.60}) == 1e-3  # within 0.02 bits: 1e-3
    assert sa.choose_learning_rate({5e-4: 2.59, 1e-3: 2.64, 2e-3: 2.59}) == 5e-4  # an exact tie: the smaller
    assert sa.choose_learning_rate({5e-4: 2.70, 1e-3: float("nan"), 2e-3: 2.65}) == 2e-3  # 1e-3 diverged
    with pytest.raises(ValueError, match="exactly"):
        sa.choose_learning_rate({1e-3: 2.6, 2e-3: 2.5})
    with pytest.raises(ValueError, match="once every run of the grid has finished"):
        sa.choose_learning_rate({5e-4: 2.7, 1e-3: None, 2e-3: 2.6})
    with pytest.raises(ValueError, match="every run of the grid diverged"):
        sa.choose_learning_rate({5e-4: math.inf, 1e-3: math.nan, 2e-3: math.nan})


# --- the design's noise and the rules under no effect -------------------------------------------------------

def test_variance_components_split_a_shared_seed_effect_from_the_rest():
    seed_effect = {1: 0.0, 2: 0.4, 3: 0.2}
    exact = {name: {k: mu + seed_effect[k] for k in (1, 2, 3)} for name, mu in (("a", 30), ("b", 31), ("c", 33))}
    found = sim.seed_variance_components(exact)
    assert found["run_sd"] == pytest.approx(0, abs=1e-6)
    assert found["seed_sd"] == pytest.approx(found["pooled_sd"]) == pytest.approx(np.std([0, 0.4, 0.2], ddof=1))


def observed_noise():
    """The 6+6 comparison's noise from its committed results: the 10 configurations trained from scratch for
    3,000 updates (not the two continued from the Transformer's model), per seed, on the four test sets
    together; the sentence part from the per-seed sacreBLEU paired bootstraps (95% interval / 3.92)."""
    with open(DEEP, encoding="utf-8") as f:
        methods = [m for m in json.load(f)["methods"] if m["method"] not in FINE_TUNED]
    scores = {m["method"]: {run["seed"]: run["test"]["average"]["all"] for run in m["runs"]} for m in methods}
    widths = [run["paired"]["average"]["ci95"] for m in methods for run in m["runs"] if run["paired"]]
    paired_sentence_sd = float(np.mean([(high - low) / (2 * 1.959964) for low, high in widths]))
    return sim.seed_variance_components(scores), paired_sentence_sd


def test_the_observed_spread_of_the_committed_comparison():
    components, paired_sentence_sd = observed_noise()
    # the figures the plan (examples/comparison/reviewed/plan.md) states
    assert components["pooled_sd"] == pytest.approx(0.262, abs=0.0005) and components["pooled_df"] == 16
    assert components["run_sd"] == pytest.approx(0.170, abs=0.0005)
    assert components["seed_sd"] == pytest.approx(0.200, abs=0.0005)
    assert paired_sentence_sd == pytest.approx(0.261, abs=0.0005)


def noise_models():
    components, paired_sentence_sd = observed_noise()
    sentence_sd = paired_sentence_sd / math.sqrt(2)  # c_m - c_b has the paired bootstrap's SD
    observed = sim.NoiseModel(components["seed_sd"], components["run_sd"], sentence_sd)
    # the same pooled spread, none of it shared between configurations: the old rule's worst case
    unshared = sim.NoiseModel(0.0, components["pooled_sd"], sentence_sd)
    return observed, unshared


@pytest.mark.parametrize("which", [0, 1])
def test_the_new_rule_keeps_its_false_positive_rate_at_6_seeds(which):
    noise = noise_models()[which]
    rng = np.random.default_rng(60 + which)
    single = sim.rate_with_margin(sim.new_rule_rejects(sim.simulate_null(noise, 6, 40000, rng), noise))
    assert single["high"] <= sa.ALPHA, single
    # Holm over a family of 13 configurations against one baseline: the family-wise rate
    family = sim.rate_with_margin(sim.new_rule_rejects(sim.simulate_null(noise, 6, 8000, rng, configurations=14), noise))
    assert family["high"] <= sa.ALPHA, family


def test_the_old_rule_exceeds_its_false_positive_rate_at_2_seeds_and_as_it_was_run():
    observed, unshared = noise_models()
    rng = np.random.default_rng(6)
    at_2 = sim.rate_with_margin(sim.old_rule_rejects(sim.simulate_null(observed, 2, 25000, rng), observed, rng))
    assert at_2["low"] > sa.ALPHA, at_2
    # as the 6+6 comparison ran it: a third seed where the first two left the verdict undecided
    as_run = sim.rate_with_margin(sim.old_procedure_rejects(sim.simulate_null(observed, 3, 10000, rng), observed, rng))
    assert as_run["low"] > sa.ALPHA, as_run
    # at a fixed 3 seeds it exceeds 5% when the seed spread is not shared between configurations (at the
    # observed share it is about 4.6%: the shared seed effect, which it does not pair, widens its interval)
    at_3 = sim.rate_with_margin(sim.old_rule_rejects(sim.simulate_null(unshared, 3, 10000, rng), unshared, rng))
    assert at_3["low"] > sa.ALPHA, at_3
