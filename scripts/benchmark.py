#!/usr/bin/env python
"""Speed benchmark of the plugin's models against fairseq's vanilla transformer.

Thin wrapper around :func:`fusion_fairseq.tools.benchmark.main` (also installed as the console script
``fusion-fairseq-benchmark``); see ``fusion_fairseq/tools/benchmark.py`` for the method and
``--help`` for the flags::

    python scripts/benchmark.py --repeats 3 --threads 1 --archs mlrf_iwslt_de_en \\
        --variant "Enc-FNN=fusion_transformer:--fuse-encoder fnn" --json bench.json --markdown bench.md
"""

import os
import sys

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO_ROOT not in sys.path:  # run from a checkout without installing the package
    sys.path.append(REPO_ROOT)

from fusion_fairseq.tools.benchmark import main  # noqa: E402

if __name__ == "__main__":
    main()
