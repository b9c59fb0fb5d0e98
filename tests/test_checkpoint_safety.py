"""fairseq checkpoints load under torch's safe unpickler; anything else stays refused."""

import os
import pickle

from argparse import Namespace

import pytest
import torch
from fairseq import checkpoint_utils

import fusion_fairseq.models  # noqa: F401  (registers the plugin; reads fairseq checkpoints under torch >= 2.6)
from fusion_fairseq.checkpoint_safety import CheckpointContentError


class WritesAFileWhenUnpickled:
    """A crafted payload: unpickling it calls ``open(path, "w")``, i.e. runs arbitrary code."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def test_safe_loading_is_not_switched_off_globally():
    assert os.environ.get("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD") in (None, "", "0")
    allowed = set(torch.serialization.get_safe_globals())
    for dangerous in (open, eval, exec, os.system, pickle.loads):
        assert dangerous not in allowed


def assert_a_crafted_checkpoint_is_refused(tmp_path):
    """fairseq's reader refuses a checkpoint carrying a callable, before the callable runs."""
    marker = tmp_path / "pwned"
    crafted = tmp_path / "crafted.pt"
    torch.save({"model": {}, "args": None, "payload": WritesAFileWhenUnpickled(str(marker))}, crafted)
    with pytest.raises(CheckpointContentError, match=f"^{crafted}: cannot read the checkpoint safely \\(Unsupported "
                                                     "global: GLOBAL io.open\\)"):
        checkpoint_utils.load_checkpoint_to_cpu(str(crafted))
    assert not marker.exists()


def test_a_checkpoint_carrying_a_callable_is_refused(tmp_path):
    assert_a_crafted_checkpoint_is_refused(tmp_path)


def test_a_fairseq_checkpoint_loads_with_default_torch_load(tiny_mlrf_checkpoint):
    state = torch.load(tiny_mlrf_checkpoint)  # weights_only=True, torch's default
    assert state["cfg"]["model"]["_name"] == "mlrf_iwslt_de_en"  # the fields of the registered dataclass
    models, cfg, task = checkpoint_utils.load_model_ensemble_and_task([tiny_mlrf_checkpoint])
    assert type(models[0]).__name__ == "FusionTransformerModel"


def test_an_omegaconf_configured_checkpoint_loads(tiny_mlrf_checkpoint, tmp_path):
    """Older fairseq versions stored the configuration as omegaconf containers."""
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    state = torch.load(tiny_mlrf_checkpoint)
    state["cfg"] = convert_namespace_to_omegaconf(Namespace(**state["cfg"]["model"], arch="mlrf_iwslt_de_en"))
    path = tmp_path / "omegaconf.pt"
    torch.save(state, path)
    reloaded = torch.load(path)
    assert reloaded["cfg"].model._name == "mlrf_iwslt_de_en"


@pytest.fixture
def fairseq_main_reader(monkeypatch):
    """``load_checkpoint_to_cpu`` as fairseq's main branch has it since "Pt2.6 compatibility"
    (#5611): ``torch.load(..., weights_only=False)``. Made from the installed function's source,
    run in its module's namespace, and wrapped by the plugin's checks as the installed one is."""
    import inspect

    from fusion_fairseq.checkpoint_safety import _checked_reader

    installed = checkpoint_utils.load_checkpoint_to_cpu.__wrapped__
    call = 'torch.load(f, map_location=torch.device("cpu"))'
    source = inspect.getsource(installed)
    assert call in source
    namespace = dict(vars(checkpoint_utils))
    exec(source.replace(call, call[:-1] + ", weights_only=False)"), namespace)
    main_reader = _checked_reader(namespace["load_checkpoint_to_cpu"])
    monkeypatch.setattr(checkpoint_utils, "load_checkpoint_to_cpu", main_reader)


def test_safe_loading_holds_when_fairseq_passes_weights_only_false(fairseq_main_reader, tiny_mlrf_checkpoint,
                                                                      tmp_path):
    assert_a_crafted_checkpoint_is_refused(tmp_path)
    models, _, _ = checkpoint_utils.load_model_ensemble_and_task([tiny_mlrf_checkpoint])  # honest ones load
    assert type(models[0]).__name__ == "FusionTransformerModel"


class RunsACommandWhenUnpickled:
    """A payload whose callable lives in a module torch's safe loader blocks outright (os.system is posix.system):
    torch words that refusal differently from that of a global it merely does not allow."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (os.system, (f"touch {self.path}",))


DAMAGED = "cannot read the checkpoint, the file is damaged or not a fairseq checkpoint "


def unreadable_files(tmp_path):
    """{kind: (the file, what the one-line error names)}: payloads and damaged files torch cannot read weights-only."""
    marker = tmp_path / "pwned"
    payload = RunsACommandWhenUnpickled(marker)
    files = {
        "blocked module": (lambda p: torch.save({"model": {}, "payload": payload}, p),
                           "cannot read the checkpoint safely (Unsupported global: GLOBAL posix.system)"),
        "legacy pickle": (lambda p: p.write_bytes(pickle.dumps({"model": payload}, protocol=2)),
                          "cannot read the checkpoint safely (Unsupported global: GLOBAL posix.system)"),
        "INST opcode": (lambda p: p.write_bytes(f"(S'touch {marker}'\nios\nsystem\n.".encode()),
                        DAMAGED + "(UnpicklingError: Unsupported operand 83)"),
        "text": (lambda p: p.write_text("not a checkpoint\n"), DAMAGED + "(UnpicklingError: Unsupported operand"),
        "empty": (lambda p: p.write_bytes(b""), DAMAGED + "(EOFError: the file is empty or cut short)"),
        "truncated": (lambda p: (torch.save({"model": {}}, p), p.write_bytes(p.read_bytes()[:200])),
                      DAMAGED + "(RuntimeError: PytorchStreamReader failed reading zip archive"),
    }
    return marker, files


@pytest.mark.parametrize("kind", ["blocked module", "legacy pickle", "INST opcode", "text", "empty", "truncated"])
def test_a_file_torch_cannot_read_is_named_in_one_line(tmp_path, kind):
    marker, files = unreadable_files(tmp_path)
    write, message = files[kind]
    path = tmp_path / "crafted.pt"
    write(path)
    with pytest.raises(CheckpointContentError) as error:
        checkpoint_utils.load_checkpoint_to_cpu(str(path))
    assert str(error.value).startswith(f"{path}: {message}") and "\n" not in str(error.value), str(error.value)
    assert not marker.exists()
