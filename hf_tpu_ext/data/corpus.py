"""The embedded default corpus: CPython's built-in documentation (``pydoc_data.topics``).

``pydoc_data`` ships with every CPython install (it backs ``help("topic")``), so training works with
no data files and no network. It holds ~80 help topics (~465k characters of English prose about the
language, with some code examples). It is small: good for smoke tests, demos and CI, not for a useful
language model.
"""

from __future__ import annotations

import re
import sys
from typing import List

DEFAULT_CORPUS_DESCRIPTION = (
    "CPython's built-in documentation (pydoc_data.topics, Python "
    f"{sys.version_info.major}.{sys.version_info.minor}.{sys.version_info.micro})"
)

# a heading underline such as "*****" or "=====" carries no text
_RULE = re.compile(r"^[\s*=\-~^+#]+$")
_BLANK_SPLIT = re.compile(r"\n[ \t]*\n")


def default_corpus_texts() -> List[str]:
    """The default corpus as a list of paragraph documents.

    Topics are visited in sorted key order and split at blank lines; inside a paragraph the lines
    are stripped and joined with single spaces, heading underlines and empty paragraphs are dropped.
    The result is identical on every call within one Python version.

    Returns:
        list[str]: about 2,500 non-empty, single-line documents (~450k characters in total).
    """
    from pydoc_data.topics import topics

    docs: List[str] = []
    for key in sorted(topics):
        for para in _BLANK_SPLIT.split(topics[key]):
            lines = [ln.strip() for ln in para.splitlines()]
            text = " ".join(ln for ln in lines if ln and not _RULE.match(ln))
            if text:
                docs.append(text)
    return docs
