"""``hf-tpu demo``: launch the Gradio fill-mask demo (``spaces_demo/app.py``) for a model folder or repo id.

Example:
    hf-tpu demo output/ --port 7860
"""

from __future__ import annotations

import argparse
import os
from typing import List, Optional

from hf_tpu_ext.errors import ArgumentError, MissingExtraError
from hf_tpu_ext.extras import missing_for, no_framework_message, require_extra
from hf_tpu_ext.hub.model_ref import check_model_ref

# hf_tpu_ext.fill_mask.quiet: imported inside the functions that use it, so numpy stays out of
# `hf-tpu demo --help` (+0.15 s measured)

_YES = ("yes", "true", "1", "y")
_NO = ("no", "false", "0", "n")


def _yes_no(value: str) -> bool:
    v = str(value).strip().lower()
    if v in _YES:
        return True
    if v in _NO:
        return False
    raise argparse.ArgumentTypeError(f"expected yes or no, got {value!r}")


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``hf-tpu demo``."""
    parser = argparse.ArgumentParser(prog="hf-tpu demo", description="Launch the Gradio fill-mask demo locally.")
    parser.add_argument("model", nargs="?", default=None,
                        help="Model folder (what `hf-tpu train` writes) or Hub repo id (default: $MODEL_ID).")
    parser.add_argument("--host", default="127.0.0.1", help="Address to listen on; 0.0.0.0 serves other machines too.")
    parser.add_argument("--port", type=int, default=7860, help="Port to listen on.")
    parser.add_argument("--share", type=_yes_no, default=False, metavar="{yes,no}",
                        help="Create a public gradio.live link (needs internet).")
    parser.add_argument("--backend", default=None, choices=("auto", "torch", "tensorflow"),
                        help="Forward pass: torch when installed (auto), else TensorFlow.")
    parser.add_argument("--revision", default=None, help="Branch, tag or commit of a Hub repo.")
    parser.add_argument("--concurrency_limit", type=int, default=4, help="Requests served at the same time.")
    parser.add_argument("--log_level", default="warning", choices=("debug", "info", "warning", "error", "critical"),
                        help="info or debug shows Hub download bars and library notices (default: warning: quiet).")
    return parser


def load_demo(model: Optional[str], backend: Optional[str] = None, revision: Optional[str] = None,
              concurrency_limit: int = 4):
    """Build the demo app for ``model``, turning loading problems into :class:`ArgumentError`.

    Args:
        model: model folder or Hub repo id; ``None`` uses ``$MODEL_ID``.
        backend: ``"torch"``, ``"tensorflow"``, ``"auto"`` or ``None``.
        revision: branch, tag or commit of a Hub repo.
        concurrency_limit: requests served at the same time (>= 1).

    Returns:
        The ``gr.Blocks`` app (not launched).

    Raises:
        ArgumentError: no model, a folder that is not a model, or a model that cannot be loaded.
        MissingExtraError: gradio, or both PyTorch and TensorFlow, are not installed (names the pip extra).
    """
    require_extra("demo", "hf-tpu demo")
    if missing_for("torch", ("torch",)) and missing_for("tensorflow", ("tensorflow",)):
        raise MissingExtraError(no_framework_message("hf-tpu demo", extra="demo"))
    from spaces_demo.app import MODEL_ENV, build_demo, model_id_from_environment

    model = model or model_id_from_environment()
    if not model:
        raise ArgumentError(f"Give the model to show: `hf-tpu demo OUTPUT_DIR` or a repo id, or set ${MODEL_ENV}.")
    if concurrency_limit < 1:
        raise ArgumentError(f"--concurrency_limit must be >= 1, got {concurrency_limit}.")
    check_model_ref(model, "MODEL", revision=revision)  # a missing folder or repo: seconds, not a minute
    if os.path.isdir(model) and not os.path.isfile(os.path.join(model, "config.json")):
        raise ArgumentError(f"{model} has no config.json: pass the output_dir of `hf-tpu train` (the folder with "
                            "config.json, tokenizer files and model.safetensors).")
    try:
        return build_demo(model, backend=backend, revision=revision, concurrency_limit=concurrency_limit)
    except (OSError, ValueError, ImportError) as err:
        raise ArgumentError(f"Cannot load {model} for the demo: {err}") from err


def check_port_free(host: str, port: int, option: str = "--port") -> None:
    """Bind ``(host, port)`` once to see it is free, before the model is loaded.

    Raises:
        ArgumentError: the port is in use or not allowed (one line naming ``option``).
    """
    import errno
    import socket

    if not 0 < port < 65536:
        raise ArgumentError(f"{option} {port} is not a TCP port (1-65535).")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError as err:
            if err.errno == errno.EADDRINUSE:
                raise ArgumentError(f"Port {port} on {host} is already in use (another demo or server?); pass a free one "
                                    f"with {option}, e.g. {option} {port + 1}.") from None
            if err.errno in (errno.EACCES, errno.EPERM):
                raise ArgumentError(f"Port {port} needs administrator rights; pass one above 1023 with {option}.") from None
            raise ArgumentError(f"Cannot listen on {host}:{port} ({err.strerror}); check --host and {option}.") from None


def main(argv: Optional[List[str]] = None) -> int:
    """Run ``hf-tpu demo``; blocks until the server is stopped (Ctrl-C).

    Returns:
        0.

    Raises:
        ArgumentError: see :func:`load_demo`; the port is in use (names ``--port``).
        HubRepoError: the model is neither a folder nor a repo at the Hub endpoint, or the endpoint is unreachable.
    """
    args = build_parser().parse_args(argv)
    from spaces_demo.app import model_id_from_environment

    if args.model or model_id_from_environment():  # (no model: load_demo says so first)
        check_port_free(args.host, args.port)  # before the model is loaded, not a 15-line OSError after
    from hf_tpu_ext.fill_mask.quiet import quieted
    from spaces_demo.app import launch

    # before the model download: no bars, no library notices unless asked; restored when the command ends (it runs
    # in the caller's process, which may push or download afterwards)
    with quieted(args.log_level):
        demo = load_demo(args.model, backend=args.backend, revision=args.revision,
                         concurrency_limit=args.concurrency_limit)
        launch(demo, args.host, args.port, args.share, share_hint="--share yes")
        demo.block_thread()
    return 0
