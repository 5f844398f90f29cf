"""A CUDA-build torch (with triton) beside the TensorFlow backend, simulated.

The real crash: TensorFlow 2.20/2.21 loads its library with RTLD_GLOBAL, which puts its LLVM in the global symbol
table; triton's LLVM then binds to it and `import triton` segfaults. transformers 4.57's TF auto classes import
triton through torch._dynamo. The CUDA wheel is gigabytes, so these tests put a fake `triton` on PYTHONPATH that
aborts exactly when the real one would crash (an LLVM symbol of TensorFlow's visible through dlopen(NULL)) and
otherwise offers what torch 2.13 reads from it at import. Checked by hand against the real wheels: see the
README's PyTorch step.
"""

import os
import subprocess
import sys
import textwrap

import pytest

from conftest import REPO_ROOT

FAKE_TRITON = '''
import ctypes, importlib, importlib.abc, importlib.machinery, os, sys, types

try:
    ctypes.CDLL(None)["_ZN4llvm4outsEv"]  # llvm::outs() of libtensorflow_cc: TensorFlow loaded RTLD_GLOBAL
    _clash = True
except AttributeError:
    _clash = False
if _clash:
    sys.stderr.write("fake triton: LLVM symbols are global, the real triton would segfault here\\n")
    sys.stderr.flush()
    os.abort()

__version__ = "3.7.0"
_SUBMODULES = {"language", "backends", "compiler", "runtime", "testing", "tools", "knobs", "experimental"}


def _attributes(module_name):
    def __getattr__(name):  # torch reads types and submodules of triton at import: any name is a class
        if name.startswith("__"):
            raise AttributeError(name)
        if name in _SUBMODULES:
            return importlib.import_module(module_name + "." + name)
        return type(name, (), {})
    return __getattr__


class _Loader(importlib.abc.Loader):
    def create_module(self, spec):
        module = types.ModuleType(spec.name)
        module.__getattr__, module.__path__ = _attributes(spec.name), []
        return module

    def exec_module(self, module):
        pass


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.startswith("triton."):
            return importlib.machinery.ModuleSpec(name, _Loader(), is_package=True)
        return None


sys.meta_path.insert(0, _Finder())
__getattr__ = _attributes("triton")
'''


@pytest.fixture(scope="module")
def fake_triton(tmp_path_factory):
    """A folder to put on PYTHONPATH: the fake `triton` package and its dist-info (transformers reads the version
    from the metadata, as with the real wheel, instead of importing it)."""
    root = tmp_path_factory.mktemp("fake_triton")
    (root / "triton").mkdir()
    (root / "triton" / "__init__.py").write_text(FAKE_TRITON)
    (root / "triton-3.7.0.dist-info").mkdir()
    (root / "triton-3.7.0.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: triton\nVersion: 3.7.0\n")
    return root


def _python(code, fake_triton, cwd, *args, timeout=300):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(fake_triton), str(REPO_ROOT)]), TF_CPP_MIN_LOG_LEVEL="3")
    return subprocess.run([sys.executable, *(["-c", textwrap.dedent(code)] if code else []), *args], env=env,
                          cwd=str(cwd), capture_output=True, text=True, timeout=timeout)


def test_the_fake_triton_crashes_after_a_plain_tensorflow_import(fake_triton, tmp_path):
    """The simulation is faithful: TensorFlow first, then triton, without hf_tpu_ext, aborts the process."""
    proc = _python("import tensorflow\nimport triton\n", fake_triton, tmp_path)
    assert proc.returncode == -6, proc.stderr[-2000:]  # SIGABRT
    assert "fake triton: LLVM symbols are global" in proc.stderr


def test_tensorflow_imported_before_hf_tpu_ext_blocks_triton_with_one_warning(fake_triton, tmp_path):
    """Too late to load TensorFlow locally: triton is disabled (ImportError, not a segfault), said once, and
    transformers' TF classes still import (torch runs without triton)."""
    proc = _python("""
        import warnings
        import tensorflow
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            import hf_tpu_ext
        from hf_tpu_ext.native_loading import keep_tensorflow_symbols_local
        print(keep_tensorflow_symbols_local())
        print([str(w.message) for w in caught])
        try:
            import triton
        except ImportError:
            print("triton: ImportError")
        from transformers import TFAutoModelForMaskedLM
        print("transformers TF classes imported")
    """, fake_triton, tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    assert lines[0] == "triton-blocked"
    assert lines[1] == str(["tensorflow was imported before hf_tpu_ext and loaded its LLVM globally, so importing "
                            "triton would crash this process (segmentation fault); it is disabled here (torch runs "
                            "without it). Import hf_tpu_ext before tensorflow to keep it."])
    assert lines[2:] == ["triton: ImportError", "transformers TF classes imported"]


def test_hf_tpu_train_and_the_card_snippets_run_with_triton_installed(fake_triton, tmp_path):
    """`hf-tpu train` on a tiny model exits 0 with triton on the path (it died after the tokenizer before), and
    the card's TensorFlow and pipeline snippets load the result in a fresh process."""
    train = ["-m", "hf_tpu_ext", "train", "--output_dir", "out", "--hidden_size", "32", "--num_hidden_layers", "1",
             "--num_attention_heads", "2", "--intermediate_size", "64", "--vocab_size", "300",
             "--max_seq_length", "32", "--per_device_train_batch_size", "8", "--max_train_samples", "64",
             "--max_eval_samples", "16", "--max_steps", "2", "--logging_steps", "1", "--eval_strategy", "no",
             "--disable_tqdm", "true"]
    proc = _python(None, fake_triton, tmp_path, *train, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "fake triton" not in proc.stderr
    assert (tmp_path / "out" / "tf_model.h5").exists() and (tmp_path / "out" / "model.safetensors").exists()
    snippet = _python("""
        import sys
        from transformers import TFAutoModelForMaskedLM, pipeline
        import triton  # the real one would be importable here too: TensorFlow loaded after it
        model = TFAutoModelForMaskedLM.from_pretrained("out", use_safetensors=False)
        fill_mask = pipeline("fill-mask", model="out")
        print(len(fill_mask("The goal of life is <mask>.")))
    """, fake_triton, tmp_path)
    assert snippet.returncode == 0, snippet.stderr[-3000:]
    assert snippet.stdout.split() == ["5"]
