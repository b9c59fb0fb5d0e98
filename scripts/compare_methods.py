#!/usr/bin/env python3
"""One benchmark for all methods: the vanilla Transformer and every paper's headline configuration,
trained at a matched size with an identical budget on Multi30k De->En, compared on test BLEU (per
seed, mean and spread), parameters and learning curves. See fusion_fairseq/tools/comparison.py and
examples/comparison/README.md.

    python scripts/compare_methods.py --out comparison_out            # all methods, seeds 1 2
    python scripts/compare_methods.py --out comparison_out --report-only
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from fusion_fairseq.tools.comparison import main  # noqa: E402

if __name__ == "__main__":
    main()
