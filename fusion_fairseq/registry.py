"""Registration helpers that tolerate the plugin being imported twice.

fairseq's ``--user-dir`` imports this package by its directory name, and a user may also
``import fusion_fairseq`` in the same process (tests, notebooks, an installed copy beside a
checkout). When one file is executed twice under two module names, fairseq's own decorators
raise "Cannot register duplicate model". These wrappers skip a registration when the name is
already taken by a definition of the same name from a file of the same relative path, and
raise for a genuine clash with somebody else's model.
"""

from fairseq.criterions import CRITERION_REGISTRY
from fairseq.criterions import register_criterion as _fairseq_register_criterion
from fairseq.models import (
    ARCH_CONFIG_REGISTRY,
    ARCH_MODEL_NAME_REGISTRY,
    MODEL_REGISTRY,
    register_model as _fairseq_register_model,
    register_model_architecture as _fairseq_register_architecture,
)


def _relative_module(obj):
    """``pkg.models.foo`` -> ``models.foo``: the part of the module path inside the package."""
    return obj.__module__.split(".", 1)[-1]


def same_definition(registered, candidate):
    """True when ``registered`` is ``candidate`` or the same source loaded under another name."""
    return registered is candidate or (
        registered.__qualname__ == candidate.__qualname__
        and _relative_module(registered) == _relative_module(candidate)
    )


def register_model(name):
    def wrapper(cls):
        existing = MODEL_REGISTRY.get(name)
        if existing is None:
            return _fairseq_register_model(name)(cls)
        if same_definition(existing, cls):
            return existing
        # fairseq's main branch silently keeps the first class for a taken model name; a
        # genuine clash must not go unnoticed.
        raise ValueError(
            f"Cannot register duplicate model ({name}): already registered by "
            f"{existing.__module__}.{existing.__qualname__}"
        )

    return wrapper


def register_model_architecture(model_name, arch_name):
    def wrapper(fn):
        existing = ARCH_CONFIG_REGISTRY.get(arch_name)
        if (
            existing is not None
            and ARCH_MODEL_NAME_REGISTRY.get(arch_name) == model_name
            and same_definition(existing, fn)
        ):
            return existing
        return _fairseq_register_architecture(model_name, arch_name)(fn)

    return wrapper


def register_criterion(name, dataclass=None):
    def wrapper(cls):
        existing = CRITERION_REGISTRY.get(name)
        if existing is None:
            return _fairseq_register_criterion(name, dataclass=dataclass)(cls)
        if same_definition(existing, cls):
            return existing
        # fairseq raises for any re-registration of a criterion name, also for the same file
        # loaded under a second module name; only a genuine clash should.
        raise ValueError(
            f"Cannot register duplicate criterion ({name}): already registered by "
            f"{existing.__module__}.{existing.__qualname__}"
        )

    return wrapper
