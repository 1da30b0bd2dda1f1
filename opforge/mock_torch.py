"""``import torch`` that resolves to opforge, in the spirit of OneFlow's ``mock_torch``: unmodified PyTorch programs run
on opforge.

    python -m opforge.mock_torch train.py --epochs 3       # the script as its own __main__, with its arguments

    from opforge import mock_torch
    with mock_torch.enable():                              # inside the block, import torch gives opforge
        import torch
        import torch.nn.functional as F

``torch``, ``torch.nn``, ``torch.nn.functional``, ``torch.nn.init``, ``torch.nn.utils``, ``torch.optim``,
``torch.optim.lr_scheduler``, ``torch.utils.data`` (and its ``dataloader``, ``dataset``, ``sampler``),
``torch.autograd``, ``torch.linalg``, ``torch.special``, ``torch.cuda``, ``torch.backends`` and ``torch.accelerator``
are modules whose names are opforge's objects of the same meaning (the opforge namespace, ``opforge.nn``,
``opforge.ops``, ``opforge.optim``, ``opforge.data``...). Only PyTorch's own names are there (``torch.names`` lists
them): opforge's other names are not, so a name that means something else in opforge (``of.trace`` traces a program,
``torch.trace`` sums a diagonal) is never reached through ``torch``. ``torch.cuda`` is ``opforge.cuda``:
``torch.cuda.is_available()`` is true where CuPy sees a GPU, and ``.to("cuda")`` then runs the same program there.

A PyTorch name opforge lacks fails with an ``AttributeError`` naming it and the nearest names opforge has, when the
program reads it; with ``enable(lazy=True)`` reading it gives a stand-in that fails the same way only when it is
used (called, or an attribute of it read), so that a program that imports a name it never uses still runs. A
``torch`` submodule opforge has no counterpart of (``torch.distributed``, ``torch.jit``) is a ``ModuleNotFoundError``
naming it. Leaving the block puts back the modules that were there before (a real torch included).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import runpy
import sys
import types
from contextlib import contextmanager

import opforge as of

from . import data, nn, optim, torch_functions, torch_names
from . import ops as functional
from .nn import init
from .optim import lr_scheduler


class _Names:
    """A namespace of shims: its attributes, and nothing from elsewhere."""

    def __init__(self, **names):
        self.__dict__.update(names)


_no_accelerator = _Names(is_available=lambda: False, device_count=lambda: 0, current_device=lambda: None,
                         manual_seed=lambda seed: None, manual_seed_all=lambda seed: None,
                         synchronize=lambda device=None: None, empty_cache=lambda: None,
                         current_accelerator=lambda: None)

# torch's name -> the opforge module whose same-named attributes it offers, the names it takes from there (torch's
# list for that namespace, less the names that mean something else in opforge), and its own additions
_TOP_DENIED = {"trace", "testing", "distributed", "ops", "onnx", "data", "nn", "optim", "utils", "linalg", "autograd",
               "cuda", "backends", "accelerator"}
_SPEC = {
    "torch": (of, torch_names.TORCH - _TOP_DENIED, {
        "__version__": of.__version__, "cuda": None, "backends": None, "accelerator": None,
        "nn": None, "optim": None, "utils": None, "autograd": None, "linalg": None, "special": None,
        "trace": functional.trace}),  # torch.trace sums a diagonal (of.trace traces a program)
    "torch.nn": (nn, torch_names.NN, {"functional": None, "init": None, "utils": None, "Parameter": nn.Parameter}),
    "torch.nn.functional": (functional, torch_names.FUNCTIONAL, torch_functions.FUNCTIONAL),
    "torch.nn.init": (init, torch_names.INIT, {}),
    "torch.nn.utils": (optim, {"clip_grad_norm_"}, {}),
    "torch.optim": (optim, torch_names.OPTIM, {"lr_scheduler": None}),
    "torch.optim.lr_scheduler": (lr_scheduler, set(dir(lr_scheduler)) & {
        "StepLR", "CosineAnnealingLR", "LambdaLR", "LinearLR", "ReduceLROnPlateau", "LRScheduler"}, {}),
    "torch.utils": (None, set(), {"data": None}),
    "torch.utils.data": (data, torch_names.DATA, {}),
    # (torch's submodules of torch.utils.data, which programs import from: minGPT's trainer does)
    "torch.utils.data.dataloader": (data, {"DataLoader", "default_collate"}, {}),
    "torch.utils.data.dataset": (data, {"Dataset", "TensorDataset", "Subset", "random_split"}, {}),
    "torch.utils.data.sampler": (data, {"Sampler", "SequentialSampler", "RandomSampler"}, {}),
    "torch.autograd": (of, {"grad", "backward", "no_grad", "enable_grad", "set_grad_enabled", "detect_anomaly"}, {}),
    "torch.linalg": (of.linalg, set(of.linalg.__all__), {}),
    "torch.special": (functional, torch_names.SPECIAL & set(dir(functional)),
                      {"expit": functional.sigmoid, "gammaln": functional.lgamma, "psi": functional.digamma}),
    "torch.cuda": (of.cuda, {"is_available", "device_count", "current_device", "get_device_name", "synchronize",
                             "manual_seed", "manual_seed_all", "empty_cache", "memory_allocated"}, {}),
    "torch.accelerator": (of.cuda, {"is_available", "device_count"}, {
        "current_accelerator": lambda: of.cuda.device() if of.cuda.is_available() else None}),
    "torch.backends": (None, set(), {"mps": None, "cudnn": None, "cuda": None}),
    "torch.backends.mps": (_no_accelerator, {"is_available"}, {"is_built": lambda: False}),
    "torch.backends.cuda": (of.cuda, {"is_available"}, {"is_built": of.cuda.is_available}),
    "torch.backends.cudnn": (_no_accelerator, {"is_available"}, {"deterministic": False, "benchmark": False,
                                                                  "enabled": True}),
}
_TORCH_NAMES = {"torch": torch_names.TORCH, "torch.nn": torch_names.NN, "torch.nn.functional": torch_names.FUNCTIONAL,
                "torch.special": torch_names.SPECIAL,
                "torch.nn.init": torch_names.INIT, "torch.optim": torch_names.OPTIM,
                "torch.utils.data": torch_names.DATA}


class _Missing:
    """``enable(lazy=True)``: a PyTorch name opforge lacks, which fails when it is used."""

    def __init__(self, message: str):
        self._message = message

    def __call__(self, *args, **kwargs):
        raise AttributeError(self._message)

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        raise AttributeError(self._message)

    def __repr__(self) -> str:
        return f"<missing: {self._message}>"


class TorchModule(types.ModuleType):
    """One of torch's modules, offering opforge's objects under torch's names (see the module docstring)."""

    def __init__(self, name: str, lazy: bool):
        super().__init__(name)
        source, names, extra = _SPEC[name]
        self.__dict__.update({"_source": source, "_names": frozenset(names), "_lazy": lazy, "__path__": []})
        self.__dict__.update({k: v for k, v in extra.items() if v is not None})

    def __getattr__(self, name: str):
        if name in self._names and self._source is not None and hasattr(self._source, name):
            value = getattr(self._source, name)
            setattr(self, name, value)  # found once
            return value
        if name.startswith("__"):
            raise AttributeError(f"module '{self.__name__}' has no attribute '{name}'")
        have = [n for n in self._names if self._source is not None and hasattr(self._source, n)]
        message = torch_names.missing(self.__name__, name, _TORCH_NAMES.get(self.__name__, frozenset()), have)
        if name in _TORCH_NAMES.get(self.__name__, ()):
            message = message.replace(f"{self.__name__}.{name} is PyTorch's, and opforge does not have it (yet)",
                                      f"opforge.mock_torch: {self.__name__}.{name} is PyTorch's, and opforge does not "
                                      "have it (yet)")
            if self._lazy:
                return _Missing(message)
        raise AttributeError(message)

    def __dir__(self):
        return sorted(set(super().__dir__()) | {n for n in self._names if hasattr(self._source, n)})


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Resolves ``torch`` and its submodules to this module's ``TorchModule``s while ``enable`` is active."""

    def __init__(self, modules: dict):
        self.modules = modules

    def find_spec(self, fullname, path=None, target=None):
        if fullname != "torch" and not fullname.startswith("torch."):
            return None
        if fullname not in self.modules:
            raise ModuleNotFoundError(f"No module named '{fullname}': opforge.mock_torch has no counterpart of it "
                                      f"(it offers {', '.join(sorted(self.modules))})", name=fullname)
        return importlib.machinery.ModuleSpec(fullname, self, is_package=True)

    def create_module(self, spec):
        return self.modules[spec.name]

    def exec_module(self, module):
        pass


def modules(lazy: bool = False) -> dict:
    """A fresh set of torch's modules (name -> ``TorchModule``), each submodule an attribute of its parent."""
    made = {name: TorchModule(name, lazy) for name in _SPEC}
    for name, module in made.items():
        parent, _, child = name.rpartition(".")
        if parent:
            setattr(made[parent], child, module)
    return made


@contextmanager
def enable(lazy: bool = False):
    """Inside the block ``import torch`` (and its submodules above) gives opforge's; ``lazy`` makes a PyTorch name
    opforge lacks fail when used rather than when read. The modules there before are put back on the way out."""
    saved = {k: sys.modules.pop(k) for k in list(sys.modules) if k == "torch" or k.startswith("torch.")}
    ours = modules(lazy)
    finder = _Finder(ours)
    sys.meta_path.insert(0, finder)
    try:
        yield ours["torch"]
    finally:
        sys.meta_path.remove(finder)
        for k in [k for k in sys.modules if k == "torch" or k.startswith("torch.")]:
            del sys.modules[k]
        sys.modules.update(saved)


def main(argv: list[str] | None = None) -> None:
    """``python -m opforge.mock_torch [--lazy] script.py [args...]``: run the script as ``__main__`` with its
    arguments, ``import torch`` giving opforge."""
    argv = list(sys.argv[1:] if argv is None else argv)
    lazy = bool(argv) and argv[0] == "--lazy"
    argv = argv[lazy:]
    if not argv or argv[0] in ("-h", "--help"):
        print("usage: python -m opforge.mock_torch [--lazy] script.py [args...]\n\n" + __doc__.split("\n\n")[0])
        raise SystemExit(0 if argv else 2)
    sys.argv = argv
    with enable(lazy=lazy):
        runpy.run_path(argv[0], run_name="__main__")


if __name__ == "__main__":
    main()
