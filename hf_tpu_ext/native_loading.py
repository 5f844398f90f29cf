"""TensorFlow and triton in one process: keep TensorFlow's LLVM out of the global symbol table.

Why: the TensorFlow 2.20 and 2.21 wheels ship ``tensorflow/python/pywrap_dlopen_global_flags.py``, so
``pywrap_tensorflow.py`` loads ``_pywrap_tensorflow_internal.so`` (and with it ``libtensorflow_cc.so.2``, which
exports LLVM's C++ symbols) with ``RTLD_GLOBAL``. triton (>= 3.7, a dependency of the default, CUDA build of
torch) loads its own LLVM afterwards; its calls bind to TensorFlow's incompatible copy and its initializers
crash: ``python -c "import tensorflow, triton"`` ends in a segmentation fault. transformers 4.57 imports
triton after TensorFlow without being asked: its TensorFlow auto classes import ``transformers.generation``
-> ``masking_utils`` -> ``torch._dynamo`` -> ``torch.utils._triton.has_triton_package`` -> ``import triton``.
So with a CUDA torch installed, ``hf-tpu train`` died right after its tokenizer (TensorFlow tracker issue
124205; TensorFlow's fix, PR 124230, stops shipping that file in its shared wheels, which then load with
``RTLD_LOCAL``).

What this module does (:func:`keep_tensorflow_symbols_local`, run by ``import hf_tpu_ext``):

- TensorFlow not imported yet, triton installed, and the installed TensorFlow has the global-flags helper:
  a stand-in for the helper is registered, so TensorFlow loads ``RTLD_LOCAL`` as its fixed wheels do. Both
  orders of ``import tensorflow`` / ``import triton`` then work. Nothing is imported to decide this.
- TensorFlow already imported with its LLVM symbols global (a script that imports ``tensorflow`` before
  ``hf_tpu_ext``) and triton not imported yet: ``import triton`` would crash, so it is made to raise
  ``ImportError`` instead (``sys.modules["triton"] = None``; torch then runs as without triton) and one warning
  says so and what to do.
- Anything else (no triton, a TensorFlow without the helper, no TensorFlow): nothing changes.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import types
import warnings

#: packages that bring their own LLVM and crash when TensorFlow's LLVM symbols are global
LLVM_CLASH_PACKAGES = ("triton",)
#: the TensorFlow 2.20/2.21 module that makes ``pywrap_tensorflow`` load ``RTLD_GLOBAL``
GLOBAL_FLAGS_MODULE = "tensorflow.python.pywrap_dlopen_global_flags"
#: an LLVM symbol ``libtensorflow_cc.so.2`` exports (``llvm::outs()``): visible through ``dlopen(NULL)`` only
#: when TensorFlow was loaded with ``RTLD_GLOBAL``
LLVM_PROBE_SYMBOL = "_ZN4llvm4outsEv"

_STATE = {"action": None}


def _installed(name: str) -> bool:
    """Whether ``name`` can be found on ``sys.path`` (nothing is imported)."""
    if name in sys.modules:
        return sys.modules[name] is not None
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def _tensorflow_has_global_flags_helper() -> bool:
    """Whether the installed TensorFlow ships ``pywrap_dlopen_global_flags.py`` (found without importing it)."""
    try:
        spec = importlib.util.find_spec("tensorflow")
    except (ImportError, ValueError):
        return False
    for folder in (spec.submodule_search_locations or []) if spec else []:
        if os.path.exists(os.path.join(folder, "python", "pywrap_dlopen_global_flags.py")):
            return True
    return False


def llvm_symbols_global() -> bool:
    """Whether a library in the process put LLVM's C++ symbols in the global symbol table (``dlopen(NULL)``)."""
    import ctypes

    try:
        ctypes.CDLL(None)[LLVM_PROBE_SYMBOL]
    except (AttributeError, OSError):
        return False
    return True


def _stand_in_helper() -> types.ModuleType:
    module = types.ModuleType(GLOBAL_FLAGS_MODULE)
    module.__doc__ = ("hf_tpu_ext stand-in: TensorFlow loads its library RTLD_LOCAL, as its fixed wheels do "
                      "(see hf_tpu_ext.native_loading).")
    module.set_dlopen_flags = lambda: None  # keep Python's default dlopen flags (RTLD_NOW, local)
    module.reset_dlopen_flags = lambda: None
    return module


def keep_tensorflow_symbols_local() -> str:
    """Make TensorFlow and triton loadable in one process, in either order (see the module docstring).

    Returns:
        What was done: ``"local"`` (TensorFlow will load ``RTLD_LOCAL``), ``"triton-blocked"`` (TensorFlow was
        already loaded globally; ``import triton`` now raises ``ImportError``), or ``"none"``. Linux only; the
        first call decides, later calls return the same.
    """
    if _STATE["action"] is not None:
        return _STATE["action"]
    action = "none"
    if sys.platform.startswith("linux") and any(_installed(name) for name in LLVM_CLASH_PACKAGES):
        if "tensorflow" not in sys.modules:
            if GLOBAL_FLAGS_MODULE not in sys.modules and _tensorflow_has_global_flags_helper():
                sys.modules[GLOBAL_FLAGS_MODULE] = _stand_in_helper()
                action = "local"
        elif llvm_symbols_global():
            blocked = [name for name in LLVM_CLASH_PACKAGES if name not in sys.modules and _installed(name)]
            for name in blocked:
                sys.modules[name] = None  # import raises ImportError instead of crashing the interpreter
            if blocked:
                action = "triton-blocked"
                warnings.warn(
                    f"tensorflow was imported before hf_tpu_ext and loaded its LLVM globally, so importing "
                    f"{', '.join(blocked)} would crash this process (segmentation fault); it is disabled here "
                    "(torch runs without it). Import hf_tpu_ext before tensorflow to keep it.",
                    RuntimeWarning, stacklevel=3)
    _STATE["action"] = action
    return action
