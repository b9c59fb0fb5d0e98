"""Small console helpers installed with the package."""

import os


def user_dir():
    """The directory to hand to fairseq's ``--user-dir`` for this installed plugin: the package
    ``fusion_fairseq_plugin`` beside this one, which registers it (found without importing it)."""
    return os.path.join(os.path.dirname(package_dir()), "fusion_fairseq_plugin")


def package_dir():
    """The directory of the ``fusion_fairseq`` package."""
    return os.path.dirname(os.path.abspath(__file__))


def print_user_dir():
    """Console entry point ``fusion-fairseq-user-dir``: ``fairseq-train --user-dir $(fusion-fairseq-user-dir)``."""
    print(user_dir())
