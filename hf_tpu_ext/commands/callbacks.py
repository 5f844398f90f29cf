"""``hf-tpu callbacks``: list the callback names, the frameworks each one supports, and a one-line description."""

from __future__ import annotations

import argparse
from typing import List, Optional

from hf_tpu_ext.callbacks import (ENTRY_POINT_GROUPS, FRAMEWORKS, available_callbacks, callback_frameworks,
                                  framework_requirements, normalize_framework)
from hf_tpu_ext.extras import install_hint, missing_for


def main(argv: Optional[List[str]] = None) -> int:
    """Print every registered callback (built-in, decorated, entry points): name, frameworks, description.

    One line per name: ``name  frameworks  description``, frameworks comma-separated in the order
    ``tf_keras,keras,torch``; then one line per framework that is not installed here, with its pip extra.
    Imports no framework.

    Args:
        argv: command-line arguments after ``callbacks`` (``--framework NAME`` lists one framework's names).

    Returns:
        0.

    Raises:
        ArgumentError: an unknown ``--framework``.
    """
    parser = argparse.ArgumentParser(
        prog="hf-tpu callbacks",
        description="List the callbacks `hf-tpu train --callbacks a,b` and `hf_tpu_ext.callbacks.get_callback` accept, "
        "with the frameworks each one supports (tf_keras: tf_keras/TensorFlow fit; keras: Keras 3 fit on JAX, "
        "TensorFlow or torch; torch: transformers Trainer). Third-party packages add more through the entry-point "
        "groups " + ", ".join(f"'{g}' ({fw})" for fw, g in ENTRY_POINT_GROUPS.items()) + ".",
    )
    parser.add_argument("--framework", default=None, help="List only the callbacks of this framework "
                        "(tf_keras, keras or torch; aliases tensorflow, torch_xla).")
    args = parser.parse_args(argv or [])

    if args.framework:
        fw = normalize_framework(args.framework)
        rows = {name: ([fw], text) for name, text in available_callbacks(fw).items()}
    else:
        rows = {}
        for name, frameworks in callback_frameworks().items():
            rows[name] = (frameworks, available_callbacks(frameworks[0])[name])
    width = max((len(n) for n in rows), default=0)
    fw_width = max((len(",".join(f)) for f, _ in rows.values()), default=0)
    for name, (frameworks, description) in rows.items():
        print(f"{name.ljust(width)}  {','.join(frameworks).ljust(fw_width)}  {description}")
    for fw in ([normalize_framework(args.framework)] if args.framework else FRAMEWORKS):
        extra, modules = framework_requirements(fw)
        if missing_for(extra, modules):
            print(f"({fw} is not installed here: {install_hint(extra)})")
    return 0
