"""The false-positive rates of the old and the new verdict rule under no effect, at the 6+6 comparison's
spread (tests/test_seed_analysis.py's noise model, from the committed examples/comparison/deep/results.json).

    python examples/comparison/reviewed/simulate.py     # about a minute on a 2-core CPU machine
"""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "tests"))
import seed_simulation as sim  # noqa: E402
from test_seed_analysis import noise_models  # noqa: E402


def main():
    rng = np.random.default_rng(100)
    for name, noise in zip(("observed", "none of the spread shared"), noise_models()):
        old = {label: sim.rate_with_margin(rule(sim.simulate_null(noise, seeds, sims, rng), noise, rng))["rate"]
               for label, rule, seeds, sims in (("2 seeds", sim.old_rule_rejects, 2, 60000),
                                                ("3 seeds", sim.old_rule_rejects, 3, 30000),
                                                ("as run (2, then 3)", sim.old_procedure_rejects, 3, 30000))}
        new = sim.rate_with_margin(sim.new_rule_rejects(sim.simulate_null(noise, 6, 100000, rng), noise))["rate"]
        print(f"{name} ({noise}): old rule " + ", ".join(f"{k} {v:.3f}" for k, v in old.items())
              + f"; new rule, 6 seeds {new:.4f}")


if __name__ == "__main__":
    main()
