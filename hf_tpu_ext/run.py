"""``hf-tpu train``: validate everything up front, then data -> tokenizer -> backend -> outputs -> Hub.

Order matters: every check that can fail cheaply (arguments, output folder, callback names, Hub access,
data files, tokenizer, corpus size, checkpoint shape) runs before the first training step, and nothing in
an existing ``output_dir`` is touched before those checks pass.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any, Dict

from hf_tpu_ext.errors import BackendError, OutputDirError

logger = logging.getLogger("hf_tpu_ext")

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


def setup_logging(level=logging.INFO):
    if not logging.getLogger("hf_tpu_ext").handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s", "%H:%M:%S"))
        root = logging.getLogger("hf_tpu_ext")
        root.addHandler(handler)
        root.setLevel(level)
        root.propagate = False


def check_output_dir(training_args) -> None:
    """Refuse a non-empty ``output_dir`` unless overwriting or resuming was asked for.

    Raises:
        OutputDirError: the folder holds files; nothing in it is touched.
    """
    out = training_args.output_dir
    if os.path.isdir(out) and os.listdir(out):
        if training_args.overwrite_output_dir or training_args.resume_from_checkpoint:
            return
        raise OutputDirError(
            f"Output directory {out!r} already exists and is not empty ({len(os.listdir(out))} entries). "
            "Pass --overwrite_output_dir to train into it anyway, --resume_from_checkpoint true to continue the "
            "run saved there, or choose another --output_dir. Nothing in it was changed."
        )
    if os.path.exists(out) and not os.path.isdir(out):
        raise OutputDirError(f"--output_dir {out!r} exists and is a file; choose a folder path.")
    from hf_tpu_ext.fileio import check_writable_dir

    check_writable_dir(out, "--output_dir")  # before any data or model work


def check_backend(training_args) -> None:
    """Raise ``BackendError`` for a backend whose packages are missing (with the install command).

    Raises:
        MissingExtraError: the TensorFlow backend without ``pip install 'hf-tpu-ext[tensorflow]'``.
        BackendError: ``--backend torch_xla`` without torch_xla.
    """
    if training_args.backend != "torch_xla":
        from hf_tpu_ext.extras import require_extra

        require_extra("tensorflow", "the TensorFlow backend")
    else:
        import importlib.util

        if importlib.util.find_spec("torch_xla") is None:
            raise BackendError(
                "--backend torch_xla needs PyTorch/XLA, which is not installed. Install it with "
                "`pip install torch==2.9.1 torch_xla==2.9.0 accelerate` (torch_xla needs exactly torch 2.9.x), "
                "or use the default --backend tensorflow."
            )


def check_data_files(data_args) -> None:
    """Check local data files exist and have a supported format (before TensorFlow is even imported)."""
    from hf_tpu_ext.data.loading import check_data_file, is_tfrecord_source

    for option, path in (("--train_file", data_args.train_file), ("--validation_file", data_args.validation_file)):
        if path and not is_tfrecord_source(path) and "://" not in path:
            check_data_file(path, option)


def check_model_refs(model_args) -> None:
    """``--model_name_or_path``, ``--config_name`` and ``--tokenizer_name`` each name an existing folder or Hub repo
    (one bounded request per repo id; before TensorFlow is imported).

    Raises:
        ArgumentError: a missing local path or an invalid repo id.
        HubRepoError / HubAuthError: a repo id that does not exist or cannot be reached (the endpoint is named).
    """
    from hf_tpu_ext.hub.model_ref import check_model_ref

    for option in ("model_name_or_path", "config_name", "tokenizer_name"):
        value = getattr(model_args, option, None)
        if value and not (option == "config_name" and os.path.isfile(value)):  # a config.json file is fine
            check_model_ref(value, f"--{option}", revision=model_args.model_revision if option != "tokenizer_name"
                            else None)


def check_model_config(model_args, data_args) -> None:
    """Check ``max_seq_length`` against the positions of a given model/config before any data work.

    Raises:
        ArgumentError: the sequence is longer than the model's position embeddings allow.
    """
    name = model_args.model_name_or_path or model_args.config_name
    if not name:
        return
    from transformers import AutoConfig

    from hf_tpu_ext.model_config import check_positions

    try:
        config = AutoConfig.from_pretrained(name, revision=model_args.model_revision, cache_dir=model_args.cache_dir)
    except (OSError, ValueError):
        return  # the model loader reports a missing/unreadable model with its own error
    if model_args.config_name and not model_args.model_name_or_path:
        return  # from scratch: build_model widens the positions to fit
    check_positions(config, data_args.max_seq_length)


def train(model_args, data_args, training_args) -> Dict[str, Any]:
    """Run ``hf-tpu train`` end to end and return the final metrics (also in ``all_results.json``).

    Raises:
        HfTpuExtError subclasses for every bad input, before training starts.
    """
    setup_logging()
    check_output_dir(training_args)
    check_model_refs(model_args)
    check_backend(training_args)

    from hf_tpu_ext.callbacks import resolve_callbacks

    # unknown name -> error now; the torch backend's classes never import TensorFlow (loading TF before
    # torch_xla aborts the process on duplicate LLVM options)
    callback_classes = resolve_callbacks(training_args.callback_names,
                                         "torch" if training_args.backend == "torch_xla" else "tf_keras")
    check_data_files(data_args)
    check_model_config(model_args, data_args)

    if training_args.backend == "torch_xla":
        from hf_tpu_ext.backends.torch_xla.trainer import train as train_torch_xla

        return train_torch_xla(model_args, data_args, training_args, callback_classes)

    from hf_tpu_ext.backends.tensorflow.run import train_tensorflow

    return train_tensorflow(model_args, data_args, training_args, callback_classes)


def load_or_train_tokenizer(model_args, data_args, training_args, raw_datasets, resuming: bool):
    """The run's tokenizer: ``tokenizer_name``, the model's, the one saved in ``output_dir`` by the run being
    resumed, or a byte-level BPE trained on the training split.

    Raises:
        TokenizerError: it has no mask token.
    """
    from hf_tpu_ext.data.tokenizer import check_mlm_tokenizer, load_tokenizer, train_bpe_tokenizer

    out = training_args.output_dir
    if model_args.tokenizer_name or model_args.model_name_or_path:
        tok = load_tokenizer(model_args.tokenizer_name or model_args.model_name_or_path,
                             cache_dir=model_args.cache_dir)
    elif resuming and all(os.path.isfile(os.path.join(out, f)) for f in TOKENIZER_FILES):
        tok = load_tokenizer(out)
    else:
        t0 = time.perf_counter()
        tok = train_bpe_tokenizer(raw_datasets["train"]["text"], vocab_size=model_args.vocab_size,
                                  model_max_length=data_args.max_seq_length)
        logger.info("trained a byte-level BPE tokenizer of %d tokens in %.1fs", len(tok), time.perf_counter() - t0)
    check_mlm_tokenizer(tok)
    return tok


def load_text_blocks(model_args, data_args, training_args, resuming: bool):
    """Backend-neutral data path: text -> tokenizer -> int32 blocks ``[N, max_seq_length]`` per split.

    Returns:
        ``(tokenizer, blocks, description)``: blocks is a :class:`hf_tpu_ext.data.blocks.Blocks` dict with
        "train" and "validation" (cut to ``max_train_samples``/``max_eval_samples``), description a one-line
        name of the data for the model card.
    """
    from hf_tpu_ext.data.blocks import group_into_blocks
    from hf_tpu_ext.data.loading import describe_data_source, load_text_datasets

    raw = load_text_datasets(data_args, seed=training_args.seed, cache_dir=model_args.cache_dir)
    tok = load_or_train_tokenizer(model_args, data_args, training_args, raw, resuming)
    blocks = group_into_blocks(raw, tok, data_args.max_seq_length, num_proc=data_args.preprocessing_num_workers)
    if data_args.max_train_samples:
        blocks["train"] = blocks["train"][: data_args.max_train_samples]
    if data_args.max_eval_samples and "validation" in blocks:
        blocks["validation"] = blocks["validation"][: data_args.max_eval_samples]
    return tok, blocks, describe_data_source(data_args)
