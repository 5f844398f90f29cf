"""``hf-tpu train --backend torch_xla``: ``transformers.Trainer`` on the XLA device, same front door.

What this module adds to a stock ``Trainer`` (:class:`MaskedLMTrainer`):

* the loss of the TensorFlow backend: mean cross-entropy over the chosen positions, with the vocabulary
  projection at those ``P`` positions only (:func:`~hf_tpu_ext.backends.torch_xla.model.masked_lm_sums`);
* evaluation that keeps loss/correct/count sums on the device and reads them once per evaluation (no
  logits gathered to the host), logged as ``eval_loss``, ``perplexity``, ``eval_accuracy`` (run_mlm's names);
* XLA-safe settings: the non-fused ``adamw_torch`` (transformers 4.57's default ``adamw_torch_fused`` fails on
  XLA), ``dataloader_drop_last=True`` and fixed-shape batches, so the train step compiles once.

Checkpoints are the Trainer's ``checkpoint-<global_step>/`` folders in ``output_dir``; the rest of the
output folder is written through :mod:`hf_tpu_ext.outputs` and :mod:`hf_tpu_ext.hub.model_card` exactly as
the TensorFlow backend does. Several TPU devices in one host (a TPU VM with 4 chips) are used through
``torch_xla.launch`` -- one process per device, the Trainer's own multi-process path (not tested here: the
PJRT CPU runtime runs its devices as threads of one process, which this path does not support).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from typing import Any, Dict, List, Optional

from hf_tpu_ext.errors import CheckpointError, DataError

logger = logging.getLogger("hf_tpu_ext")



@dataclasses.dataclass
class RunContext:
    """What a torch callback's ``from_run(run)`` may read (the torch twin of the TF ``RunContext``)."""

    model_args: Any
    data_args: Any
    training_args: Any
    device_info: Any
    num_replicas: int
    global_batch_size: int
    seq_length: int
    steps_per_epoch: int
    total_steps: int
    eval_dataset: Any
    eval_collator: Any
    tokenizer: Any
    model_config: Any
    model: Any = None
    output_dir: str = ""
    max_predictions: int = 1

    @property
    def strategy_info(self):  # the ThroughputCallback of both backends looks for ``device_kind`` here
        return self.device_info


# fields of hf_tpu_ext.args.TrainingArguments that transformers.TrainingArguments has under the same name
_SAME_NAME_FIELDS = (
    "output_dir", "overwrite_output_dir", "per_device_train_batch_size", "per_device_eval_batch_size",
    "learning_rate", "weight_decay", "adam_beta1", "adam_beta2", "adam_epsilon", "num_train_epochs", "max_steps",
    "logging_steps", "logging_dir", "eval_strategy", "eval_steps", "save_strategy", "save_steps",
    "save_total_limit", "seed", "bf16", "disable_tqdm", "gradient_accumulation_steps", "lr_scheduler_type",
    "load_best_model_at_end", "greater_is_better", "do_train", "do_eval",
)
# our --optim names -> the torch optimizer the Trainer builds (the fused AdamW kernel fails on XLA devices)
_TORCH_OPTIM = {"adamw": "adamw_torch", "adafactor": "adafactor", "sgd": "sgd"}


def hf_training_arguments(args, total_steps: int, **overrides):
    """Our :class:`hf_tpu_ext.args.TrainingArguments` as ``transformers.TrainingArguments`` for XLA.

    Same field names where transformers has them; mapped here: every ``adamw*`` ``optim`` to the non-fused
    ``adamw_torch``, ``metric_for_best_model`` to the logged key (``perplexity`` ranks like ``eval_loss``),
    ``warmup_steps`` resolved like the TF backend, ``report_to`` as resolved by our arguments; fixed:
    ``dataloader_drop_last=True``, ``remove_unused_columns=False``, ``push_to_hub=False`` (our callback pushes).

    Args:
        args: :class:`hf_tpu_ext.args.TrainingArguments`.
        total_steps: optimizer steps of the run (for the warm-up ratio).
        **overrides: other ``transformers.TrainingArguments`` fields.

    Returns:
        ``transformers.TrainingArguments``.
    """
    from transformers import TrainingArguments as HFTrainingArguments

    from hf_tpu_ext.args import BEST_METRICS, OPTIMIZERS

    # our TrainingArguments reuse transformers' names, so these fields carry over as they are
    kwargs = {name: getattr(args, name) for name in _SAME_NAME_FIELDS}
    kwargs["bf16"] = args.bf16 is True  # --bf16 auto/unset: float32 on this backend (no device check here)
    kwargs.update(
        max_grad_norm=args.max_grad_norm if args.max_grad_norm and args.max_grad_norm > 0 else 0.0,
        warmup_steps=args.num_warmup_steps(total_steps),
        metric_for_best_model=BEST_METRICS[args.metric_for_best_model] if args.metric_for_best_model else None,
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
    kwargs.update(overrides)
    return HFTrainingArguments(**kwargs)


def _trainer_class():
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
            from hf_tpu_ext.backends.torch_xla.model import masked_lm_sums

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
            from hf_tpu_ext.backends.torch_xla.evaluation import evaluate_masked_lm

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


def resolve_resume(training_args, token) -> Optional[str]:
    """The checkpoint folder to resume from (``None``: start fresh).

    ``"true"``: the newest ``checkpoint-N/`` in ``output_dir``; a folder: that Trainer checkpoint; a Hub spec
    ``user/name[@revision]``: its ``last-checkpoint/`` (pushed with ``--hub_strategy checkpoint``).

    Raises:
        CheckpointError: nothing to resume from where ``resume_from_checkpoint`` points.
    """
    spec = training_args.resume_from_checkpoint
    if not spec:
        return None
    if training_args.resume_latest:
        from transformers.trainer_utils import get_last_checkpoint

        last = get_last_checkpoint(training_args.output_dir) if os.path.isdir(training_args.output_dir) else None
        if last is None:
            raise CheckpointError(
                f"--resume_from_checkpoint true: {training_args.output_dir!r} has no checkpoint-<step>/ folder. "
                "Train with --save_strategy steps/epoch first, or drop --resume_from_checkpoint."
            )
        return last
    if os.path.isdir(spec):
        if not os.path.isfile(os.path.join(spec, "trainer_state.json")):
            raise CheckpointError(f"{spec!r} is not a Trainer checkpoint folder (no trainer_state.json); "
                                  "give a checkpoint-<step>/ folder written by --backend torch_xla.")
        return spec
    from hf_tpu_ext.hub.resume import looks_like_repo_spec

    if looks_like_repo_spec(spec):
        return download_last_checkpoint(spec, token, os.path.join(training_args.output_dir, "hub-last-checkpoint"))
    raise CheckpointError(
        f"--resume_from_checkpoint {spec!r} is neither a local checkpoint folder, 'true', nor a Hub repo id "
        "'user/name[@revision]'."
    )


def download_last_checkpoint(spec: str, token, local_dir: str) -> str:
    """The Trainer-format ``last-checkpoint/`` of a Hub repo (see :func:`hf_tpu_ext.hub.resume.download_last_checkpoint`).

    Raises:
        HubRepoError / HubError: the repo cannot be read.
        CheckpointError: the repo has no Trainer ``last-checkpoint/`` (``trainer_state.json``, ``optimizer.pt``).
    """
    from hf_tpu_ext.hub import resume

    def is_trainer_checkpoint(folder):
        return all(os.path.isfile(os.path.join(folder, n)) for n in ("trainer_state.json", "optimizer.pt"))

    return resume.download_last_checkpoint(spec, token, local_dir, is_checkpoint=is_trainer_checkpoint,
                                           kind="PyTorch Trainer checkpoint (from --backend torch_xla)")

def _load_text_blocks(model_args, data_args, training_args, resuming):
    """Tokenizer, int32 blocks per split and the data description (shared data code, no TensorFlow)."""
    from hf_tpu_ext.data.loading import is_tfrecord_source
    from hf_tpu_ext.run import load_text_blocks

    if data_args.train_file and is_tfrecord_source(data_args.train_file):
        raise DataError(
            f"{data_args.train_file} holds TFRecord shards, which --backend torch_xla does not read; pass the text "
            "files (--train_file/--validation_file) or a --dataset_name, or use --backend tensorflow."
        )
    return load_text_blocks(model_args, data_args, training_args, resuming)


def _wants_spawn(training_args) -> int:
    """Processes to launch (0: run in this process): one per local TPU device when a TPU VM has several.

    Only TPUs: on PJRT CPU (``CPU_NUM_DEVICES``) torch_xla runs one thread per device inside one process,
    which the data and tokenizer code here are not made for. ``HF_TPU_XLA_NO_SPAWN=1`` turns it off.
    """
    if os.environ.get("HF_TPU_XLA_CHILD") or os.environ.get("HF_TPU_XLA_NO_SPAWN"):
        return 0
    if os.environ.get("PJRT_DEVICE", "") != "TPU":
        return 0
    try:
        from torch_xla._internal import tpu

        n = int(tpu.num_available_devices())
    except Exception:
        n = 1
    return n if n > 1 else 0


def _host_barrier(folder: str, name: str, rank: int, world_size: int, timeout: float = 3600.0) -> None:
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


def _spawned(index, model_args, data_args, training_args, callback_names):
    os.environ["HF_TPU_XLA_CHILD"] = "1"
    from hf_tpu_ext.run import setup_logging

    setup_logging()
    _train_here(model_args, data_args, training_args)


def train(model_args, data_args, training_args, callback_classes=None) -> Dict[str, Any]:
    """Run ``hf-tpu train`` on the torch_xla backend; the contract of :func:`hf_tpu_ext.run.train`.

    Args:
        model_args, data_args, training_args: the parsed :mod:`hf_tpu_ext.args` dataclasses.
        callback_classes: ignored when they are not ``TrainerCallback`` classes (the names in
            ``training_args.callbacks`` are resolved for the torch backend here).

    Returns:
        The final metrics (``train_loss``, ``train_runtime``, ``train_tokens_per_second``, ``global_step``,
        ``epoch``, ``eval_loss``, ``perplexity``, ``eval_accuracy``, ``xla_compilations``, ...), also in
        ``all_results.json``.

    Raises:
        BackendError: torch_xla/accelerate missing (with the install command).
        HfTpuExtError subclasses: bad data, tokenizer, checkpoint or Hub access, before the first step.
    """
    from hf_tpu_ext.backends.torch_xla.device import default_pjrt_device, require_torch_xla

    os.environ.setdefault("PJRT_DEVICE", default_pjrt_device())
    require_torch_xla()
    nprocs = _wants_spawn(training_args)
    if nprocs:
        import json

        import torch_xla

        logger.info("launching %d processes, one per XLA device (torch_xla.launch)", nprocs)
        torch_xla.launch(_spawned, args=(model_args, data_args, training_args, training_args.callback_names))
        with open(os.path.join(training_args.output_dir, "all_results.json"), encoding="utf-8") as f:
            return json.load(f)
    return _train_here(model_args, data_args, training_args)


def _train_here(model_args, data_args, training_args) -> Dict[str, Any]:
    from hf_tpu_ext.backends.torch_xla.data import BlocksDataset, StaticMaskingCollator, masking_epoch_callback
    from hf_tpu_ext.backends.torch_xla.device import compile_counts, xla_device_info
    from hf_tpu_ext.backends.torch_xla.model import build_model
    from hf_tpu_ext.callbacks import build_callbacks
    from hf_tpu_ext.data.blocks import check_blocks

    args = training_args
    t_total = time.perf_counter()
    info = xla_device_info()
    replicas = max(1, info.world_size)
    # sequences per optimizer step (the Trainer's total_train_batch_size)
    global_batch = args.per_device_train_batch_size * replicas * args.gradient_accumulation_steps
    global_eval_batch = args.per_device_eval_batch_size * replicas
    logger.info("torch_xla: %d process(es), %d %s device(s) (%s); global batch %d", info.world_size,
                info.num_devices, info.accelerator, info.device_kind, global_batch)

    push_callback, token = None, None
    if args.push_to_hub or (args.resume_from_checkpoint and "/" in str(args.resume_from_checkpoint)):
        from hf_tpu_ext.hub.preflight import resolve_token

        token = resolve_token(args.hub_token)
    if args.push_to_hub:
        from hf_tpu_ext.callbacks.torch.push_to_hub import PushToHubCallback

        push_callback = PushToHubCallback(
            output_dir=args.output_dir, hub_model_id=args.hub_model_id or os.path.basename(os.path.abspath(args.output_dir)),
            hub_token=token, hub_strategy=args.hub_strategy, hub_private_repo=args.hub_private_repo,
            hub_revision=args.hub_revision, push_final_on_train_end=False, license=args.license,
            language=args.language, dataset_name=data_args.dataset_name)
        if info.is_chief:
            push_callback.preflight()  # Hub access is checked before any data or compute work

    resume_path = resolve_resume(args, token)
    tok, blocks, description = _load_text_blocks(model_args, data_args, args, resume_path is not None)
    L = data_args.max_seq_length
    check_blocks(blocks, global_batch, "train")
    has_eval = args.do_eval and blocks.get("validation") is not None and len(blocks["validation"]) > 0
    if has_eval:
        check_blocks(blocks, global_eval_batch, "validation")
    steps_per_epoch = len(blocks["train"]) // global_batch
    total = args.total_steps(steps_per_epoch)

    start_step = 0
    if resume_path:
        import json

        with open(os.path.join(resume_path, "trainer_state.json"), encoding="utf-8") as f:
            start_step = int(json.load(f).get("global_step", 0))
        logger.info("resuming from %s at global step %d", resume_path, start_step)
        if start_step >= total:  # a finished run: leave its results, card and tokenizer exactly as they are
            logger.warning("The checkpoint is at global step %d, the run asks for %d steps: nothing to train. Raise "
                           "--max_steps or --num_train_epochs to train further.", start_step, total)
            from hf_tpu_ext.outputs import read_all_results

            return dict(read_all_results(args.output_dir) or {}, global_step=start_step)


    model = build_model(model_args, tok, L, seed=args.seed)
    P = int(data_args.max_predictions_per_seq)
    train_collator = StaticMaskingCollator.from_tokenizer(tok, P, seed=args.seed, train=True)
    eval_collator = StaticMaskingCollator.from_tokenizer(tok, P, seed=args.seed, train=False)
    train_ds = BlocksDataset(blocks["train"])
    eval_ds = BlocksDataset(blocks["validation"]) if has_eval else None

    hf_args = hf_training_arguments(args, total, eval_strategy=args.eval_strategy if has_eval else "no",
                                    eval_on_start=bool(getattr(args, "eval_on_start", False)) and has_eval)
    if info.is_chief:
        os.makedirs(args.output_dir, exist_ok=True)
        tok.save_pretrained(args.output_dir)

    run = RunContext(model_args, data_args, args, info, replicas, global_batch, L, steps_per_epoch, total, eval_ds,
                     eval_collator, tok, model.config, model, args.output_dir, P)
    callbacks = build_callbacks([c for c in args.callback_names if c != "push_to_hub"], run, backend="torch")
    callbacks.append(masking_epoch_callback(train_collator))
    holder: Dict[str, Any] = {}

    def summary_fn():
        return _summary(model_args, data_args, args, info, trainer, holder, description, tok, global_batch,
                        steps_per_epoch, total)

    if push_callback is not None:
        push_callback.tokenizer = tok
        push_callback.summary_fn = summary_fn
        callbacks.append(push_callback)

    _host_barrier(args.output_dir, f"ready-{os.getppid()}", info.process_index, info.world_size)
    Trainer = _trainer_class()
    trainer = Trainer(model=model, args=hf_args, train_dataset=train_ds, eval_dataset=eval_ds,
                      data_collator=train_collator, eval_collator=eval_collator, callbacks=callbacks,
                      max_predictions=P)
    from transformers.trainer_callback import PrinterCallback, ProgressCallback

    if args.disable_tqdm:  # the Trainer's PrinterCallback prints every log dict; our logger does that
        trainer.remove_callback(PrinterCallback)
        trainer.remove_callback(ProgressCallback)

    output = trainer.train(resume_from_checkpoint=resume_path)
    step = int(trainer.state.global_step)
    runtime = float(output.metrics.get("train_runtime") or 0.0)
    tokens_per_step = global_batch * L
    steps_run = max(step - start_step, 0)
    train_metrics = {
        "train_loss": float(output.training_loss),
        "train_runtime": runtime,
        "train_steps_per_second": steps_run / max(runtime, 1e-9),
        "train_samples_per_second": steps_run * global_batch / max(runtime, 1e-9),
        "train_tokens_per_second": steps_run * tokens_per_step / max(runtime, 1e-9),
        "global_step": step,
        "epoch": step / steps_per_epoch,
        "tokens_seen": step * tokens_per_step,
    }
    holder.update(train_metrics)
    eval_metrics: Dict[str, float] = {}
    if has_eval:
        last = trainer.state.log_history[-2:] if trainer.state.log_history else []
        done = [e for e in last if e.get("step") == step and "eval_loss" in e]
        eval_metrics = {k: v for k, v in (done[-1] if done else trainer.evaluate()).items()
                        if k in ("eval_loss", "perplexity", "eval_accuracy")}
    counts = compile_counts()
    results = {**train_metrics, **eval_metrics, "xla_compilations": counts["uncached_compile"],
               "xla_compile_time_count": counts["compile_time_count"]}
    for cb in trainer.callback_handler.callbacks:
        if hasattr(cb, "compilations_after_warmup"):
            results["xla_compilations_after_warmup"] = cb.compilations_after_warmup
    if info.is_chief:
        _write_outputs(model_args, data_args, args, trainer, tok, results, summary_fn(), global_batch,
                       steps_per_epoch, total)
    if push_callback is not None:
        push_callback.finish(trainer.model, step)
    if info.is_chief and args.hub_space_id and push_callback is not None:
        from hf_tpu_ext.hub.space import deploy_space

        url = deploy_space(push_callback.repo_id, args.hub_space_id, token=token, private=args.hub_private_repo)
        logger.info("deployed the fill-mask demo to %s", url)
    logger.info("done in %.1fs: %s", time.perf_counter() - t_total,
                ", ".join(f"{k}={v:.4g}" for k, v in results.items() if isinstance(v, float)))
    return results


def _log_history(trainer) -> List[Dict[str, Any]]:
    """The Trainer's log history without its end-of-training summary entry (as in the TF backend)."""
    return [dict(e) for e in trainer.state.log_history if "train_runtime" not in e]


def _summary(model_args, data_args, args, info, trainer, train_metrics, description, tok, global_batch,
             steps_per_epoch, total) -> Dict[str, Any]:
    """The ``training_summary.json`` content: the TF backend's keys, with ``backend: torch_xla``."""
    from hf_tpu_ext.args import OPTIMIZERS
    from hf_tpu_ext.backends.torch_xla.model import model_summary_fields
    from hf_tpu_ext.outputs import build_training_summary

    device = {
        "accelerator": info.accelerator,
        "device_kind": info.device_kind,
        "num_devices": info.num_devices,
        "strategy": "transformers.Trainer (torch_xla, %d process%s)" % (info.world_size, "" if info.world_size == 1 else "es"),
        "num_replicas": max(1, info.world_size),
        "num_workers": 1,
    }
    return build_training_summary(
        model_args, data_args, args, backend="torch_xla", device=device, global_batch_size=global_batch,
        global_step=int(trainer.state.global_step), steps_per_epoch=steps_per_epoch, total_steps=total,
        train_metrics=train_metrics, log_history=trainer.state.log_history,
        model_fields=model_summary_fields(trainer.model),
        optimizer=(f"AdamW, torch non-fused (beta1={args.adam_beta1}, beta2={args.adam_beta2}, epsilon={args.adam_epsilon})"
                   if _TORCH_OPTIM[OPTIMIZERS[args.optim]] == "adamw_torch" else _TORCH_OPTIM[OPTIMIZERS[args.optim]])
        + f", {args.lr_scheduler_type} learning-rate schedule",
        dataset_description=description, mask_token=tok.mask_token,
        jit_compile=True,  # every torch_xla step is an XLA graph
        steps_per_execution=1)


def _write_outputs(model_args, data_args, args, trainer, tok, results, summary, global_batch, steps_per_epoch, total):
    from hf_tpu_ext.backends.torch_xla.model import save_model_folder
    from hf_tpu_ext.hub.model_card import save_model_card
    from hf_tpu_ext.outputs import (TrainerState, plot_loss_curve, write_all_results, write_training_args,
                                    write_training_summary)

    out = args.output_dir
    save_model_folder(trainer.model, out, tokenizer=tok)
    write_training_args(out, model_args, data_args, args)
    history = _log_history(trainer)
    best = trainer.state.best_metric
    if best is None:  # no metric_for_best_model: the lowest eval_loss, as the TF backend records
        best = min((e["eval_loss"] for e in history if isinstance(e.get("eval_loss"), (int, float))), default=None)
    state = TrainerState(
        global_step=results["global_step"], epoch=results["epoch"], max_steps=total,
        num_train_epochs=int(-(-total // steps_per_epoch)), logging_steps=args.logging_steps,
        eval_steps=args.eval_steps, save_steps=args.save_steps, train_batch_size=global_batch,
        num_input_tokens_seen=results["tokens_seen"], log_history=history, best_metric=best,
    )
    state.save(os.path.join(out, "trainer_state.json"))
    write_all_results(out, {k: v for k, v in results.items() if isinstance(v, (int, float)) and v is not None})
    write_training_summary(out, summary)
    plot_loss_curve(history, os.path.join(out, "loss_curve.png"))
    save_model_card(out, repo_id=args.hub_model_id, summary=summary, license=args.license, language=args.language)
