"""fusion-fairseq: layer-fusion methods for sequence-to-sequence Transformers as a fairseq plugin.

Load with ``--user-dir $(fusion-fairseq-user-dir)`` (the package ``fusion_fairseq_plugin`` beside this one), or
in Python with ``import fusion_fairseq.models``, which registers the models and what they train with. Importing
this package alone, or one of its helpers (``checkpoint_safety``, ``cli``), registers nothing and changes nothing
in fairseq. A ``--user-dir`` naming this folder itself also registers, where nothing has imported it yet.
"""

import os

__version__ = "0.1.0"

if __name__ != "fusion_fairseq":
    # fairseq's --user-dir imports a folder under the folder's name; the plugin's modules import each other as
    # fusion_fairseq, so under another name this package would run another copy's code, or register twice
    import importlib.util

    _here = os.path.dirname(os.path.abspath(__file__))
    _found = importlib.util.find_spec("fusion_fairseq")
    _imported = os.path.dirname(_found.origin) if _found is not None and _found.origin else None
    if _imported is None:
        raise ImportError(f"--user-dir {_here}: the plugin's folder must be named fusion_fairseq (its modules "
                          "import each other by that name); pass --user-dir $(fusion-fairseq-user-dir)")
    if os.path.realpath(_imported) != os.path.realpath(_here):
        raise ImportError(f"--user-dir {_here} is another copy of the plugin than {_imported}, the one this Python "
                          f"imports as fusion_fairseq: pass --user-dir {_imported}, or install the copy you want "
                          "(pip install -e its checkout)")
    raise ImportError(f"--user-dir {_here} loads the plugin as {__name__}: pass --user-dir {_imported}, its folder "
                      "named fusion_fairseq (under two names it would register everything twice)")
