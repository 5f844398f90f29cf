"""``hf-tpu callbacks``: list the callback names ``--callbacks`` accepts, one line each."""

from __future__ import annotations

import argparse
from typing import List, Optional


def main(argv: Optional[List[str]] = None) -> int:
    """Print every registered callback (built-in, decorated, entry points) with its description.

    Args:
        argv: command-line arguments after ``callbacks`` (only ``--help``).

    Returns:
        0.
    """
    parser = argparse.ArgumentParser(
        prog="hf-tpu callbacks",
        description="List the callbacks `hf-tpu train --callbacks a,b` accepts. Third-party packages add more "
        "through the entry-point group 'hf_tpu_ext.callbacks'.",
    )
    parser.parse_args(argv or [])
    from hf_tpu_ext.callbacks import available_callbacks

    names = available_callbacks()
    width = max((len(n) for n in names), default=0)
    for name, description in names.items():
        print(f"{name.ljust(width)}  {description}")
    return 0
