"""The analysis of a comparison whose seeds are paired across configurations, fixed in code before the
scores it governs exist (:data:`ANALYSIS_RULE`, :data:`LEARNING_RATE_RULE`).

Seed k trains every configuration on the same data order, so configuration m's score on seed k and its
baseline's share that seed's effect. The model, on the four test sets together:

    BLEU(m, k) = mu_m + s_k + e_mk + c_m(T)

mu_m: the configuration (a fixed effect); s_k: the seed, shared by every configuration; e_mk: the rest of
a run's seed-to-seed spread; c_m(T): what sampling the test sentences T adds. The paired differences
d_k = BLEU(m, k) - BLEU(b, k) remove s_k. Their mean estimates mu_m - mu_b with the variance

    V = var(d) / n  +  v_sentences

where var(d) is the between-seed variance of the paired differences (n - 1 degrees of freedom) and
v_sentences the variance of the mean difference over resamples of the test sentences, one draw of sentence
indices shared by every seed of both configurations (:func:`sentence_bootstrap_bleu`). The statistic
mean(d) / sqrt(V) is referred to Student's t with n - 1 degrees of freedom: exact when the sentence term
is 0, conservative otherwise (its distribution then lies between that t and the normal). var(d) measured
on one test set also holds the part of the sentence noise that differs between seeds, which the bootstrap
counts again: conservative too. Holm's step-down correction runs over the family of every configuration
against its baseline. Only BLEU decides; chrF, BLEU without the brevity penalty and the output's length
over the reference's stand beside it (:func:`secondary_metrics`).

Numbers: numpy, scipy.stats and sacrebleu; pure functions (no files, no clock).
"""

import math
from typing import Dict, List, Mapping, Optional, Sequence

import numpy as np
from scipy import optimize, stats

#: the metric that decides, stated before any score of the round exists
DECIDING_METRIC = "sacreBLEU on the four Multi30k test sets together (the comparison's lowercased signature)"
SECONDARY_METRICS = ("chrf", "bleu_without_brevity_penalty", "length_ratio")
ALPHA = 0.05
POWER = 0.8
#: the sentence bootstrap: a fixed generator; replicates doubled until no verdict depends on them
SENTENCE_SEED = 12345
SENTENCE_REPLICATES = 2000
MAX_SENTENCE_REPLICATES = 64000
MAX_MONTE_CARLO_SE = 0.01  # BLEU, the Monte-Carlo standard error of every interval bound
MONTE_CARLO_MARGIN = 3.0  # every verdict is the same with the sentence variance moved by this many of its SEs

ANALYSIS_RULE = (
    f"BLEU decides ({DECIDING_METRIC}). Per configuration m and baseline b with the same seeds 1..n: "
    "d_k = BLEU(m, k) - BLEU(b, k); Δ = mean(d); V = var(d)/n + the variance of mean(d) over resamples of the "
    "test sentences (one draw of indices shared by every run; a fixed generator, replicates doubled from "
    f"{SENTENCE_REPLICATES} until every bound's Monte-Carlo SE is below {MAX_MONTE_CARLO_SE} BLEU and every "
    f"verdict holds with that variance moved by {MONTE_CARLO_MARGIN:g} of its SEs); p from Student's t with n - 1 "
    "degrees of freedom for Δ / sqrt(V); Holm's correction over every configuration against its baseline; "
    f"better / worse: Holm-adjusted p <= {ALPHA} with Δ above / below 0, otherwise undecided. The seeds are "
    "fixed before training; none is added because of a result.")


# --- BLEU from sacreBLEU's sufficient statistics, for many resamples at once -------------------------------

def bleu(sums: np.ndarray, brevity_penalty: bool = True) -> np.ndarray:
    """Corpus BLEU (sacreBLEU's ``compute_bleu``, ``exp`` smoothing) of statistics summed over sentences,
    along the last axis as :func:`fusion_lab.comparison_report.sentence_statistics` orders them:
    matches n = 1..4, totals n = 1..4, output length, reference length. Any leading axes."""
    sums = np.asarray(sums, dtype=np.float64)
    correct, total, sys_len, ref_len = sums[..., 0:4], sums[..., 4:8], sums[..., 8], sums[..., 9]
    zero = correct == 0
    halvings = np.cumsum(zero, axis=-1)  # exp smoothing: 1 / 2^k for the k-th order without a match
    with np.errstate(divide="ignore", invalid="ignore"):
        precision = np.where(zero, 1.0 / (2.0 ** halvings * total), correct / total)
        log_mean = np.where(total > 0, np.log(np.where(total > 0, precision, 1.0)), -np.inf).mean(axis=-1)
        score = 100.0 * np.exp(log_mean)
        if brevity_penalty:
            score = score * np.where(sys_len < ref_len, np.exp(1.0 - ref_len / sys_len), 1.0)
    return np.where(correct.any(axis=-1) & (sys_len > 0), score, 0.0)


def sentence_bootstrap_bleu(runs: Sequence[np.ndarray], replicates: int, seed: int = SENTENCE_SEED,
                            chunk: int = 500) -> np.ndarray:
    """BLEU of every run (each an array sentences x 10, the same sentences in the same order) on
    ``replicates`` resamples of the sentences with replacement, one draw shared by all runs:
    an array replicates x runs."""
    sentences = len(runs[0])
    if any(len(run) != sentences for run in runs):
        raise ValueError(f"runs: sentence counts differ ({sorted({len(run) for run in runs})}); every run must "
                         "hold the statistics of the same test sentences")
    stacked = np.concatenate([np.asarray(run, dtype=np.float64) for run in runs], axis=1)  # sentences x 10·runs
    rng = np.random.default_rng(seed)
    out = []
    for start in range(0, replicates, chunk):
        counts = rng.multinomial(sentences, np.full(sentences, 1.0 / sentences), size=min(chunk, replicates - start))
        out.append(bleu((counts @ stacked).reshape(len(counts), len(runs), 10)))
    return np.concatenate(out)


# --- one paired comparison, Holm, power ---------------------------------------------------------------------

def paired_test(differences: Sequence[float], sentence_variance: float, alpha: float = ALPHA) -> dict:
    """Δ, its standard error, the two-sided p-value and the 1 - alpha interval of :data:`ANALYSIS_RULE` for the
    per-seed paired differences and the sentence variance of their mean."""
    d = np.asarray(differences, dtype=np.float64)
    if d.ndim != 1 or len(d) < 2:
        raise ValueError(f"differences: {len(np.atleast_1d(d))} paired seed(s); the between-seed variance needs at "
                         "least 2")
    if not np.isfinite(d).all():
        raise ValueError(f"differences: {d.tolist()} are not all finite; a run whose BLEU is not a number has no "
                         "paired difference")
    if not sentence_variance >= 0:
        raise ValueError(f"sentence_variance: {sentence_variance}; must be a variance (>= 0)")
    n, mean, sd = len(d), float(d.mean()), float(d.std(ddof=1))
    se = math.sqrt(sd ** 2 / n + sentence_variance)
    critical = float(stats.t.ppf(1 - alpha / 2, n - 1))
    p = float(2 * stats.t.sf(abs(mean) / se, n - 1)) if se > 0 else float(mean == 0)
    return {"difference": mean, "paired_sd": sd, "seeds": n, "se": se, "sentence_variance": float(sentence_variance),
            "p_value": p, "ci": [mean - critical * se, mean + critical * se], "alpha": alpha}


def holm(p_values: Mapping[str, float]) -> Dict[str, float]:
    """Holm's step-down adjusted p-values: p_(i) times the number of hypotheses not yet rejected, made
    monotone, at most 1. A comparison is rejected at level alpha when its adjusted p is <= alpha."""
    order = sorted(p_values, key=lambda name: (p_values[name], name))
    adjusted, running = {}, 0.0
    for rank, name in enumerate(order):
        running = max(running, min(1.0, (len(order) - rank) * p_values[name]))
        adjusted[name] = running
    return adjusted


def minimum_detectable_effect(paired_sd: float, seeds: int, sentence_variance: float = 0.0,
                              alpha: float = ALPHA, power: float = POWER) -> float:
    """The true Δ that :func:`paired_test` at level ``alpha`` finds with probability ``power``, given the SD of
    the paired differences and the sentence variance of their mean: the noncentral t with seeds - 1 degrees of
    freedom and noncentrality Δ / SE (exact without the sentence term, an approximation with it)."""
    if seeds < 2:
        raise ValueError(f"seeds: {seeds}; the between-seed variance needs at least 2")
    se = math.sqrt(paired_sd ** 2 / seeds + sentence_variance)
    df = seeds - 1
    critical = stats.t.ppf(1 - alpha / 2, df)

    # P(|Z + noncentrality| > critical sqrt(W / df)), W ~ chi2(df), over W's quantiles (scipy's nct is NaN far out)
    cuts = critical * np.sqrt(stats.chi2.ppf((np.arange(4000) + 0.5) / 4000, df) / df)

    def shortfall(noncentrality):
        return float(np.mean(stats.norm.sf(cuts - noncentrality) + stats.norm.cdf(-cuts - noncentrality))) - power

    high = critical + 4.0
    while shortfall(high) < 0:  # power grows with the noncentrality: widen the bracket until it holds the root
        high *= 2
    return float(optimize.brentq(shortfall, 0.0, high)) * se


# --- the family against the baselines -----------------------------------------------------------------------

def compare_with_baselines(runs: Mapping[str, Mapping[int, np.ndarray]], baselines: Mapping[str, str],
                           alpha: float = ALPHA, seed: int = SENTENCE_SEED,
                           replicates: int = SENTENCE_REPLICATES) -> Dict[str, dict]:
    """:data:`ANALYSIS_RULE` for every configuration in ``baselines`` (configuration -> its baseline) from the
    sentence statistics of its runs (``runs[configuration][seed]``, sentences x 10 on the four test sets
    together). Returns, per configuration: Δ, the 95% interval, p, Holm's p, the verdict, the smallest Δ the
    design finds with 80% power, and the Monte-Carlo record of the sentence bootstrap."""
    seeds = _paired_seeds(runs, baselines)
    while True:
        found = _compare_once(runs, baselines, seeds, alpha, seed, replicates)
        if all(f["monte_carlo"]["settled"] for f in found.values()):
            return found
        if replicates >= MAX_SENTENCE_REPLICATES:
            unsettled = sorted(name for name, f in found.items() if not f["monte_carlo"]["settled"])
            raise ValueError(f"replicates: {replicates} sentence resamples leave {', '.join(unsettled)} within "
                             "Monte-Carlo error of the decision; the verdict cannot be given")
        replicates *= 2


def _paired_seeds(runs, baselines) -> Dict[str, List[int]]:
    seeds = {}
    for name, baseline in baselines.items():
        for which in (name, baseline):
            if which not in runs:
                raise ValueError(f"runs: no runs of {which!r} (known: {', '.join(sorted(runs))})")
        if sorted(runs[name]) != sorted(runs[baseline]):
            raise ValueError(f"seeds: {name} has seeds {sorted(runs[name])} and its baseline {baseline} "
                             f"{sorted(runs[baseline])}; the analysis pairs the same seeds, never a subset")
        seeds[name] = sorted(runs[name])
    return seeds


def _compare_once(runs, baselines, seeds, alpha, seed, replicates) -> Dict[str, dict]:
    keys = sorted({(name, k) for name in runs for k in runs[name]})
    index = {key: i for i, key in enumerate(keys)}
    resampled = sentence_bootstrap_bleu([runs[name][k] for name, k in keys], replicates, seed)
    observed = {key: float(bleu(np.asarray(runs[key[0]][key[1]]).sum(0))) for key in keys}
    found, variances = {}, {}
    for name, baseline in baselines.items():
        mean_differences = np.mean([resampled[:, index[name, k]] - resampled[:, index[baseline, k]]
                                    for k in seeds[name]], axis=0)
        variance, variance_se = _variance_with_error(mean_differences)
        differences = [observed[name, k] - observed[baseline, k] for k in seeds[name]]
        variances[name] = (differences, variance, variance_se)
        found[name] = paired_test(differences, variance, alpha)
        found[name]["baseline"] = baseline
        found[name]["per_seed"] = dict(zip(seeds[name], differences))
        found[name]["minimum_detectable_effect"] = {
            "holm_first_step": minimum_detectable_effect(found[name]["paired_sd"], len(differences), variance,
                                                         alpha / len(baselines)),
            "holm_last_step": minimum_detectable_effect(found[name]["paired_sd"], len(differences), variance, alpha)}
    verdicts = _verdicts({n: f["p_value"] for n, f in found.items()}, {n: f["difference"] for n, f in found.items()},
                         alpha)
    adjusted = holm({n: f["p_value"] for n, f in found.items()})
    shifted = [_verdicts(*_shifted_tests(variances, sign, alpha), alpha) for sign in (-1, 1)]
    for name, f in found.items():
        differences, variance, variance_se = variances[name]
        critical = float(stats.t.ppf(1 - alpha / 2, len(differences) - 1))
        bound_se = critical * variance_se / (2 * f["se"]) if f["se"] > 0 else 0.0
        f.update(p_holm=adjusted[name], verdict=verdicts[name],
                 monte_carlo={"replicates": replicates, "seed": seed, "sentence_variance_se": variance_se,
                              "bound_se": bound_se,
                              "settled": bound_se < MAX_MONTE_CARLO_SE and all(v[name] == verdicts[name]
                                                                                 for v in shifted)})
    return found


def _variance_with_error(values: np.ndarray):
    """The sample variance of Monte-Carlo replicates and its standard error, sqrt((m4 - s^4) / B)."""
    centred = values - values.mean()
    variance = float(centred.var(ddof=1))
    return variance, math.sqrt(max(float((centred ** 4).mean()) - variance ** 2, 0.0) / len(values))


def _shifted_tests(variances, sign, alpha):
    tests = {name: paired_test(d, max(v + sign * MONTE_CARLO_MARGIN * v_se, 0.0), alpha)
             for name, (d, v, v_se) in variances.items()}
    return {n: t["p_value"] for n, t in tests.items()}, {n: t["difference"] for n, t in tests.items()}


def _verdicts(p_values, differences, alpha) -> Dict[str, str]:
    adjusted = holm(p_values)
    return {name: "undecided" if adjusted[name] > alpha else "better" if differences[name] > 0 else "worse"
            for name in p_values}


# --- beside BLEU ---------------------------------------------------------------------------------------------

def secondary_metrics(hypotheses: Mapping[str, List[str]], references: Mapping[str, List[str]],
                      lowercase: bool = True) -> Dict[str, dict]:
    """Per test set and for all of them together ("all", in the given order): sacreBLEU, chrF, BLEU without
    the brevity penalty and the output's length over the reference's. These stand beside BLEU; they decide
    nothing."""
    from sacrebleu.metrics import BLEU, CHRF

    if sorted(hypotheses) != sorted(references):
        raise ValueError(f"test sets: hypotheses for {sorted(hypotheses)}, references for {sorted(references)}")
    sets = {name: (hypotheses[name], references[name]) for name in hypotheses}
    sets["all"] = ([h for name in hypotheses for h in hypotheses[name]],
                   [r for name in hypotheses for r in references[name]])
    found = {}
    for name, (hyps, refs) in sets.items():
        if len(hyps) != len(refs):
            raise ValueError(f"{name}: {len(hyps)} hypotheses for {len(refs)} references")
        score = BLEU(lowercase=lowercase).corpus_score(hyps, [refs])
        found[name] = {"bleu": score.score,
                       "chrf": CHRF(lowercase=lowercase).corpus_score(hyps, [refs]).score,
                       "bleu_without_brevity_penalty": score.score / score.bp if score.bp > 0 else 0.0,
                       "length_ratio": score.sys_len / score.ref_len}
    return found


def secondary_summary(metrics: Mapping[str, Mapping[int, Mapping[str, dict]]],
                      baselines: Mapping[str, str]) -> Dict[str, dict]:
    """Per configuration, test set and metric (``metrics[configuration][seed]`` from :func:`secondary_metrics`):
    the mean over its seeds and, where it has a baseline, the mean paired difference to it (same seeds)."""
    summary = {}
    for name, by_seed in metrics.items():
        seeds = sorted(by_seed)
        baseline = baselines.get(name)
        if baseline is not None and sorted(metrics[baseline]) != seeds:
            raise ValueError(f"seeds: {name} has seeds {seeds} and its baseline {baseline} "
                             f"{sorted(metrics[baseline])}")
        summary[name] = {
            test_set: {metric: {"mean": float(np.mean([by_seed[k][test_set][metric] for k in seeds])),
                                "difference": None if baseline is None else float(np.mean(
                                    [by_seed[k][test_set][metric] - metrics[baseline][k][test_set][metric]
                                     for k in seeds]))}
                       for metric in ("bleu", *SECONDARY_METRICS)}
            for test_set in by_seed[seeds[0]]}
    return summary


# --- the learning rate of each configuration -----------------------------------------------------------------

LEARNING_RATES = (5e-4, 1e-3, 2e-3)
DEFAULT_LEARNING_RATE = 1e-3
#: ties: the SD of the difference of two runs' final validation NLL, sqrt(2) x the seed-to-seed SD of one run in
#: the 6+6 comparison (0.015 bits, pooled over its 12 configurations, 20 degrees of freedom) = 0.021, rounded
NLL_TIE_BITS = 0.02
LEARNING_RATE_RULE = (
    "per configuration, on seed 1, one run at each peak learning rate of "
    f"{', '.join(f'{lr:g}' for lr in LEARNING_RATES)} (the same warm-up and linear decay); the validation NLL "
    "(bits per target token) fairseq logs at the budget, on the validation set only: the lowest wins; "
    f"{DEFAULT_LEARNING_RATE:g} when it is within {NLL_TIE_BITS} bits of the lowest; a run that diverged (no "
    "finite NLL) cannot win; the grid is not extended when an end of it wins. Hard SurfaceFusion's logged NLL is "
    "that of its Eq. 6 score, lambda times the model's NLL plus 1 - lambda times the surface distribution's: not "
    "comparable with other configurations', but the same weighted sum of two proper NLLs at each of its rates")


def choose_learning_rate(validation: Mapping[float, Optional[float]], tolerance: float = NLL_TIE_BITS) -> float:
    """:data:`LEARNING_RATE_RULE`: ``validation`` maps each learning rate of :data:`LEARNING_RATES` to its
    run's validation NLL at the budget (NaN or inf: the run diverged)."""
    if sorted(validation) != sorted(LEARNING_RATES):
        raise ValueError(f"validation: learning rates {sorted(validation)}; the rule needs exactly "
                         f"{sorted(LEARNING_RATES)}")
    unfinished = [lr for lr, value in validation.items() if value is None]
    if unfinished:
        raise ValueError(f"validation: no score at learning rate(s) {unfinished}; the rule is applied once every "
                         "run of the grid has finished")
    losses = {lr: value for lr, value in validation.items() if math.isfinite(value)}
    if not losses:
        raise ValueError("validation: every run of the grid diverged (no finite score); no learning rate can be chosen")
    best = min(losses, key=lambda lr: (losses[lr], lr))  # an exact tie: the smaller rate
    # rounded: 2.62 - 2.60 is a tie at 0.02 whatever the floating point says
    if DEFAULT_LEARNING_RATE in losses and round(losses[DEFAULT_LEARNING_RATE] - losses[best], 9) <= tolerance:
        return DEFAULT_LEARNING_RATE
    return best
