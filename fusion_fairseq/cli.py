"""Small console helpers installed with the package."""

import os


def user_dir():
    """The directory to hand to fairseq's ``--user-dir`` for this installed plugin."""
    return os.path.dirname(os.path.abspath(__file__))


def print_user_dir():
    """Console entry point ``fusion-fairseq-user-dir``: ``fairseq-train --user-dir $(fusion-fairseq-user-dir)``."""
    print(user_dir())
