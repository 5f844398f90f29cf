"""The PyTorch masked LM, its loss at the masked positions only, and the model folder it is saved as.

The model is a stock :class:`transformers.RobertaForMaskedLM` built from the same config as the
TensorFlow backend's model (:func:`hf_tpu_ext.model_config.build_config`), with ``attn_implementation="eager"``:
the SDPA path of transformers 4.57 calls ``torch.all(mask == 1)`` in ``_prepare_4d_attention_mask_for_sdpa``
on every forward, a device-to-host sync per step on XLA; on XLA both paths lower to the same fused
matmul/softmax graph, so eager loses nothing and keeps the step free of syncs.

As in the TensorFlow backend, the vocabulary projection runs only at the ``P`` chosen positions of each
sequence (:func:`masked_lm_sums`), not at all ``L``.
"""

from __future__ import annotations

import os
from typing import Any, Dict, Optional

from hf_tpu_ext.metrics.masked_lm_torch import masked_lm_sums  # noqa: F401  (the masked-position loss)
from hf_tpu_ext.model_config import build_config, check_positions, dropout_overrides  # noqa: F401 (re-exported)

from hf_tpu_ext.data.tokenizer import save_tokenizer_files
from hf_tpu_ext.errors import CheckpointError
from hf_tpu_ext.model_config import model_summary_fields as fields


def build_model(model_args, tokenizer, max_seq_length: int, seed: Optional[int] = None):
    """Create the PyTorch masked LM (on the CPU; the Trainer moves it to the XLA device).

    Args:
        model_args: :class:`hf_tpu_ext.args.ModelArguments`.
        tokenizer: the run's tokenizer.
        max_seq_length: ``L``.
        seed: seeds weight initialization when training from scratch.

    Returns:
        ``RobertaForMaskedLM`` (or another ``AutoModelForMaskedLM``) with eager attention.

    Raises:
        ArgumentError: a bad size combination or an ``L`` the positions do not allow.
        CheckpointError: ``model_name_or_path`` has no loadable weights.
    """
    import torch
    from transformers import AutoModelForMaskedLM

    if model_args.model_name_or_path:
        from transformers import AutoConfig

        try:
            model_type = AutoConfig.from_pretrained(model_args.model_name_or_path, revision=model_args.model_revision,
                                                    cache_dir=model_args.cache_dir).model_type
            overrides = dropout_overrides(model_args, model_type)  # DistilBERT's dropout, ModernBERT's mlp_dropout
            model = AutoModelForMaskedLM.from_pretrained(
                model_args.model_name_or_path, revision=model_args.model_revision, cache_dir=model_args.cache_dir,
                attn_implementation="eager", **overrides)
        except (OSError, ValueError) as err:
            raise CheckpointError(f"Cannot load {model_args.model_name_or_path} as a PyTorch masked LM: "
                                  f"{str(err).splitlines()[0]}") from None
        check_positions(model.config, max_seq_length)
        return _without_torch_compile(model)
    config = build_config(model_args, tokenizer, max_seq_length)
    if seed is not None:
        from transformers import set_seed

        set_seed(seed)
    config._attn_implementation = "eager"
    model = AutoModelForMaskedLM.from_config(config, attn_implementation="eager")
    model.to(torch.float32)
    return _without_torch_compile(model)


def _without_torch_compile(model):
    """Turn off ModernBERT's ``reference_compile`` (unset, its model ``torch.compile`` call on the embeddings and MLP
    on any device but CPU/MPS, and dynamo's fake tensors fail on XLA lazy tensors: ``Cannot call numel() on tensor
    with symbolic sizes``); XLA compiles the whole step anyway. Other configs have no such field."""
    if hasattr(model.config, "reference_compile"):
        model.config.reference_compile = False
    return model


def count_parameters(model) -> int:
    """Trainable parameters (tied weights counted once)."""
    return int(sum(p.numel() for p in {id(p): p for p in model.parameters() if p.requires_grad}.values()))


def model_summary_fields(model) -> Dict[str, Any]:
    """See :func:`hf_tpu_ext.model_config.model_summary_fields` (parameters counted on the torch model)."""
    return fields(model.config, count_parameters(model))


def cpu_state_dict(model) -> Dict[str, Any]:
    """The model's weights as CPU tensors, one entry per parameter object (tied weights once, first name).

    ``RobertaForMaskedLM`` ties ``lm_head.decoder.weight`` to the word embeddings and ``lm_head.decoder.bias``
    to ``lm_head.bias``; the file holds the embeddings and ``lm_head.bias``, as the TensorFlow backend's
    export does, and transformers re-ties them on load.
    """
    state = {}
    seen = set()
    for name, tensor in model.state_dict(keep_vars=True).items():
        if id(tensor) in seen:
            continue
        seen.add(id(tensor))
        state[name] = tensor.detach().to("cpu").contiguous()
    return state


def save_model_folder(model, output_dir: str, tokenizer=None) -> list:
    """Write ``config.json``, ``model.safetensors`` (PyTorch names, ``format: pt``) and the tokenizer files.

    The same files as :func:`hf_tpu_ext.backends.tensorflow.export.save_model_folder`, so the output folder
    and the Hub repo look the same for both backends. Safe to call with the model on an XLA device.

    Args:
        model: a transformers PyTorch model (any device).
        output_dir: folder to write into (created if missing).
        tokenizer: optional tokenizer, saved with ``save_pretrained``.

    Returns:
        The file names written (relative to ``output_dir``).
    """
    os.makedirs(output_dir, exist_ok=True)
    state = cpu_state_dict(model)
    model.save_pretrained(output_dir, state_dict=state, safe_serialization=True)
    written = ["config.json", "model.safetensors"]
    for stale in ("pytorch_model.bin", "tf_model.h5", "model.safetensors.index.json"):
        if os.path.isfile(os.path.join(output_dir, stale)):
            os.remove(os.path.join(output_dir, stale))
    if tokenizer is not None:
        written += save_tokenizer_files(tokenizer, output_dir, exclude=written)
    return written
