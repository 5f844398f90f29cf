"""``hf-tpu train --backend torch_xla``: ``transformers.Trainer`` on the XLA device, same front door.

What this module adds to a stock ``Trainer`` (:class:`MaskedLMTrainer`):

* the loss of the TensorFlow backend: mean cross-entropy over the chosen positions, with the vocabulary
  projection at those ``P`` positions only (:func:`~hf_tpu_ext.backends.torch_xla.model.masked_lm_sums`);
* evaluation that keeps loss/correct/count sums on the device and reads them once per evaluation (no
  logits gathered to the host), logged as ``eval_loss``, ``perplexity``, ``eval_accuracy`` (run_mlm's names);
* XLA-safe settings: the non-fused ``adamw_torch`` (transformers 4.57's default ``adamw_torch_fused`` fails on
  XLA), ``dataloader_drop_last=True`` and fixed-shape batches, so the train step compiles once.

Checkpoints are the Trainer's ``checkpoint-<global_step>/`` folders in ``output_dir``; the rest of the
output folder is written by the training run (:mod:`hf_tpu_ext.run`) exactly as for the TensorFlow
backend; :mod:`hf_tpu_ext.backends.torch_xla.backend` puts this Trainer behind the backend protocol. Several TPU devices in one host (a TPU VM with 4 chips) are used through
``torch_xla.launch`` -- one process per device, the Trainer's own multi-process path (not tested here: the
PJRT CPU runtime runs its devices as threads of one process, which this path does not support).
"""

from __future__ import annotations

import logging
import os
import time
from typing import Dict

from hf_tpu_ext import interrupts
from hf_tpu_ext.args import OPTIMIZERS
from hf_tpu_ext.backends.torch_xla.device import default_pjrt_device, tpu_runtime
from hf_tpu_ext.backends.torch_xla.model import masked_lm_sums
from hf_tpu_ext.best_metric import BestMetric
from hf_tpu_ext.hub import resume
from hf_tpu_ext.metrics.masked_lm_torch import evaluate_masked_lm
from hf_tpu_ext.run_lock import spawned_child

logger = logging.getLogger("hf_tpu_ext")



# fields of hf_tpu_ext.args.TrainingArguments that transformers.TrainingArguments has under the same name
_SAME_NAME_FIELDS = (
    "output_dir", "overwrite_output_dir", "per_device_train_batch_size", "per_device_eval_batch_size",
    "learning_rate", "weight_decay", "adam_beta1", "adam_beta2", "adam_epsilon", "num_train_epochs", "max_steps",
    "logging_steps", "logging_dir", "eval_strategy", "eval_steps", "save_strategy", "save_steps",
    "save_total_limit", "seed", "bf16", "disable_tqdm", "gradient_accumulation_steps", "lr_scheduler_type",
    "load_best_model_at_end", "greater_is_better", "do_train", "do_eval", "gradient_checkpointing",
)
# our --optim names -> the torch optimizer the Trainer builds (the fused AdamW kernel fails on XLA devices)
_TORCH_OPTIM = {"adamw": "adamw_torch", "adafactor": "adafactor", "sgd": "sgd"}


def hf_training_arguments(args, total_steps: int, **overrides):
    """Our :class:`hf_tpu_ext.args.TrainingArguments` as ``transformers.TrainingArguments`` for XLA.

    Same field names where transformers has them; mapped here: every ``adamw*`` ``optim`` to the non-fused
    ``adamw_torch``, ``metric_for_best_model`` to the logged key (``perplexity`` ranks like ``eval_loss``),
    ``warmup_steps`` resolved like the TF backend, ``report_to`` as resolved by our arguments; fixed:
    ``dataloader_drop_last=True``, ``remove_unused_columns=False``, ``push_to_hub=False`` (our callback pushes);
    ``--fsdp`` as given, with ``--fsdp_config`` plus ``xla`` and ``xla_fsdp_v2`` true (FSDPv2: every weight,
    gradient and optimizer state sharded over the XLA devices by SPMD; the FLOPs per token, hence MFU, unchanged).

    Args:
        args: :class:`hf_tpu_ext.args.TrainingArguments`.
        total_steps: optimizer steps of the run (for the warm-up ratio).
        **overrides: other ``transformers.TrainingArguments`` fields.

    Returns:
        ``transformers.TrainingArguments``.
    """
    from transformers import TrainingArguments as HFTrainingArguments

    # our TrainingArguments reuse transformers' names, so these fields carry over as they are
    kwargs = {name: getattr(args, name) for name in _SAME_NAME_FIELDS}
    # the backend's precision plan (hf_tpu_ext.precision, decided once in its setup) passes bf16; without it
    # (a caller without the backend) only an explicit --bf16 true is bf16
    kwargs["bf16"] = args.bf16 is True
    kwargs.update(
        max_grad_norm=args.max_grad_norm if args.max_grad_norm and args.max_grad_norm > 0 else 0.0,
        warmup_steps=args.num_warmup_steps(total_steps),
        # the key and direction every backend compares (hf_tpu_ext.best_metric)
        metric_for_best_model=BestMetric.from_args(args).key if args.metric_for_best_model else None,
        save_safetensors=True,
        data_seed=args.seed,
        optim=_TORCH_OPTIM[OPTIMIZERS[args.optim]],
        dataloader_drop_last=True,
        dataloader_num_workers=0,
        dataloader_pin_memory=False,
        remove_unused_columns=False,
        report_to=list(args.report_to) or "none",
        push_to_hub=False,
        save_only_model=False,
    )
    if getattr(args, "fsdp", None):  # --fsdp: transformers' FSDPv2 on XLA (SPMD), its own names
        kwargs.update(fsdp=args.fsdp, fsdp_config={**(args.fsdp_config or {}), "xla": True, "xla_fsdp_v2": True})
    kwargs.update(overrides)
    return HFTrainingArguments(**kwargs)


def optimizer_description(args) -> str:
    """The optimizer as the model card names it (``--optim`` mapped as in :func:`hf_training_arguments`)."""
    name = _TORCH_OPTIM[OPTIMIZERS[args.optim]]
    text = (f"AdamW, torch non-fused (beta1={args.adam_beta1}, beta2={args.adam_beta2}, epsilon={args.adam_epsilon})"
            if name == "adamw_torch" else name)
    return text + f", {args.lr_scheduler_type} learning-rate schedule"


def trainer_class():
    """:class:`MaskedLMTrainer`, defined on first use so importing this module does not import torch."""
    global MaskedLMTrainer
    if "MaskedLMTrainer" in globals():
        return MaskedLMTrainer
    import torch
    from transformers import Trainer

    class _MaskedLMTrainer(Trainer):
        """A ``Trainer`` whose loss and evaluation cover the masked positions only (see the module doc).

        Args:
            max_predictions: ``P``, masked positions per sequence.
            eval_collator: the collator of evaluation batches (fixed masks); default: ``data_collator``.
            **kwargs: ``transformers.Trainer`` arguments.
        """

        def __init__(self, *a, max_predictions: int, eval_collator=None, **kw):
            super().__init__(*a, **kw)
            self.max_predictions = int(max_predictions)
            self.eval_collator = eval_collator

        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            loss_sum, _, count = masked_lm_sums(model, inputs["input_ids"], inputs["labels"], self.max_predictions,
                                                attention_mask=inputs.get("attention_mask"))
            loss = loss_sum / torch.clamp(count, min=1.0)
            return (loss, {"loss": loss}) if return_outputs else loss

        def get_eval_dataloader(self, eval_dataset=None):
            if self.eval_collator is None:
                return super().get_eval_dataloader(eval_dataset)
            saved = self.data_collator
            self.data_collator = self.eval_collator
            try:
                return super().get_eval_dataloader(eval_dataset)
            finally:
                self.data_collator = saved

        def evaluate(self, eval_dataset=None, ignore_keys=None, metric_key_prefix: str = "eval") -> Dict[str, float]:
            """Masked-LM loss, perplexity and accuracy over the whole eval set; logged and passed to callbacks."""
            start = time.perf_counter()
            dataloader = self.get_eval_dataloader(eval_dataset)
            raw = evaluate_masked_lm(self.model, dataloader, self.max_predictions)
            p = metric_key_prefix
            metrics = {f"{p}_loss": raw["eval_loss"], "perplexity" if p == "eval" else f"{p}_perplexity": raw["perplexity"],
                       f"{p}_accuracy": raw["eval_accuracy"], f"{p}_runtime": round(time.perf_counter() - start, 4)}
            self.log(metrics)
            self.control = self.callback_handler.on_evaluate(self.args, self.state, self.control, metrics)
            return metrics

    MaskedLMTrainer = _MaskedLMTrainer
    return MaskedLMTrainer


def download_last_checkpoint(spec: str, token, local_dir: str) -> str:
    """The Trainer-format ``last-checkpoint/`` of a Hub repo (see :func:`hf_tpu_ext.hub.resume.download_last_checkpoint`).

    Raises:
        HubRepoError / HubError: the repo cannot be read.
        CheckpointError: the repo has no Trainer ``last-checkpoint/`` (``trainer_state.json``, ``optimizer.pt``).
    """
    def is_trainer_checkpoint(folder):
        return all(os.path.isfile(os.path.join(folder, n)) for n in ("trainer_state.json", "optimizer.pt"))

    return resume.download_last_checkpoint(spec, token, local_dir, is_checkpoint=is_trainer_checkpoint,
                                           kind="PyTorch Trainer checkpoint (from --backend torch_xla)")

def wants_spawn(training_args) -> int:
    """Processes to launch (0: run in this process): one per local TPU device when a TPU VM has several.

    Only TPUs: on PJRT CPU (``CPU_NUM_DEVICES``) torch_xla runs one thread per device inside one process,
    which the data and tokenizer code here are not made for. ``HF_TPU_XLA_NO_SPAWN=1`` turns it off.
    """
    if spawned_child() or os.environ.get("HF_TPU_XLA_NO_SPAWN"):
        return 0
    if default_pjrt_device() != "TPU":
        return 0
    try:
        n = int(tpu_runtime().num_available_devices())
    except Exception:
        n = 1
    return n if n > 1 else 0


def host_barrier(folder: str, name: str, rank: int, world_size: int, timeout: float = 3600.0) -> None:
    """Wait until every process of this host reached ``name`` (marker files, no collective).

    XLA's collectives give up after seconds on some runtimes (10 s on XLA:CPU); processes that tokenize
    or load data at different speeds meet here first, so their first collective starts together.
    """
    if world_size <= 1:
        return
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, f".{name}-{rank}"), "w"):
        pass
    deadline = time.monotonic() + timeout
    while not all(os.path.exists(os.path.join(folder, f".{name}-{r}")) for r in range(world_size)):
        if time.monotonic() > deadline:
            raise TimeoutError(f"process {rank}: the other processes did not reach {name!r} within {timeout:.0f} s.")
        time.sleep(0.05)


def save_on_signal_callback():
    """A ``TrainerCallback`` that makes a first SIGINT/SIGTERM a save (see ``checks_interrupts`` in
    :mod:`hf_tpu_ext.backends.base`): at the end of the step in progress it sets ``control.should_save`` and
    ``control.should_training_stop``, so the Trainer writes ``checkpoint-<step>/`` (its ``on_save`` callbacks --
    the run's trainer state and push -- included) and leaves its loop; the caller then raises
    ``KeyboardInterrupt`` with :func:`hf_tpu_ext.interrupts.check`. The signal itself is only recorded by the
    run's handler (:func:`hf_tpu_ext.interrupts.deferring`), never raised inside a step.

    Returns:
        A ``transformers.TrainerCallback`` instance (any PyTorch device; nothing here needs XLA).
    """
    from transformers import TrainerCallback

    class SaveOnSignalCallback(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if interrupts.received() is not None:
                control.should_save = True
                control.should_training_stop = True
            return control

    return SaveOnSignalCallback()
