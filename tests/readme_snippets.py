"""Run a README ```python block as a user would: copied as written into a fresh folder beside a ``train.txt``.

Used by the tests of the README's drop-in scripts (tf_keras, Keras 3 + keras-hub, transformers ``Trainer``): the one
change to a block is the tokenizer it downloads, swapped for a local one (no network here).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Dict, Mapping

README = Path(__file__).resolve().parent.parent / "README.md"


def readme_python_block(heading: str) -> str:
    """The first ```python block under the README heading ``heading`` (e.g. ``"### Callbacks in ..."``), as written."""
    readme = README.read_text(encoding="utf-8")
    assert readme.count(heading) == 1, f"{heading!r} is not one README heading"
    section = readme.split(heading, 1)[1]
    return section.split("```python\n", 1)[1].split("```", 1)[0]


def run_readme_block(heading: str, folder: Path, swap: Mapping[str, str], env: Mapping[str, str] = (),
                     timeout: float = 900) -> subprocess.CompletedProcess:
    """Run the block under ``heading`` as ``folder/snippet.py`` in a fresh process, with ``folder/train.txt``.

    Args:
        swap: exact text of the block -> its replacement; each must occur once (the block names it as written).
        env: variables set on top of this process's (the loopback Hub's ``HF_ENDPOINT``/``HF_HOME`` are there).
    """
    from hf_tpu_ext.data.corpus import default_corpus_texts

    code = readme_python_block(heading)
    for old, new in swap.items():
        assert code.count(old) == 1, f"{old!r} is not once in the block under {heading!r}"
        code = code.replace(old, new)
    (folder / "snippet.py").write_text(code, encoding="utf-8")
    (folder / "train.txt").write_text("\n".join(default_corpus_texts()[:160]) + "\n", encoding="utf-8")
    full_env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path), **dict(env))
    return subprocess.run([sys.executable, "snippet.py"], cwd=str(folder), env=full_env, capture_output=True,
                          text=True, timeout=timeout)


def card_rows(card_text: str) -> Dict[str, str]:
    """The card's two-column table rows, ``{label: value}``."""
    cells = ([p.strip() for p in line.strip().strip("|").split("|")] for line in card_text.splitlines())
    return {c[0]: c[1] for c in cells if len(c) == 2}
