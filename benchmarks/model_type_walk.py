"""The ``--model_type`` walk: which product files a model-type value passes through on the way from the command
line to an exported config, and how often it comes back to a file it had left (issue 48's figure).

Usage (from the repository root or another checkout's, the current-releases venv)::

    PYTHONPATH=. KERAS_BACKEND=jax JAX_PLATFORMS=cpu python -m benchmarks.model_type_walk [bert]

The steps a from-scratch Keras run takes with the value: ``parse_args``, ``run.checks.check_model_type``,
``data.tokenizer.prepare_tokenizer`` (trained), ``model_config.build_config``, ``backends.keras.model
.build_masked_lm``, ``backends.keras.export.export_config``, ``model_config.model_summary_fields``. A file is on the
walk when one of its functions is called with the value (an argument equal to it, or an object whose
``model_type`` is it); consecutive calls in one file are one visit; a *return* is a visit to a file visited before.
``folded`` counts the same walk with the calls into ``hf_tpu_ext/model_types/`` (record lookups, which return at
once) folded into their caller. ``named_in`` lists the product files outside ``model_types/`` and
``backends/keras/architectures/`` whose code has a string literal equal to the value (a table or branch to edit).
Prints one JSON line.
"""

from __future__ import annotations

import ast
import json
import os
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = os.path.join(ROOT, "hf_tpu_ext") + os.sep
ALLOWED = (os.path.join("hf_tpu_ext", "model_types"), os.path.join("hf_tpu_ext", "backends", "keras", "architectures"))


def _visits(walk):
    seen, returns = set(), 0
    for rel in walk:
        returns += rel in seen
        seen.add(rel)
    return {"files": len(seen), "returns": returns}


def named_in(value: str):
    """Product files (outside the two allowed folders) with a non-docstring string literal equal to ``value``."""
    found = []
    for folder, _, files in os.walk(PACKAGE):
        rel_folder = os.path.relpath(folder, ROOT)
        for name in sorted(f for f in files if f.endswith(".py") and not rel_folder.startswith(ALLOWED)):
            tree = ast.parse(open(os.path.join(folder, name), encoding="utf-8").read())
            docs = {id(n.body[0].value) for n in ast.walk(tree) if isinstance(n, (ast.Module, ast.ClassDef,
                    ast.FunctionDef, ast.AsyncFunctionDef)) and n.body and isinstance(n.body[0], ast.Expr)}
            if any(isinstance(n, ast.Constant) and n.value == value and id(n) not in docs for n in ast.walk(tree)):
                found.append(os.path.join(rel_folder, name))
    return found


def trace(value: str):
    """The walk (file per visit) of ``value`` through the steps of the module doc."""
    from hf_tpu_ext.args import parse_args
    from hf_tpu_ext.backends.keras.export import export_config
    from hf_tpu_ext.backends.keras.model import build_masked_lm
    from hf_tpu_ext.data.tokenizer import prepare_tokenizer
    from hf_tpu_ext.model_config import build_config, model_summary_fields
    from hf_tpu_ext.run.checks import check_model_type

    walk = []

    def holds(v):
        try:
            return v == value or getattr(v, "model_type", None) == value
        except Exception:  # noqa: BLE001 -- an object whose == or getattr raises holds nothing
            return False

    def tracer(frame, event, arg):
        if event == "call" and frame.f_code.co_filename.startswith(PACKAGE):
            if any(holds(v) for v in list(frame.f_locals.values())):
                rel = os.path.relpath(frame.f_code.co_filename, ROOT)
                if not walk or walk[-1] != rel:
                    walk.append(rel)

    texts = [f"the quick brown fox {i} jumps over the lazy dog number {i % 7}" for i in range(200)]
    with tempfile.TemporaryDirectory() as out:
        sys.settrace(tracer)
        try:
            model_args, _, training_args = parse_args(["--output_dir", out, "--model_type", value, "--backend",
                                                       "keras", "--vocab_size", "300", "--max_seq_length", "64"])
            check_model_type(model_args, training_args)
            config = build_config(model_args, prepare_tokenizer(model_args, texts, 64), 64)
            export_config(build_masked_lm(config, seed=0), config)
            model_summary_fields(config, 1)
        finally:
            sys.settrace(None)
    return walk


def main(argv=None) -> int:
    value = (argv if argv is not None else sys.argv[1:] or ["bert"])[0]
    walk = trace(value)
    folded = []
    for rel in (r for r in walk if not r.startswith(ALLOWED[0])):
        if not folded or folded[-1] != rel:
            folded.append(rel)
    print(json.dumps({"model_type": value, **_visits(walk), "folded": _visits(folded), "named_in": named_in(value),
                      "walk": walk}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
