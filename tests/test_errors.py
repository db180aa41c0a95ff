"""One error hierarchy: every exception class the packages define derives from DnbError.

The tree (one subtree per layer) is drawn in docs/ERRORS.md.
"""
from __future__ import annotations

import importlib
import inspect
import pkgutil
import types

import pytest

from native.errors import DnbError

PACKAGES = ("native", "wal", "uploader", "tiered")


def project_modules() -> list[types.ModuleType]:
    """Every module of the packages that imports here (optional extras such as pyspark
    may be missing; such a module is skipped, not failed)."""
    modules = []
    for name in PACKAGES:
        package = importlib.import_module(name)
        modules.append(package)
        for info in pkgutil.walk_packages(package.__path__, prefix=f"{name}."):
            try:
                modules.append(importlib.import_module(info.name))
            except ImportError as e:
                if e.name is None or e.name.split(".")[0] in PACKAGES:
                    raise
    return modules


def test_every_exception_class_derives_from_the_root() -> None:
    strays = []
    seen = 0
    for module in project_modules():
        for _, klass in inspect.getmembers(module, inspect.isclass):
            if klass.__module__ != module.__name__ or not issubclass(klass, BaseException):
                continue
            seen += 1
            if not issubclass(klass, DnbError):
                strays.append(f"{module.__name__}.{klass.__qualname__}")
    assert seen > 50  # the walk really found the errors modules
    assert strays == []


@pytest.mark.parametrize("module_name", [
    "native.errors", "wal.errors", "uploader.errors", "tiered.errors", "tiered.config.errors",
    "tiered.read.errors", "tiered.cluster.errors",
])
def test_each_errors_module_has_only_rooted_classes(module_name: str) -> None:
    module = importlib.import_module(module_name)
    classes = [k for _, k in inspect.getmembers(module, inspect.isclass) if issubclass(k, BaseException)]
    assert classes
    assert all(issubclass(k, DnbError) for k in classes)


def test_the_two_ownership_lost_names_are_one_class() -> None:
    from tiered.errors import OwnershipError, OwnershipLost, StorageError
    from tiered.lifecycle.ownership import OwnershipLostError
    from uploader.errors import OwnershipLost as UploaderOwnershipLost

    assert OwnershipLostError is OwnershipLost is UploaderOwnershipLost
    error = OwnershipLost("/ns/t", "write sealed state")
    assert isinstance(error, OwnershipError) and isinstance(error, StorageError)
    assert error.step == error.detail == "write sealed state"
    assert not error.retryable


def test_builtin_bases_are_kept() -> None:
    """Callers that catch a built-in keep catching the same errors."""
    from native.errors import CodecError
    from tiered.config.errors import ConfigError
    from tiered.errors import ObjectNotFound
    from tiered.lifecycle.errors import ProduceTimeout, TopicNotHosted
    from wal.errors import InvalidTopicName, WalTimeout
    from wal.fs import LockHeld

    assert issubclass(CodecError, ValueError) and issubclass(ConfigError, ValueError)
    assert issubclass(ObjectNotFound, FileNotFoundError) and issubclass(LockHeld, OSError)
    assert issubclass(TopicNotHosted, KeyError) and issubclass(ProduceTimeout, TimeoutError)
    assert issubclass(InvalidTopicName, ValueError) and issubclass(WalTimeout, TimeoutError)
