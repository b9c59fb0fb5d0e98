#!/usr/bin/env python3
"""Average the parameters of fairseq checkpoints: fusion_lab/averaging.py."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from fusion_lab.averaging import main  # noqa: E402

if __name__ == "__main__":
    main()
