"""The fill-mask test bench as a library: predictor, revisions, model cache, probe reports with error bars.

``spaces_demo/app.py`` is the Gradio page on top of it; ``hf-tpu probe`` and ``hf-tpu demo`` use it too.
Importing it loads no deep-learning framework and no Gradio (``torch`` / ``tensorflow`` / ``transformers``
are imported inside functions); besides itself it uses only :mod:`hf_tpu_ext.probes`, so ``hf-tpu
deploy-space`` uploads these files with the Space's ``app.py`` (see :func:`space_modules`).

Modules: :mod:`.predictor` (one revision: tokenizer + forward pass + input rules), :mod:`.revisions` (which
revisions hold a model, the LRU model cache), :mod:`.bench` (what the page and API serve), :mod:`.report`
(figures with 95% intervals, template spread, paired comparisons), :mod:`.stats` (Wilson, bootstrap,
McNemar), :mod:`.quiet` (library logging for a server).
"""

import ast
import os
from typing import List

from hf_tpu_ext.fill_mask.bench import FillMaskBench
from hf_tpu_ext.fill_mask.predictor import DEFAULT_TOP_K, FillMaskPredictor, parse_top_k, select_backend



def space_modules() -> List[str]:
    """The package files a Space needs beside ``app.py``, as paths relative to the folder holding ``hf_tpu_ext/``.

    This package's modules and every ``hf_tpu_ext`` module they import (followed through their imports, those
    inside functions too), with the ``__init__.py`` of each package on the way: ``hf_tpu_ext/__init__.py``,
    ``hf_tpu_ext/probes/*.py``, ``hf_tpu_ext/fill_mask/*.py`` and whatever ``hf_tpu_ext/__init__.py`` imports.
    Read from the source (``ast``), so a new import is uploaded without a list to update.

    Returns:
        Sorted ``"hf_tpu_ext/..."`` paths with ``/`` separators.
    """
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    here = os.path.dirname(os.path.abspath(__file__))
    todo = [os.path.relpath(os.path.join(here, n), root) for n in sorted(os.listdir(here)) if n.endswith(".py")]
    seen = set()
    while todo:
        rel = todo.pop()
        if rel in seen:
            continue
        seen.add(rel)
        parts = rel.split(os.sep)
        for i in range(1, len(parts)):  # the packages above the module
            todo.append(os.path.join(*parts[:i], "__init__.py"))
        with open(os.path.join(root, rel), encoding="utf-8") as f:
            tree = ast.parse(f.read())
        package = parts[:-1] if parts[-1] != "__init__.py" else parts[:-1]
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    base = ".".join(package[: len(package) - node.level + 1] + ([base] if base else []))
                names = [base] + [f"{base}.{a.name}" for a in node.names]
            for name in names:
                if not name.startswith("hf_tpu_ext"):
                    continue
                path = os.path.join(root, *name.split("."))
                if os.path.isfile(path + ".py"):
                    todo.append(os.path.relpath(path + ".py", root))
                elif os.path.isfile(os.path.join(path, "__init__.py")):
                    todo.append(os.path.relpath(os.path.join(path, "__init__.py"), root))
    return sorted(p.replace(os.sep, "/") for p in seen)


__all__ = ["DEFAULT_TOP_K", "FillMaskBench", "FillMaskPredictor", "space_modules", "parse_top_k", "select_backend"]
