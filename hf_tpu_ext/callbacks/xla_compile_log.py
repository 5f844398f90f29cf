"""Count real XLA compilations of TensorFlow programs through XLA's own dump folder (no TensorFlow import).

TensorFlow 2.21 counts XLA compilations in the C++ metric ``/tensorflow/core/xla_compilations``, but no
Python API reads it (``tensorflow.python.eager.monitoring`` only creates new metrics), and the
``TF_XLA_FLAGS`` options (``--tf_xla_persistent_cache_directory``) are frozen when TensorFlow is imported.
XLA's debug options (``XLA_FLAGS``) are read at the process's first XLA compilation instead, and
``--xla_dump_to=DIR`` makes XLA write ``module_<id>.<module name>.*`` files for every HLO module it compiles,
with a process-unique ``<id>`` per compilation. Counting the distinct ids is counting compilations --
including the ones a ``tf.function`` does not retrace for (a short last batch under a relaxed ``None``
batch dimension is one trace but a second XLA compilation).

Costs and limits: files are written only while compiling (seconds, once per shape), and are deleted as
soon as they are counted (the folder is removed at exit). Only modules whose name matches
:data:`MODULE_RE` are dumped (Keras train/test step functions), so other ``jit_compile`` functions of the
process are not slowed. The dump can only be switched on before the process's first XLA compilation
(XLA reads ``XLA_FLAGS`` once); a caller that expects XLA compilations and sees none falls back to
counting traces.
"""

from __future__ import annotations

import atexit
import os
import re
import shlex
import shutil
import tempfile
import threading
from typing import Dict, Optional

from hf_tpu_ext.environment import XLA_FLAGS, process_variables

# the step functions XLA compiles in tf_keras (``run_step``) and Keras 3 on TensorFlow
# (``one_step_on_data``, ``multi_step_on_iterator``...); XLA full-matches this against the module name
MODULE_RE = r".*(run_step|train_function|train_step|one_step_on|multi_step_on|step_on_data|step_on_iterator).*"
_MODULE_FILE = re.compile(r"^module_(\d+)\.([^.]+)")

_LOCK = threading.Lock()
_LOG: Optional["XlaCompileLog"] = None


def _flag_value(flags: str, name: str) -> Optional[str]:
    for token in shlex.split(flags):
        if token.startswith(f"--{name}="):
            return token.split("=", 1)[1]
    return None


class XlaCompileLog:
    """The process's XLA dump folder, read as a log of compilations.

    Attributes:
        directory: the dump folder (``--xla_dump_to``).
        owned: True when this module created the folder (its files are deleted once counted); False when
            the user's ``XLA_FLAGS`` already named one (files are only read, never deleted).
    """

    def __init__(self, directory: str, owned: bool):
        self.directory = directory
        self.owned = owned
        self._seen: Dict[int, str] = {}  # module id -> module name, over the process's life
        self._lock = threading.Lock()

    def poll(self) -> Dict[int, str]:
        """New compilations since the last poll: ``{module id: module name}`` (ids increase over time).

        Reads the folder (one ``os.listdir``, microseconds when nothing was compiled) and, when the folder
        is this module's own, deletes the files it has counted.
        """
        with self._lock:
            try:
                names = os.listdir(self.directory)
            except FileNotFoundError:
                return {}
            new: Dict[int, str] = {}
            for name in names:
                match = _MODULE_FILE.match(name)
                if not match:
                    continue
                module_id = int(match.group(1))
                if module_id not in self._seen:
                    self._seen[module_id] = new[module_id] = match.group(2)
                if self.owned:
                    try:
                        os.remove(os.path.join(self.directory, name))
                    except OSError:  # XLA may still be writing another file of this module: next poll
                        pass
            return dict(sorted(new.items()))

    def cleanup(self) -> None:
        if self.owned:
            shutil.rmtree(self.directory, ignore_errors=True)


def compile_log() -> XlaCompileLog:
    """The process-wide :class:`XlaCompileLog`, switching XLA's dump on at the first call.

    Appends ``--xla_dump_to=<temp folder> --xla_dump_hlo_module_re=<MODULE_RE>`` to ``XLA_FLAGS`` unless
    the user's ``XLA_FLAGS`` already has ``--xla_dump_to`` (then that folder is read). Call it before the
    process's first XLA compilation (e.g. when a callback is constructed, before ``fit``).
    """
    global _LOG
    with _LOCK:
        if _LOG is not None:
            return _LOG
        flags = process_variables().get(XLA_FLAGS, "")
        existing = _flag_value(flags, "xla_dump_to")
        if existing:
            _LOG = XlaCompileLog(existing, owned=False)
            return _LOG
        directory = tempfile.mkdtemp(prefix="hf-tpu-xla-compile-log-")
        os.environ[XLA_FLAGS] = " ".join(
            part for part in (flags, f"--xla_dump_to={directory}", f"--xla_dump_hlo_module_re={MODULE_RE}") if part
        )
        _LOG = XlaCompileLog(directory, owned=True)
        atexit.register(_LOG.cleanup)
        return _LOG
