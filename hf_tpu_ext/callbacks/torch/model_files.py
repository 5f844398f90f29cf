"""The model folder of a ``transformers.Trainer`` run on any PyTorch device, beside the push callback.

What the ``Trainer`` adapter of the push session needs to know about PyTorch: which files of a Trainer
``checkpoint-N/`` are the model (:func:`copy_model_files`: everything but the training state, tied weights
written once), a model folder from a model in memory (:func:`save_model_folder`), the folder's loss curve
from the Trainer's log history (:func:`write_loss_curve`), and the Hub's ``last-checkpoint/`` back for
``trainer.train(resume_from_checkpoint=...)`` (:func:`checkpoint_from_hub`).
Nothing here imports torch_xla: ``.to("cpu")`` moves XLA/CUDA tensors to the host.
"""

from __future__ import annotations

import fnmatch
import logging
import os
import shutil
from typing import Optional, Set

from hf_tpu_ext.hub.card_facts import MASKED_LM_TRAINER_KEYS, eval_results_from_logs
from hf_tpu_ext.hub.preflight import resolve_token
from hf_tpu_ext.hub.resume import download_last_checkpoint
from hf_tpu_ext.outputs import plot_loss_curve

_logger = logging.getLogger("hf_tpu_ext.hub")

# files of a Trainer checkpoint that are training state, not part of the model folder
TRAINER_STATE_FILES = ("optimizer.pt", "scheduler.pt", "scaler.pt", "trainer_state.json", "training_args.bin",
                       "rng_state*.pth", "optimizer.bin", "pytorch_model_fsdp*", "global_step*")


def is_trainer_checkpoint(folder: str) -> bool:
    """True when ``folder`` is a ``Trainer`` checkpoint (it holds ``trainer_state.json``)."""
    return os.path.isfile(os.path.join(folder, "trainer_state.json"))


def checkpoint_from_hub(spec: str, local_dir: str, token: Optional[str] = None) -> str:
    """Download the ``last-checkpoint/`` a ``hub_strategy="checkpoint"`` run pushed; return the local folder.

    Example:
        >>> trainer.train(resume_from_checkpoint=checkpoint_from_hub("alice/m", "out/hub-last-checkpoint"))

    Args:
        spec: ``"user/name"`` or ``"user/name@revision"``.
        local_dir: where to download (``local_dir/last-checkpoint/``).
        token: Hub token (default: ``HF_TOKEN`` / cached login).

    Raises:
        HubRepoError: the repo or revision does not exist.
        CheckpointError: it has no ``last-checkpoint/`` holding a Trainer checkpoint.
        HubError: the Hub could not be reached.
    """
    return download_last_checkpoint(spec, resolve_token(token), local_dir, is_checkpoint=is_trainer_checkpoint,
                                    kind="Trainer checkpoint (trainer_state.json)")


def tied_weight_aliases(model) -> Set[str]:
    """State-dict names that alias an earlier entry (tied weights: the same parameter object).

    ``RobertaForMaskedLM`` ties ``lm_head.decoder.weight`` to the word embeddings and ``lm_head.decoder.bias``
    to ``lm_head.bias``. A host copy of device tensors (XLA, CUDA) loses that sharing, so ``save_pretrained``
    would write each alias as a second tensor; these names are left out instead (transformers re-ties them on
    load), giving the layout of both backends' exports.
    """
    seen, aliases = set(), set()
    for name, tensor in model.state_dict(keep_vars=True).items():
        if id(tensor) in seen:
            aliases.add(name)
        seen.add(id(tensor))
    return aliases


def save_model_folder(model, folder: str, tokenizer=None) -> None:
    """Default model-folder writer: ``save_pretrained`` of a CPU copy of the weights (any device), tokenizer.

    ``.to("cpu")`` moves XLA/CUDA tensors to the host without importing torch_xla; tied weights are written
    once (see :func:`tied_weight_aliases`).
    """
    aliases = tied_weight_aliases(model)
    state = {k: v.detach().to("cpu") for k, v in model.state_dict().items() if k not in aliases}
    model.save_pretrained(folder, state_dict=state, safe_serialization=True)
    if tokenizer is not None:
        tokenizer.save_pretrained(folder)


def copy_model_files(checkpoint: str, folder: str, tokenizer=None, tied_aliases: Set[str] = frozenset()) -> None:
    """Copy the model files of a Trainer checkpoint (not its training state) into ``folder``.

    Each file is written to a temporary name and renamed (a reader never sees half a file); a
    ``model.safetensors`` holding tied-weight aliases (the Trainer saves an XLA model through a host copy,
    which writes each tied weight twice) is written without them. The tokenizer is saved when the
    checkpoint has none.
    """
    os.makedirs(folder, exist_ok=True)
    for name in sorted(os.listdir(checkpoint)):
        src = os.path.join(checkpoint, name)
        if os.path.isfile(src) and not any(fnmatch.fnmatch(name, p) for p in TRAINER_STATE_FILES):
            tmp = os.path.join(folder, f".{name}.tmp")
            if name != "model.safetensors" or not _copy_weights_untied(src, tmp, tied_aliases):
                shutil.copy2(src, tmp)
            os.replace(tmp, os.path.join(folder, name))
    if tokenizer is not None and not os.path.isfile(os.path.join(checkpoint, "tokenizer_config.json")):
        tokenizer.save_pretrained(folder)


def _copy_weights_untied(src: str, dst: str, tied_aliases: Set[str]) -> bool:
    """Write ``src`` to ``dst`` without the tied-weight aliases; False (nothing written) when it holds none."""
    if not tied_aliases:
        return False
    from safetensors import safe_open
    from safetensors.torch import save_file

    with safe_open(src, framework="pt") as f:
        names = list(f.keys())
        if not tied_aliases.intersection(names):
            return False
        metadata = f.metadata() or {"format": "pt"}
        state = {k: f.get_tensor(k) for k in names if k not in tied_aliases}
    save_file(state, dst, metadata=metadata)
    return True


def write_loss_curve(log_history, folder: str) -> Optional[str]:
    """``folder/loss_curve.png`` from a ``Trainer``'s ``state.log_history`` with ``hf-tpu train``'s plot
    (:func:`hf_tpu_ext.outputs.plot_loss_curve`): training losses, and as eval points each evaluation's loss as the
    card reads it (:func:`~hf_tpu_ext.hub.card_facts.eval_results_from_logs`: the ``masked_lm_metrics`` callback's
    ``eval_masked_loss``, else ``eval_loss``). Returns the path, or None (no loss yet, or no matplotlib: the card
    goes without the curve)."""
    history = [e for e in log_history or () if isinstance(e, dict) and "step" in e]
    # one eval point per evaluation: the callback's where it ran (the Trainer's own eval_loss is another draw)
    masked = any(MASKED_LM_TRAINER_KEYS["eval_loss"] in e for e in history)
    entries = []
    for entry in history:
        if "loss" in entry:
            entries.append({"step": entry["step"], "loss": entry["loss"]})
        found = eval_results_from_logs({k: v for k, v in entry.items() if k != "loss"})
        if "eval_loss" in found and (not masked or MASKED_LM_TRAINER_KEYS["eval_loss"] in entry):
            entries.append({"step": entry["step"], "eval_loss": found["eval_loss"]})
    if not any("loss" in e for e in entries):
        return None
    try:
        return plot_loss_curve(entries, os.path.join(folder, "loss_curve.png"))
    except ImportError:
        _logger.info("No matplotlib: the card goes without loss_curve.png (pip install matplotlib).")
        return None
