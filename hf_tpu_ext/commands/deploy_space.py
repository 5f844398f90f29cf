"""``hf-tpu deploy-space``: create a Hub Space running the fill-mask demo of a pushed model.

Example:
    hf-tpu deploy-space --model_id alice/tiny-roberta --space_id alice/tiny-roberta-demo
"""

from __future__ import annotations

import argparse
from typing import List, Optional

# hf_tpu_ext.hub.space: imported inside the functions that use it, so numpy stays out of
# `hf-tpu deploy-space --help` (+0.15 s measured)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``hf-tpu deploy-space``."""
    parser = argparse.ArgumentParser(prog="hf-tpu deploy-space",
                                     description="Create (or update) a Gradio Space showing a model's fill-mask demo.")
    parser.add_argument("--model_id", required=True, help="Model repo id 'user/name' on the Hub (push it first).")
    parser.add_argument("--space_id", required=True, help="Space repo id 'user/name' (created when missing).")
    parser.add_argument("--private", action="store_true", default=None, help="Create the Space private.")
    parser.add_argument("--hub_token", default=None,
                        help="Hub token with write access (default: HF_TOKEN or the cached login). Never printed.")
    return parser


def main(argv: Optional[List[str]] = None) -> int:
    """Run ``hf-tpu deploy-space``; prints the Space URL.

    Returns:
        0 on success.

    Raises:
        HubRepoError, HubAuthError, HubError: see :func:`hf_tpu_ext.hub.space.deploy_space`.
    """
    args = build_parser().parse_args(argv)  # --help ends here, before the Space's modules load
    from hf_tpu_ext.hub.space import deploy_space

    url = deploy_space(args.model_id, args.space_id, token=args.hub_token, private=args.private)
    print(url)
    return 0
