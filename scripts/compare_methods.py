#!/usr/bin/env python3
"""The comparison of every method at a matched size and an identical budget on Multi30k De->En, run from a
checkout (fusion_lab/comparison.py; examples/comparison/README.md; flags: ``--help``)."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # this checkout's plugin first
from fusion_lab.comparison import main  # noqa: E402

if __name__ == "__main__":
    main()
