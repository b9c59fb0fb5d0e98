"""The comparison's scores and report: sacreBLEU's paired bootstrap, ``results.md`` and
``learning_curves.png`` from the results :mod:`fusion_lab.comparison` collects (the verdicts are
:mod:`fusion_lab.seed_analysis`'s).
Every score comes from sacreBLEU's public interface (``corpus_score``, ``sentence_score``, ``compute_bleu``,
``PairedTest``)."""

import json
import os
import statistics
from typing import Dict, List, Optional, Sequence

from fusion_lab.common import replace_atomically
from fusion_lab.corpus import read_lines

#: Multi30k's four English test sets; the first is the one ``corpus prepare multi30k`` binarises as ``test``.
TEST_SETS = ("test_2016_flickr", "test_2017_flickr", "test_2017_mscoco", "test_2018_flickr")
#: the paired bootstrap of each seed
BOOTSTRAP_SAMPLES = 1000
BOOTSTRAP_SEED = 12345  # sacrebleu's default


def paired_bootstrap(references: List[str], baseline: List[str], system: List[str], lowercase: bool) -> dict:
    """sacreBLEU's paired bootstrap (``--paired-bs``): both BLEUs, its p-value, and the 95% interval of the
    difference over the test sets it resamples (drawn as sacrebleu draws them)."""
    import numpy as np
    from sacrebleu.metrics import BLEU
    from sacrebleu.significance import PairedTest

    bleu = BLEU(lowercase=lowercase)
    base, found = PairedTest([("baseline", baseline), ("system", system)], {"BLEU": bleu}, [references],
                             test_type="bs", n_samples=BOOTSTRAP_SAMPLES)()[1]["BLEU"]
    stats = [sentence_statistics(hyps, references, lowercase) for hyps in (baseline, system)]
    indices = np.random.default_rng(BOOTSTRAP_SEED).choice(len(references), size=(BOOTSTRAP_SAMPLES, len(references)))
    differences = [corpus_bleu(stats[1][i].sum(0)) - corpus_bleu(stats[0][i].sum(0)) for i in indices]
    return {"baseline": round(base.score, 2), "system": round(found.score, 2), "p_value": found.p_value,
            "difference": round(found.score - base.score, 2), "samples": BOOTSTRAP_SAMPLES, "seed": BOOTSTRAP_SEED,
            "ci95": [round(float(x), 2) for x in np.percentile(differences, [2.5, 97.5])],
            "signature": str(bleu.get_signature())}


def sentence_statistics(hypotheses: List[str], references: List[str], lowercase: bool):
    """Per sentence, sacreBLEU's n-gram matches and totals (n = 1..4) and both lengths: summed over any
    set of sentences, its corpus BLEU's (:func:`corpus_bleu`)."""
    import numpy as np
    from sacrebleu.metrics import BLEU

    bleu = BLEU(lowercase=lowercase, effective_order=True)  # only its n-gram counts are read: the same either way
    scores = (bleu.sentence_score(hypothesis, [reference]) for hypothesis, reference in zip(hypotheses, references))
    return np.array([[*s.counts, *s.totals, s.sys_len, s.ref_len] for s in scores], dtype=np.int64)


def corpus_bleu(statistics_sum) -> float:
    from sacrebleu.metrics import BLEU

    c = [int(x) for x in statistics_sum]
    return BLEU.compute_bleu(correct=c[0:4], total=c[4:8], sys_len=c[8], ref_len=c[9], smooth_method="exp").score


def read_concatenated(scores: Dict[str, dict], key: str) -> List[str]:
    """The lines of the file ``key`` names of every test set, in :data:`TEST_SETS` order."""
    return [line for name in TEST_SETS for line in read_lines(scores[name][key])]


def concatenated_bleu(scores: Dict[str, dict], lowercase: bool) -> dict:
    """sacreBLEU of the test sets together, and the output's length over the reference's: the brevity
    penalty sees only short output, while long output (a model looping to the length limit) costs precision."""
    from sacrebleu.metrics import BLEU

    bleu = BLEU(lowercase=lowercase)
    score = bleu.corpus_score(read_concatenated(scores, "hyp_detok"), [read_concatenated(scores, "raw_ref")])
    return {"sacrebleu": round(score.score, 2), "sacrebleu_signature": str(bleu.get_signature()),
            "sentences": sum(scores[name]["sentences"] for name in TEST_SETS),
            "length_ratio": round(score.sys_len / score.ref_len, 3)}


def summarise(values: Sequence[float]) -> Optional[dict]:
    values = [float(v) for v in values]
    return {"n": len(values), "mean": round(statistics.fmean(values), 2), "min": min(values), "max": max(values),
            "std": round(statistics.stdev(values), 2) if len(values) > 1 else None} if values else None


def mean_curve(curves: List[Dict[int, float]]) -> Dict[int, float]:
    """The mean at the updates every curve reached: no step where a shorter curve ends."""
    common = sorted(set.intersection(*(set(c) for c in curves))) if curves else []
    return {u: statistics.fmean(c[u] for c in curves) for u in common}


LENGTH_TOLERANCE = 0.05  # an output length ratio further from 1 is flagged


def _interval(found: Optional[dict]) -> str:
    return f"{found['difference']:+.2f} [{found['ci95'][0]:+.2f}, {found['ci95'][1]:+.2f}]" if found else "–"


def _mean_std(stats: Optional[dict]) -> str:
    return f"{stats['mean']:.2f}" + (f" ± {stats['std']:.2f}" if stats["n"] > 1 else "") if stats else "–"


def _duration(seconds: Optional[float]) -> str:
    return "–" if seconds is None else f"{seconds / 60:.0f} min" if seconds < 5400 else f"{seconds / 3600:.1f} h"


def _table(title: str, intro: str, columns: Sequence[str], rows: List[List[str]]) -> List[str]:
    """A markdown section: its title, its intro and one table; a column named "-NAME" is left-aligned."""
    return ["", f"## {title}", "", *([intro, ""] if intro else []), "| " + " | ".join(c.lstrip("-") for c in columns) + " |",
            "|" + "".join("---|" if c.startswith("-") or c == columns[0] else "---:|" for c in columns),
            *("| " + " | ".join(map(str, row)) + " |" for row in rows)]


def markdown(results: dict) -> str:
    return "\n".join([*header(results), *reviewed_sections(results), *summary_table(results),
                      *test_set_table(results["methods"]), *runs_table(results), *cost(results),
                      *methods_table(results["methods"]), "", "![validation NLL against updates](learning_curves.png)",
                      ""])


#: the configurations whose papers train with a schedule of another kind, which the grid does not try (plan.md)
OWN_SCHEDULES = {
    "dense_transformer": "its paper divides the rate by 10 when the validation loss rises: not tried",
    "layerwise_coordination": "its paper's inverse square root after 4,000 warm-up updates: not tried",
}


def reviewed_sections(results: dict) -> List[str]:
    """The learning-rate grid, the verdicts at the chosen rates and at the longer budget."""
    from fusion_lab.seed_analysis import ANALYSIS_RULE, LEARNING_RATE_RULE

    reviewed = results["reviewed"]
    rates = reviewed.get("learning_rates") or {"validation_nll": {}, "chosen": {}}
    grid = results["settings"]["learning_rates"]

    def chosen(name):
        lr = rates["chosen"][name]
        return f"{lr:g}" + (" (an end of the grid)" if lr in (min(grid), max(grid)) else "")

    grid_rows = [[name, *(f"{nll:.3f}" if nll is not None else "–" for nll in
                          (rates["validation_nll"][name].get(f"{lr:g}") for lr in grid)), chosen(name),
                  OWN_SCHEDULES.get(name, "–")] for name in rates["chosen"]]
    lines = _table("Learning rates", f"Validation NLL (bits) at the budget on seed {rates.get('seed', 1)}. Rule: "
                   f"{LEARNING_RATE_RULE}.", ["configuration", *(f"lr {lr:g}" for lr in grid), "chosen",
                                              "-the paper's own schedule"], grid_rows)
    for title, found in (("Verdicts at the chosen learning rates", reviewed.get("verdicts")),
                         ("Verdicts at the longer budget", reviewed.get("longer_verdicts"))):
        rows = [[name, found_row["baseline"], found_row["seeds"], f"{found_row['difference']:+.2f}",
                 f"[{found_row['ci'][0]:+.2f}, {found_row['ci'][1]:+.2f}]", f"{found_row['p_value']:.3f}",
                 f"{found_row['p_holm']:.3f}", found_row["verdict"],
                 f"{found_row['minimum_detectable_effect']['holm_last_step']:.2f}",
                 f"{found_row['monte_carlo']['replicates']:,}", f"{found_row['monte_carlo']['bound_se']:.4f}"]
                for name, found_row in sorted((found or {}).items())]
        lines += _table(title, f"BLEU decides. Rule: {ANALYSIS_RULE}" if found else "pending: not every run is scored",
                        ["configuration", "-baseline", "seeds", "Δ", "95% interval", "p", "Holm p", "-verdict",
                         "smallest Δ found (80%)", "sentence resamples", "Monte-Carlo SE of a bound"], rows)
    return lines


def header(results: dict) -> List[str]:
    s = results["settings"]
    runs = [run for r in results["methods"] for run in r["runs"]]
    n_done = sum(run["status"] == "done" for run in runs)
    devices = sorted({d for run in runs for d in run.get("devices", [])})
    grid = ", ".join(f"{lr:g}" for lr in s["learning_rates"])
    return [
        "# One benchmark for all methods: Multi30k De->En", "",
        f"Written {results['written']} by `scripts/compare_methods.py`. **{n_done} of {len(runs)} runs done**"
        + ("" if n_done == len(runs) else " (run the same command again to continue)") + ".", "",
        f"* Data: {results['task']}, one joint BPE and one joined dictionary for all methods (`{results['data_bin']}`).",
        f"* Width: {s['width_text']} (`--width {s['width']}`); `--share-all-embeddings` for every encoder-decoder "
        "model (layer-wise coordination has one embedding for both sides and the softmax by construction).",
        f"* Budget: {s['max_update']} updates of ≤{s['max_tokens']} tokens ({s['longer_budget']} at the longer "
        f"budget), Adam (0.9, 0.98), each configuration's peak learning rate from {grid} (below), linear decay to 0 "
        f"at the budget after {s['warmup']} warm-up updates, dropout {s['dropout']}, "
        f"label smoothing 0.1, weight decay 1e-4; validation + checkpoint every {s['eval_every']} updates. "
        f"Seeds: {', '.join(map(str, s['seeds']))}.",
        f"* Scored: the average of the last {s['averaged']} checkpoints, beam {s['beam']}: detokenised sacreBLEU "
        "against the raw reference (signature in results.json) and tokenised BLEU, both as "
        "`python -m fusion_lab.corpus evaluate`.",
        f"* Device(s): {'; '.join(devices) or '–'}. Time summed over runs: training "
        f"{_duration(sum(run.get('train_seconds') or 0 for run in runs))}, test decoding "
        f"{_duration(sum(run.get('generate_seconds') or 0 for run in runs))}.",
    ]


def summary_table(results: dict) -> List[str]:
    rows, seeds = results["methods"], results["settings"]["seeds"]
    base_params = next((r["params"] for r in rows if r["method"] == "transformer"), None)
    table = []
    for r in rows:
        by_seed = {run["seed"]: run for run in r["runs"]}
        cells = []
        for run in (by_seed.get(seed) for seed in seeds):
            if run is None or run["status"] != "done":
                cells.append(f"{run['status']} {run['updates']}" if run and run["updates"] else run["status"] if run else "–")
            else:
                flag = " ⚠" if abs(run["length_ratio"] - 1) > LENGTH_TOLERANCE else ""
                cells.append(f"{run['test']['all']:.2f} ({run['length_ratio']:.2f}{flag})")
        params = r["params"]
        own, compared = r["method"] == r["baseline"], r["baseline"] is not None
        verdict = r["verdict"]["verdict"] if r.get("verdict") else "pending" if compared else "rate not chosen"
        table.append([r["title"], f"{params:,}" if params else "–",
                      f"{100 * (params - base_params) / base_params:+.1f}%" if params and base_params else "–", *cells,
                      _mean_std(r["test"]["all"]), r["baseline"] if compared and not own else "–",
                      _interval(r.get("verdict")), "–" if own else verdict])
    return _table("Summary", f"Per seed: sacreBLEU on the four test sets together and, in parentheses, the output's "
                  f"length over the reference's (⚠: more than {LENGTH_TOLERANCE:.0%} from 1). Verdict: the paired "
                  "analysis of the sections above; a grid run at a rate its configuration did not choose is compared "
                  "with nothing.",
                  ["method", "params", "vs Transformer", *(f"seed {seed}" for seed in seeds), "mean ± std",
                   "-baseline", "Δ [95% interval]", "-verdict"], table)


def test_set_table(rows: List[dict]) -> List[str]:
    return _table("Every test set", f"sacreBLEU, mean ± sample std over the finished seeds; tokenised BLEU on "
                  f"{TEST_SETS[0]}.", ["method", *(name.replace("test_", "") for name in TEST_SETS), "all four",
                                       "tokenised"],
                  [[r["title"], *(_mean_std(r["test"][name]) for name in (*TEST_SETS, "all")),
                    _mean_std(r["tokenized_bleu"])] for r in rows])


def runs_table(results: dict) -> List[str]:
    return _table("Runs", "Paired: sacreBLEU's paired bootstrap against the Transformer's run of the same seed at "
                  "the reference learning rate (the run named `transformer`, whatever rate the row's grid chose) "
                  f"({BOOTSTRAP_SAMPLES} resamples of the four test sets together; Δ [95% interval], p). Times are "
                  "wall-clock under whatever else the machine ran: they do not compare speed.",
                  ["method", "seed", "-status", "updates", "paired", "training", "updates/s", "decoding", "-device"],
                  [[r["method"], run["seed"], run["status"], run.get("updates", 0),
                    f"{_interval(run['paired'])}, p {run['paired']['p_value']:.3f}" if run.get("paired") else "–",
                    _duration(run.get("train_seconds")), run.get("updates_per_second", "–"),
                    _duration(run.get("generate_seconds")), "; ".join(run.get("devices", [])) or "–"]
                   for r in results["methods"] for run in r["runs"]])


def cost(results: dict) -> List[str]:
    hours = results["cpu_hours"]
    actual = (f"{hours['actual']} (training and test decoding summed over the runs, times the threads per run)"
              if hours["actual"] is not None
              else "not counted (--threads not given: the runs' torch threads are unknown)")
    return ["", f"CPU-hours: planned {hours['planned'] if hours['planned'] is not None else '–'}; actual so "
            f"far {actual}."]


def methods_table(rows: List[dict]) -> List[str]:
    table = []
    for r in rows:
        flags = [f"--arch {r['arch']}", " ".join(r["method_flags"])]
        if r.get("matched"):
            (flag, value), = r["matched"].items()
            flags.append(f"{flag} {value} (matched)")
        table.append([r["title"], r["paper"], f"`{' '.join(f for f in flags if f)}`", f"`{' '.join(r['criterion'][1:2])}`",
                      f"{r['paper_gap'][0]:+.2f} ({r['paper_gap'][1]})" if r.get("paper_gap") else "–", r["note"]])
    return _table("Methods", "", ["-method", "-paper", "-flags (besides the common width)", "-criterion",
                                  "-paper's gap", "-note"], table)


def plot_curves(results: dict, path: str) -> None:
    from fusion_lab.analysis import pyplot

    plt = pyplot()
    # the right panel repeats the second half of training at a scale where the methods come apart
    fig, (whole, tail) = plt.subplots(1, 2, figsize=(13, 5), layout="constrained")
    half = max((int(u) for r in results["methods"] for u in r["mean_curve"]), default=0) // 2
    for r in results["methods"]:
        curve = {int(u): v for u, v in r["mean_curve"].items()}
        if curve:
            label = f"{r['title']} ({r['curve_seeds']} seed{'s' if r['curve_seeds'] != 1 else ''})"
            whole.plot(list(curve), list(curve.values()), marker="o", markersize=3, label=label)
            late = {u: v for u, v in curve.items() if u >= half}
            tail.plot(list(late), list(late.values()), marker="o", markersize=3)
    whole.set_title(f"Multi30k De->En, {results['settings']['width_text']}, mean over seeds", fontsize=10)
    tail.set_title(f"from update {half} on", fontsize=10)
    for ax in (whole, tail):
        ax.set(xlabel="updates", ylabel="validation NLL (bits per target token)")
        ax.grid(alpha=0.3)
    if whole.lines:
        whole.legend(fontsize=8)
    replace_atomically(path, lambda file: fig.savefig(file, dpi=120, format="png"))
    plt.close(fig)


# --- beside BLEU, read from an exported comparison --------------------------------------------------------------

SECONDARY_COLUMNS = {"bleu": "BLEU", "chrf": "chrF", "bleu_without_brevity_penalty": "BLEU without BP",
                     "length_ratio": "length ratio"}


def secondary_metrics_of(folder: str, raw: str) -> dict:
    """:func:`seed_analysis.secondary_summary` of the comparison exported to ``folder`` (its results.json and
    ``runs/METHOD/seedS``, as ``launch.sh export`` writes them): every scored run's test translations
    (``eval-beamB/average/SET/hyp.detok``) against the raw references ``raw/SET.TGT``, cased as the run was
    scored. A configuration is paired with its baseline on its own seeds, where the baseline has them all."""
    from fusion_lab.seed_analysis import secondary_metrics, secondary_summary

    with open(os.path.join(folder, "results.json"), encoding="utf-8") as f:
        rows = json.load(f)["methods"]
    metrics, references = {}, {}  # references: {target language: {test set: lines}}, read once
    for row in rows:
        for run in row["runs"]:
            if run["status"] != "done":
                continue
            rdir = os.path.join(folder, "runs", row["method"], f"seed{run['seed']}")
            with open(os.path.join(rdir, "config.json"), encoding="utf-8") as f:
                config = json.load(f)
            target, scored = config["recipe"]["TGT"], os.path.join(rdir, f"eval-beam{config['beam']}", "average")
            if target not in references:
                references[target] = {name: read_lines(os.path.join(raw, f"{name}.{target}")) for name in TEST_SETS}
            metrics.setdefault(row["method"], {})[run["seed"]] = secondary_metrics(
                {name: read_lines(os.path.join(scored, name, "hyp.detok")) for name in TEST_SETS}, references[target],
                lowercase=config["recipe"].get("LOWERCASE", "0") == "1")
    summary = {}
    for name, baseline in ((row["method"], row.get("baseline")) for row in rows if row["method"] in metrics):
        paired = baseline != name and set(metrics[name]) <= set(metrics.get(baseline, {}))
        runs = {name: metrics[name], **({baseline: {seed: metrics[baseline][seed] for seed in metrics[name]}}
                                        if paired else {})}
        summary[name] = secondary_summary(runs, {name: baseline} if paired else {})[name]
    return summary


def secondary_markdown(summary: dict) -> str:
    """One table per test set (the four together first): each metric's mean over seeds, and in parentheses
    the mean paired difference to the configuration's baseline."""
    def cell(found):
        difference = "" if found["difference"] is None else f" ({found['difference']:+.2f})"
        return f"{found['mean']:.3f}{difference}" if found["mean"] < 2 else f"{found['mean']:.2f}{difference}"

    lines = ["# Beside BLEU", "", "Mean over each configuration's scored seeds; in parentheses the mean paired "
             "difference to its baseline (same seeds). These metrics decide nothing: BLEU does."]
    for test_set in ("all", *TEST_SETS):
        lines += _table("the four test sets together" if test_set == "all" else test_set, "",
                        ["-configuration", *SECONDARY_COLUMNS.values()],
                        [[name, *(cell(sets[test_set][metric]) for metric in SECONDARY_COLUMNS)]
                         for name, sets in summary.items()])
    return "\n".join(lines) + "\n"


def main(argv: Optional[Sequence[str]] = None) -> None:
    """``python -m fusion_lab.comparison_report secondary FOLDER RAW``: the tables, printed."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m fusion_lab.comparison_report",
                                     description="chrF, BLEU without the brevity penalty and the length ratio of an "
                                     "exported comparison's runs, beside their BLEU")
    parser.add_argument("command", choices=("secondary",))
    parser.add_argument("folder", help="an exported comparison (examples/comparison/NAME: results.json and runs/)")
    parser.add_argument("raw", help="the raw test files RAW/SET.LANG the runs were scored against (Multi30k task 1)")
    args = parser.parse_args(argv)
    try:
        summary = secondary_metrics_of(args.folder, args.raw)
    except (OSError, ValueError, KeyError) as error:  # a folder that is not an export, references of other sets
        parser.exit(2, f"{parser.prog} secondary: {type(error).__name__}: {error} (FOLDER: an exported comparison "
                       "with results.json and runs/; RAW: the raw test files its runs were scored against)\n")
    print(secondary_markdown(summary), end="")


if __name__ == "__main__":
    main()
