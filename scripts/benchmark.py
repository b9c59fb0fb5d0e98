#!/usr/bin/env python
"""``fusion-fairseq-benchmark`` run from a checkout (method and figures: docs/measurements.md; flags: ``--help``)."""

import os
import sys

sys.path.append(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run from a checkout
from fusion_lab.benchmark import main  # noqa: E402

if __name__ == "__main__":
    main()
