"""The golden outputs (tests/golden_outputs.py): every compared configuration of the converged
comparison and every architecture and preset still computes the stored loss, NLL and gradient norm
on the fixed batch. The comparison trains from a pinned checkout; this proves main computes the same
functions. Tolerance 1e-5 relative: the numbers were stored on one CPU with one thread, and other
CPUs' float32 kernels may sum in another order; ``python tests/golden_outputs.py --compare`` checks
them bit for bit on the machine that stored them."""

import json
import os
import re
import subprocess

import pytest
import torch

import golden_outputs
from fusion_lab import comparison

STORED = golden_outputs.read_golden()
CONFIGURATIONS = golden_outputs.configurations()


@pytest.fixture(scope="module")
def golden_data_bin(tmp_path_factory):
    return golden_outputs.make_data_bin(str(tmp_path_factory.mktemp("golden")))


@pytest.fixture
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_every_configuration_has_a_stored_golden_output():
    assert sorted(CONFIGURATIONS) == sorted(STORED)
    compared = {key.split("/", 1)[1] for key in CONFIGURATIONS if key.startswith(("deep/", "reviewed/"))}
    assert set(comparison.METHODS) <= compared


@pytest.mark.parametrize("key", sorted(CONFIGURATIONS))
def test_golden_output_is_unchanged(key, golden_data_bin, one_thread):
    output = golden_outputs.golden_or_refusal(golden_data_bin, key, *CONFIGURATIONS[key])
    assert output.keys() == STORED[key].keys()
    for name, value in output.items():
        assert value == pytest.approx(STORED[key][name], rel=1e-5), f"{key} {name}"


def test_a_changed_function_changes_the_golden_output(golden_data_bin, one_thread):
    arch, flags, criterion = CONFIGURATIONS["comparison/surface_fusion"]
    changed = [*flags[:-1], "0.7"]  # --surface-fusion-lambda 0.8 -> 0.7
    assert flags[-2:] == ["--surface-fusion-lambda", "0.8"]
    output = golden_outputs.golden_output(golden_data_bin, arch, changed, criterion)
    assert output["grad_norm"] != pytest.approx(STORED["comparison/surface_fusion"]["grad_norm"], rel=1e-5)


# The 3+3 comparison (examples/comparison/converged.sh) has finished. Configurations whose function
# changed after its runs, on purpose, each with the change; its README and the recipes' say which
# rows predate it. Every other compared configuration must still compute what its runs computed.
CHANGED_SINCE_THE_SHALLOW_COMPARISON = {
    "comparison/dense_transformer": "DenseNMT: a_l concatenated after the layer's dropout",
    "comparison/fgla": "fine-grained layer attention: X_0 gets the embedding dropout",
    "comparison/composition:deeprep+fgla": "fine-grained layer attention: X_0 gets the embedding dropout; the "
                                           "aggregation nodes get the model's dropout",
    "comparison/composition:surface_fusion+fgla": "fine-grained layer attention: X_0 gets the embedding dropout",
    "comparison/composition:deeprep+surface_fusion+fgla": "fine-grained layer attention: X_0 gets the embedding "
                                                          "dropout; the aggregation nodes get the model's dropout",
    "comparison/deeprep": "deep representations: the aggregation nodes get the model's dropout",
    "comparison/composition:deeprep+surface_fusion": "deep representations: the aggregation nodes get the model's dropout",
}


def test_the_pinned_comparison_computes_what_main_computes():
    """The shallow comparison trained from the commit pinned in examples/comparison/converged.sh.
    Its stored golden outputs of every compared configuration are the ones main stores (and main
    computes them, above), except exactly the configurations changed since on purpose
    (:data:`CHANGED_SINCE_THE_SHALLOW_COMPARISON`): any other change that moves a compared method
    fails here."""
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    with open(os.path.join(repo, "examples", "comparison", "converged.sh"), encoding="utf-8") as f:
        pin = re.search(r"^PIN=([0-9a-f]{40})$", f.read(), re.M).group(1)
    shown = subprocess.run(["git", "-C", repo, "show", f"{pin}:tests/golden_outputs.json"], capture_output=True, text=True)
    if shown.returncode != 0:
        pytest.skip(f"the pinned commit {pin[:10]} is not in this checkout's history ({shown.stderr.strip()[:100]})")
    pinned = {key: value for key, value in json.loads(shown.stdout).items() if key.startswith("comparison/")}
    now = {key: value for key, value in STORED.items() if key in pinned}
    changed = {key for key in pinned if pinned[key] != now.get(key)}
    assert changed == set(CHANGED_SINCE_THE_SHALLOW_COMPARISON)


# The 6+6 comparison (examples/comparison/deep.sh) has finished. Configurations whose function changed
# after its runs, on purpose, each with the change; its pages say which rows predate it.
CHANGED_SINCE_THE_DEEP_COMPARISON = {
    "deep/hyper_connections": "hyper-connections: Zhu et al.'s initialisation, output projections divided by sqrt(n)",
}


def test_the_pinned_deep_comparison_computes_what_main_computes():
    """The deep comparison trained from the commit pinned in examples/comparison/deep.sh: its stored
    golden outputs of every compared configuration are the ones main stores (and computes, above),
    except exactly the configurations changed since on purpose (:data:`CHANGED_SINCE_THE_DEEP_COMPARISON`)."""
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    with open(os.path.join(repo, "examples", "comparison", "deep.sh"), encoding="utf-8") as f:
        pinned_line = re.search(r"^PIN=([0-9a-f]{40})\b", f.read(), re.M)
    if pinned_line is None:
        pytest.skip("examples/comparison/deep.sh pins no commit yet")
    pin = pinned_line.group(1)
    shown = subprocess.run(["git", "-C", repo, "show", f"{pin}:tests/golden_outputs.json"], capture_output=True, text=True)
    if shown.returncode != 0:
        pytest.skip(f"the pinned commit {pin[:10]} is not in this checkout's history ({shown.stderr.strip()[:100]})")
    pinned = {key: value for key, value in json.loads(shown.stdout).items() if key.startswith("deep/")}
    assert pinned and set(pinned) <= set(STORED)
    changed = {key for key in pinned if pinned[key] != STORED[key]}
    assert changed == set(CHANGED_SINCE_THE_DEEP_COMPARISON)


def test_the_pinned_reviewed_comparison_computes_what_main_computes():
    """The reviewed comparison trains from the commit pinned in examples/comparison/reviewed.sh: its stored
    golden outputs of every configuration it trains are the ones main stores (and computes, above). A change
    that moves one of them must restart that configuration's runs with a new pin."""
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    with open(os.path.join(repo, "examples", "comparison", "reviewed.sh"), encoding="utf-8") as f:
        pinned_line = re.search(r"^PIN=([0-9a-f]{40})\b", f.read(), re.M)
    if pinned_line is None:
        pytest.skip("examples/comparison/reviewed.sh pins no commit yet")
    shown = subprocess.run(["git", "-C", repo, "show", f"{pinned_line.group(1)}:tests/golden_outputs.json"],
                           capture_output=True, text=True)
    if shown.returncode != 0:
        pytest.skip(f"the pinned commit is not in this checkout's history ({shown.stderr.strip()[:100]})")
    pinned = {key: value for key, value in json.loads(shown.stdout).items() if key.startswith("reviewed/")}
    assert pinned and pinned == {key: value for key, value in STORED.items() if key.startswith("reviewed/")}

