"""The design's noise, estimated from the committed 6+6 comparison, and the verdict rules simulated under no
effect: the evidence that :data:`fusion_lab.seed_analysis.ANALYSIS_RULE` holds its false-positive rate and the 6+6
comparison's rule did not (tests/test_seed_analysis.py, examples/comparison/reviewed/simulate.py)."""

import math
from dataclasses import dataclass
from typing import Mapping

import numpy as np
from scipy import stats

from fusion_lab.seed_analysis import ALPHA


@dataclass(frozen=True)
class NoiseModel:
    """Score-level noise of one run's BLEU (the model of :mod:`fusion_lab.seed_analysis`): ``seed_sd`` of s_k (shared by every
    configuration's run of seed k), ``run_sd`` of e_mk, ``sentence_sd`` of c_m (one configuration's offset on
    the sampled test sentences, the same for all its seeds)."""
    seed_sd: float
    run_sd: float
    sentence_sd: float


def seed_variance_components(scores: Mapping[str, Mapping[int, float]]) -> dict:
    """From per-configuration, per-seed scores: the pooled within-configuration SD, and its split into a
    seed effect shared by all configurations and the rest (the residual of configuration + seed fitted by
    least squares; the seed part is the pooled variance minus the residual's, at least 0)."""
    names = sorted(scores)
    seeds = sorted({k for name in names for k in scores[name]})
    rows, y = [], []
    for i, name in enumerate(names):
        for k, value in scores[name].items():
            row = np.zeros(len(names) + len(seeds) - 1)
            row[i] = 1.0
            if k != seeds[0]:
                row[len(names) + seeds.index(k) - 1] = 1.0
            rows.append(row)
            y.append(value)
    design, y = np.array(rows), np.array(y)
    coefficients, _, rank, _ = np.linalg.lstsq(design, y, rcond=None)
    residual_df = int(len(y) - rank)
    residual_var = float(((y - design @ coefficients) ** 2).sum() / residual_df)
    within = [np.asarray(list(scores[name].values()), dtype=np.float64) for name in names]
    pooled_df = sum(len(v) - 1 for v in within)
    pooled_var = float(sum(((v - v.mean()) ** 2).sum() for v in within) / pooled_df)
    return {"pooled_sd": math.sqrt(pooled_var), "pooled_df": pooled_df, "run_sd": math.sqrt(residual_var),
            "residual_df": residual_df, "seed_sd": math.sqrt(max(pooled_var - residual_var, 0.0))}


def simulate_null(noise: NoiseModel, seeds: int, simulations: int, rng: np.random.Generator,
                  configurations: int = 2) -> np.ndarray:
    """Scores (simulations x configurations x seeds) with no effect of the configuration; configuration 0 is
    the baseline."""
    shared = rng.normal(0.0, noise.seed_sd, (simulations, 1, seeds))
    run = rng.normal(0.0, noise.run_sd, (simulations, configurations, seeds))
    sentences = rng.normal(0.0, noise.sentence_sd, (simulations, configurations, 1))
    return shared + run + sentences


def new_rule_rejects(scores: np.ndarray, noise: NoiseModel, alpha: float = ALPHA) -> np.ndarray:
    """:data:`ANALYSIS_RULE` on simulated scores (simulations x configurations x seeds, configuration 0 the
    baseline), the sentence variance of the mean difference given by the noise model (the bootstrap's target):
    per simulation, whether Holm rejects any configuration (with two configurations: the one comparison)."""
    differences = scores[:, 1:, :] - scores[:, :1, :]
    n = differences.shape[-1]
    se = np.sqrt(differences.var(axis=-1, ddof=1) / n + 2 * noise.sentence_sd ** 2)
    p = 2 * stats.t.sf(np.abs(differences.mean(axis=-1)) / se, n - 1)
    k = p.shape[1]
    # Holm rejects something exactly when its first step does: the smallest p below alpha / k
    return p.min(axis=1) <= alpha / k


def old_rule_rejects(scores: np.ndarray, noise: NoiseModel, rng: np.random.Generator, replicates: int = 1000,
                     alpha: float = ALPHA) -> np.ndarray:
    """The 6+6 comparison's rule (``VERDICT_RULE`` of its runner, at examples/comparison/deep.sh's pin) on
    simulated scores of two configurations (simulations x 2 x seeds): per replicate, each configuration's seeds
    resampled with replacement independently, then the sentences (one draw shared by every run: here a fresh
    offset per configuration of the noise model's size); better / worse when the percentile interval excludes 0."""
    if len(scores) > 1000:  # in pieces: replicates x seeds indices per simulation
        return np.concatenate([old_rule_rejects(scores[i:i + 1000], noise, rng, replicates, alpha)
                               for i in range(0, len(scores), 1000)])
    simulations, _, n = scores.shape
    rows = np.arange(simulations)[:, None, None]
    means = []
    for configuration in (0, 1):
        picked = rng.integers(n, size=(simulations, replicates, n))
        resampled = scores[rows, configuration, picked].mean(axis=-1)
        means.append(resampled + rng.normal(0.0, noise.sentence_sd, (simulations, replicates)))
    low, high = np.percentile(means[1] - means[0], [100 * alpha / 2, 100 * (1 - alpha / 2)], axis=1)
    return (low > 0) | (high < 0)


def old_procedure_rejects(scores: np.ndarray, noise: NoiseModel, rng: np.random.Generator,
                          replicates: int = 1000) -> np.ndarray:
    """The 6+6 comparison as it ran (``THIRD_SEED_RULE``): the old rule on seeds 1 and 2, and where it is
    undecided, again on seeds 1 to 3 (``scores`` holds 3 seeds)."""
    first = old_rule_rejects(scores[:, :, :2], noise, rng, replicates)
    return first | old_rule_rejects(scores, noise, rng, replicates)


def rate_with_margin(rejections: np.ndarray, z: float = 2.576) -> dict:
    """A simulated rate with its Monte-Carlo interval (normal approximation, 99% by default)."""
    rate = float(np.mean(rejections))
    margin = z * math.sqrt(max(rate * (1 - rate), 1e-12) / len(rejections))
    return {"rate": rate, "low": rate - margin, "high": rate + margin, "simulations": len(rejections)}
