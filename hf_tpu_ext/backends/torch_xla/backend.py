"""The torch_xla backend behind :class:`hf_tpu_ext.backends.base.Backend`: ``transformers.Trainer`` on XLA.

Checkpoints are the Trainer's ``checkpoint-<step>/`` folders in ``output_dir``. The backend writes no run
file and talks to no Hub; the training run does both (see :mod:`hf_tpu_ext.run`).
"""

from __future__ import annotations

import json
import logging
import os
import re
import zipfile
from typing import Any, Dict, List, Optional

from hf_tpu_ext import interrupts
from hf_tpu_ext.backends.base import BackendDefaults, CheckpointInfo, RunPlan, SaveHook
from hf_tpu_ext.backends.torch_xla.data import BlocksDataset, StaticMaskingCollator, masking_epoch_callback
from hf_tpu_ext.backends.torch_xla.device import default_pjrt_device, require_torch_xla, xla_device_info
from hf_tpu_ext.backends.torch_xla.model import build_model, model_summary_fields, save_model_folder
from hf_tpu_ext.backends.torch_xla.trainer import (hf_training_arguments, host_barrier, optimizer_description,
                                                   save_on_signal_callback, trainer_class, wants_spawn)
from hf_tpu_ext.errors import CheckpointError
from hf_tpu_ext.metrics.xla_compiles import compile_counts
from hf_tpu_ext.precision import has_native_bf16, resolve_precision
from hf_tpu_ext.run_context import RunContext

logger = logging.getLogger("hf_tpu_ext")

_CKPT_RE = re.compile(r"^checkpoint-(\d+)$")
#: the run's trainer state saved in each ``checkpoint-<step>/`` (the Trainer's own ``trainer_state.json`` stays)
STATE_NAME = "run_trainer_state.json"
MODEL_CONFIG_FIELDS = ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "vocab_size",
                       "max_position_embeddings")


def _log_history(trainer) -> List[Dict[str, Any]]:
    """The Trainer's log history without its end-of-training summary entry (as in the TF backend)."""
    return [dict(e) for e in trainer.state.log_history if "train_runtime" not in e]


def _precision_plan(bf16, accelerator: str):
    """:func:`hf_tpu_ext.precision.resolve_precision` for a torch_xla step: always one XLA graph, without the Keras
    backend's bf16 x bf16 -> float32 dots, so ``--bf16 auto`` keeps float32 on a CPU (XLA:CPU multiplies bf16 dots
    in float32) and takes bf16 on a TPU and on a GPU with compute capability >= 8.0.

    Args:
        bf16: ``--bf16`` (``None``, ``True``, ``False`` or ``"auto"``).
        accelerator: ``"TPU"``, ``"GPU"`` or ``"CPU"`` (:class:`~hf_tpu_ext.backends.torch_xla.device.XLADeviceInfo`).

    Returns:
        :class:`hf_tpu_ext.precision.PrecisionPlan` (``jit_compile`` True).
    """
    return resolve_precision(bf16, True, accelerator, has_native_bf16(accelerator, _cuda_has_native_bf16))


def _cuda_has_native_bf16() -> bool:
    """Whether torch sees a CUDA GPU with bf16 tensor cores (compute capability >= 8.0); False when it cannot say."""
    try:
        import torch

        return torch.cuda.is_available() and tuple(torch.cuda.get_device_capability(0)) >= (8, 0)
    except Exception:  # a torch build without CUDA, or a driver torch cannot query
        return False


class TorchXLABackend(BackendDefaults):
    """``--backend torch_xla``: our :class:`~hf_tpu_ext.backends.torch_xla.trainer.MaskedLMTrainer` on XLA."""

    name = "torch_xla"
    callback_kind = "torch"
    supports_tfrecord = False
    needs_remote_data = False
    #: a first SIGINT/SIGTERM: the Trainer saves the step reached and stops (trainer.save_on_signal_callback)
    checks_interrupts = True

    def __init__(self):
        self.info = None
        self.num_replicas = 1
        self.is_chief = True
        self.trainer = None
        self.model = None

    def setup(self, training_args) -> None:
        os.environ.setdefault("PJRT_DEVICE", default_pjrt_device())
        require_torch_xla()
        self.processes_to_spawn = wants_spawn(training_args)
        if self.processes_to_spawn:
            return
        self.info = xla_device_info()
        self.num_replicas = max(1, self.info.world_size)
        self.is_chief = self.info.is_chief
        logger.info("torch_xla: %d process(es), %d %s device(s) (%s)", self.info.world_size, self.info.num_devices,
                    self.info.accelerator, self.info.device_kind)
        self.precision = _precision_plan(training_args.bf16, self.info.accelerator)
        if self.is_chief:
            logger.info("precision %s, compiler path: XLA (torch_xla lazy tensors). Why: %s.",
                        self.precision.precision, self.precision.reason)

    def spawn(self, fn, args) -> None:
        """Run ``fn(index, *args)`` in one process per local XLA device (``torch_xla.launch``) and wait."""
        import torch_xla

        logger.info("launching %d processes, one per XLA device (torch_xla.launch)", self.processes_to_spawn)
        torch_xla.launch(fn, args=args)

    def device_summary(self) -> Dict[str, Any]:
        info = self.info
        return {"accelerator": info.accelerator, "device_kind": info.device_kind, "num_devices": info.num_devices,
                "strategy": "transformers.Trainer (torch_xla, %d process%s)" % (
                    info.world_size, "" if info.world_size == 1 else "es"),
                "num_replicas": max(1, info.world_size), "num_workers": 1}

    # ------------------------------------------------------------------ checkpoints
    def find_checkpoints(self, folder: str) -> List[str]:
        if not os.path.isdir(folder):
            return []
        if _CKPT_RE.match(os.path.basename(os.path.normpath(folder))) or os.path.isfile(
                os.path.join(folder, "trainer_state.json")) and os.path.isfile(os.path.join(folder, "optimizer.pt")):
            return [folder]
        found = []
        for sub in (folder, os.path.join(folder, "last-checkpoint")):
            if os.path.isdir(sub):
                steps = sorted((int(m.group(1)) for m in (_CKPT_RE.match(n) for n in os.listdir(sub)) if m),
                               reverse=True)
                found += [os.path.join(sub, f"checkpoint-{s}") for s in steps]
        if not found and self.is_checkpoint_folder(os.path.join(folder, "last-checkpoint")):
            found = [os.path.join(folder, "last-checkpoint")]
        return found

    def is_checkpoint_folder(self, folder: str) -> bool:
        return all(os.path.isfile(os.path.join(folder, n)) for n in ("trainer_state.json", "optimizer.pt"))

    def checkpoint_state_file(self, path: str) -> str:
        return os.path.join(path, STATE_NAME)

    def remove_incomplete_checkpoints(self, output_dir: str) -> List[str]:
        """Delete ``checkpoint-N/`` folders without the Trainer's ``trainer_state.json`` (it is written after the
        weights and optimizer: a save stopped before it) and ``tmp-checkpoint-N/`` folders. A checkpoint with it
        but without the run's ``run_trainer_state.json`` stays: the Trainer's log history in it is whole."""
        import shutil

        removed = []
        if not os.path.isdir(output_dir):
            return removed
        for name in sorted(os.listdir(output_dir)):
            path = os.path.join(output_dir, name)
            if not os.path.isdir(path):
                continue
            if name.startswith("tmp-checkpoint-") or (
                    _CKPT_RE.match(name) and not os.path.isfile(os.path.join(path, "trainer_state.json"))):
                shutil.rmtree(path, ignore_errors=True)
                removed.append(name)
        return removed

    def checkpoint_info(self, path: str) -> CheckpointInfo:
        """Check that the weights read back and the optimizer file is whole; read step, config and state.

        Raises:
            CheckpointError: a file is missing, truncated or not JSON (the message names it).
        """
        def fail(name, why):
            raise CheckpointError(f"Checkpoint {path} cannot be read: {name} {why}.") from None

        def read_json(name):
            try:
                with open(os.path.join(path, name), encoding="utf-8") as f:
                    return json.load(f)
            except FileNotFoundError:
                fail(name, "is missing")
            except ValueError as err:
                fail(name, f"is not valid JSON ({err})")

        hf_state = read_json("trainer_state.json")
        config = read_json("config.json")
        weights = os.path.join(path, "model.safetensors")
        try:
            from safetensors import safe_open

            with safe_open(weights, framework="np") as f:
                for key in f.keys():
                    f.get_tensor(key)
        except Exception as err:
            fail("model.safetensors", f"is unreadable ({type(err).__name__}: {err})")
        if not zipfile.is_zipfile(os.path.join(path, "optimizer.pt")):
            fail("optimizer.pt", "is missing or truncated")
        state = None
        if os.path.isfile(self.checkpoint_state_file(path)):
            state = read_json(STATE_NAME)
        return CheckpointInfo(path=path, global_step=int(hf_state.get("global_step", 0)),
                              model_config={k: config.get(k) for k in MODEL_CONFIG_FIELDS},
                              trainer_state=state or {"global_step": hf_state.get("global_step", 0),
                                                      "log_history": hf_state.get("log_history", [])})

    def checkpoint_files(self, path: str, with_state: bool = False) -> Dict[str, str]:
        """Every file of the Trainer's ``checkpoint-<step>/`` folder (it restores on its own), ``{relative name:
        path}``; ``with_state``: the run's ``run_trainer_state.json`` listed even before the run writes it (a save's
        hand-over).

        Raises:
            CheckpointError: ``path`` is not a folder.
        """
        if not os.path.isdir(path):
            raise CheckpointError(f"Cannot push checkpoint {path}: it is not a folder.")
        files = {}
        for root, dirs, names in os.walk(path):
            dirs.sort()
            for name in sorted(names):
                full = os.path.join(root, name)
                files[os.path.relpath(full, path).replace(os.sep, "/")] = full
        if with_state:
            files.setdefault(STATE_NAME, self.checkpoint_state_file(path))
        return files

    def _saved_files(self, path: str) -> Optional[Dict[str, str]]:
        """What a save hands to ``on_save``: on the chief, the files a push of ``path`` takes (its trainer state
        listed before the run writes it); ``None`` elsewhere (the run pushes on the chief only)."""
        return self.checkpoint_files(path, with_state=True) if self.is_chief else None

    # ------------------------------------------------------------------ model and training
    def build(self, model_args, data_args, training_args, tokenizer, blocks, plan: RunPlan) -> None:
        args = training_args
        self.args, self.plan, self.tokenizer = args, plan, tokenizer
        self.model = build_model(model_args, tokenizer, plan.seq_length, seed=args.seed)
        P = int(data_args.max_predictions_per_seq)
        self.P = P
        self.train_collator = StaticMaskingCollator.from_tokenizer(tokenizer, P, seed=args.seed, train=True)
        self.eval_collator = StaticMaskingCollator.from_tokenizer(tokenizer, P, seed=args.seed, train=False)
        self.train_ds = BlocksDataset(blocks["train"])
        self.eval_ds = BlocksDataset(blocks["validation"]) if plan.has_eval else None
        self.context = RunContext(model_args=model_args, data_args=data_args, training_args=args,
                                  precision=self.precision,
                                  strategy_info=self.info, num_replicas=self.num_replicas,
                                  global_batch_size=plan.global_batch_size, seq_length=plan.seq_length,
                                  steps_per_epoch=plan.steps_per_epoch, total_steps=plan.total_steps,
                                  eval_dataset=self.eval_ds, eval_collator=self.eval_collator, tokenizer=tokenizer,
                                  model_config=self.model.config, model=self.model, output_dir=args.output_dir,
                                  max_predictions=P)
        self.resume_path = None

    def restore(self, path: str) -> int:
        """Remembered for ``Trainer.train(resume_from_checkpoint=path)``, which restores everything itself."""
        self.resume_path = path
        with open(os.path.join(path, "trainer_state.json"), encoding="utf-8") as f:
            return int(json.load(f).get("global_step", 0))

    def run_context(self):
        return self.context

    def fit(self, callbacks: list, on_save: SaveHook, start_step: int, log_history: List[Dict[str, Any]]) -> Dict[str, Any]:
        from transformers import TrainerCallback
        from transformers.trainer_callback import PrinterCallback, ProgressCallback

        args, plan = self.args, self.plan
        backend = self

        class _SaveHook(TrainerCallback):
            def on_save(self, hf_args, state, control, **kwargs):
                log_history[:] = _log_history(backend.trainer)
                path = os.path.join(args.output_dir, f"checkpoint-{state.global_step}")
                on_save(int(state.global_step), path, backend._saved_files(path))

        hf_args = hf_training_arguments(args, plan.total_steps, bf16=self.precision.bf16, eval_strategy=args.eval_strategy if plan.has_eval else "no",
                                        eval_on_start=bool(getattr(args, "eval_on_start", False)) and plan.has_eval)
        host_barrier(args.output_dir, f"ready-{os.getppid()}", self.info.process_index, self.info.world_size)
        self.trainer = trainer = trainer_class()(
            model=self.model, args=hf_args, train_dataset=self.train_ds, eval_dataset=self.eval_ds,
            data_collator=self.train_collator, eval_collator=self.eval_collator,
            callbacks=[*callbacks, masking_epoch_callback(self.train_collator), _SaveHook(), save_on_signal_callback()],
            max_predictions=self.P)
        if args.disable_tqdm:  # the Trainer's PrinterCallback prints every log dict; our logger does that
            trainer.remove_callback(PrinterCallback)
            trainer.remove_callback(ProgressCallback)
        output = trainer.train(resume_from_checkpoint=self.resume_path)
        step = int(trainer.state.global_step)
        log_history[:] = _log_history(trainer)
        final = os.path.join(args.output_dir, f"checkpoint-{step}")
        if not os.path.isdir(final):  # the final step is always checkpointed (resume, Hub last-checkpoint)
            trainer._save_checkpoint(trainer.model, trial=None)
            on_save(step, final, self._saved_files(final))
        interrupts.check()  # stopped by a signal: its step is saved above (or by the Trainer); now stop the run
        runtime = float(output.metrics.get("train_runtime") or 0.0)
        steps_run = max(step - start_step, 0)
        tokens_per_step = plan.global_batch_size * plan.seq_length
        counts = compile_counts()
        metrics = {"train_runtime": runtime, "train_steps_per_second": steps_run / max(runtime, 1e-9),
                   "train_samples_per_second": steps_run * plan.global_batch_size / max(runtime, 1e-9),
                   "train_tokens_per_second": steps_run * tokens_per_step / max(runtime, 1e-9),
                   "global_step": step, "xla_compilations": counts["uncached_compile"],
                   "xla_compile_time_count": counts["compile_time_count"]}
        for cb in trainer.callback_handler.callbacks:
            if hasattr(cb, "compilations_after_warmup"):
                metrics["xla_compilations_after_warmup"] = cb.compilations_after_warmup
        return metrics

    def current_step(self) -> int:
        """Optimizer steps done so far."""
        return int(self.trainer.state.global_step) if self.trainer is not None else 0

    def end_training(self, logs: Dict[str, Any]) -> None:
        """Nothing to do: the Trainer fired ``on_train_end`` itself."""

    def evaluate(self) -> Dict[str, float]:
        if self.eval_ds is None or self.trainer is None:
            return {}
        metrics = self.trainer.evaluate()
        return {k: v for k, v in metrics.items() if k in ("eval_loss", "perplexity", "eval_accuracy")}

    def export(self, folder: str, tokenizer) -> List[str]:
        model = self.trainer.model if self.trainer is not None else self.model
        if self.trainer is None and self.resume_path:  # a finished run being completed: the checkpoint's weights
            from safetensors.torch import load_file

            model.load_state_dict(load_file(os.path.join(self.resume_path, "model.safetensors")), strict=False)
        return save_model_folder(model, folder, tokenizer=tokenizer)

    def model_summary(self) -> Dict[str, Any]:
        return {**model_summary_fields(self.model), "optimizer": optimizer_description(self.args),
                "jit_compile": True,  # every torch_xla step is an XLA graph
                "precision": self.precision.precision if getattr(self, "precision", None) else None,
                "steps_per_execution": 1, "compiler": "XLA (torch_xla lazy tensors)"}

    def model_config(self):
        return self.model.config
