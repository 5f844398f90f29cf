"""``--backend keras``: Keras 3 (JAX) behind :class:`hf_tpu_ext.backends.base.Backend`.

The model is the architecture of the config's ``model_type`` (:mod:`~hf_tpu_ext.backends.keras.model`); the loop below drives one
compiled JAX program per optimizer step (:mod:`~hf_tpu_ext.backends.keras.step`): forward, backward, gradient
accumulation, clipping and AdamW, with counter-based dropout and bf16 compute on float32 weights under ``--bf16``.
Data parallel over every device of every process (a ``jax.sharding.Mesh``; global batch = per-device batch x
devices); on a multi-host TPU slice each host runs this process, ``jax.distributed.initialize()`` joins them
(:func:`maybe_initialize_distributed`) and only process 0 writes files.

Data: the run's text blocks, masked in NumPy by :mod:`hf_tpu_ext.data.numpy_batches` (seeded by
``(seed, global_step)``) and put on the devices by a background thread two steps ahead, so the loop's host work
per step is one queue read (with ``--streaming``: :mod:`hf_tpu_ext.data.streaming`, this process's slice of an
IterableDataset, its position saved with each checkpoint). Checkpoints: :mod:`~hf_tpu_ext.backends.keras.checkpoint` (atomic
``checkpoint-<step>/`` folders). The shared loop (:class:`~hf_tpu_ext.backends.loop.StepLoop`) drives the one
trainer (:class:`~hf_tpu_ext.backends.keras.trainer.JaxTrainer`: the state, the compiled steps,
``--steps_per_execution`` steps per device call, saves and best weights), built here with everything it reads and
only called from here; the loop checks :mod:`hf_tpu_ext.interrupts` between calls, so SIGINT/SIGTERM stop it at a
call boundary. Keras 3 callbacks (``callback_kind = "keras"``) get the standard hooks (``on_train_begin``,
``on_epoch_begin/end``, ``on_train_batch_begin/end``, ``on_train_end``) with ``model.train_function`` set to the
compiled step.

KERAS_BACKEND is ``jax`` (set when unset); any other Keras backend is refused before compute
(:func:`hf_tpu_ext.backends.keras.refuse_keras_backend`): TensorFlow users train with ``--backend tensorflow``
(its ``tf.distribute`` strategies, TPUStrategy included).
"""

from __future__ import annotations

import logging
import math
import os
from typing import Any, Dict, List, Optional

from hf_tpu_ext.backends.base import BackendDefaults, CheckpointInfo, RunPlan, SaveHook, data_step
from hf_tpu_ext.backends.keras import checkpoint as ckpt
from hf_tpu_ext.backends.keras import refuse_keras_backend
from hf_tpu_ext.backends.keras.best import best_folder, load_best, restore_best
from hf_tpu_ext.backends.keras.checkpoint import (MODEL_CONFIG_FIELDS, STATE_NAME, checkpoint_files,
                                                  find_checkpoints, is_checkpoint_folder, remove_incomplete)
from hf_tpu_ext.backends.keras.processes import maybe_initialize_distributed
from hf_tpu_ext.backends.keras.events import EventWriter
from hf_tpu_ext.backends.keras.export import export_masked_lm
from hf_tpu_ext.backends.keras.model import build_masked_lm, count_parameters, load_pretrained
from hf_tpu_ext.backends.keras.placement import Placement
from hf_tpu_ext.backends.keras.probes import preparing_probes, scoring_probes, wants_probes
from hf_tpu_ext.backends.keras.stream_state import restore_data_state, stream_batches, stream_passes
from hf_tpu_ext.backends.keras.trainer import CheckpointTarget, JaxTrainer
from hf_tpu_ext.backends.loop import StepLoop, restored_loss_window
from hf_tpu_ext.backends.trackio_log import init_trackio
from hf_tpu_ext.best_metric import BestMetric, BestTracker
from hf_tpu_ext.data.numpy_batches import NumpyMasker, TrainBatches, eval_batches
from hf_tpu_ext.data.streaming import is_stream
from hf_tpu_ext.distributed import is_main_process
from hf_tpu_ext.host_memory import keep_step_memory
from hf_tpu_ext.mfu import make_mfu_meter
from hf_tpu_ext.model_config import build_config, check_positions, dropout_overrides, model_summary_fields
from hf_tpu_ext.model_types import record_for
from hf_tpu_ext.precision import has_native_bf16, resolve_precision, xla_bf16_dots_faster
from hf_tpu_ext.run_context import RunContext

logger = logging.getLogger("hf_tpu_ext")


def _host_device_count() -> int:
    """The devices of every process of the run on this host (on a CPU, the simulated devices that share its cores:
    MFU's peak per device is the CPU's divided by them). One process: its own; several: each process's hostname
    and device count gathered over the processes (one small collective; every process calls it, in ``fit``), the
    counts of those on this host summed (2 processes x 2 simulated devices on one machine: 4)."""
    import jax

    local = jax.local_device_count()
    if jax.process_count() == 1:
        return local
    import socket
    import zlib

    import numpy as np
    from jax.experimental import multihost_utils

    host = zlib.crc32(socket.gethostname().encode()) & 0x7FFFFFFF  # int32: JAX's default integer width
    every = np.asarray(multihost_utils.process_allgather(np.array([host, local], np.int32)))  # [processes, 2]
    return int(every[every[:, 0] == host, 1].sum())


class KerasBackend(BackendDefaults):
    """``--backend keras``: keras-hub RoBERTa on Keras 3 + JAX, one XLA program per step (see the module doc)."""

    name = "keras"
    callback_kind = "keras"
    supports_tfrecord = False
    reads_block_shards = True  # prepare-data --shard_format arrow, row by row (hf_tpu_ext/data/block_shards.py)
    needs_remote_data = False
    checks_interrupts = True
    export_replaces = ("model.safetensors", "keras_hub/*")  # export.py renames them into place: a push links them
    scores_probes = property(wants_probes)  # --probe_file scored at each evaluation (backends/keras/probes.py)

    def __init__(self):
        self.num_replicas = 1
        self.is_chief = True
        self.model = None
        self.config = None
        self.placement = None
        self.trainer: Optional[JaxTrainer] = None  # the train state, compiled steps, step reached (build on)
        self.trainer_ran = False
        self._restored_meta: Dict[str, Any] = {}
        self.restored_fit_metrics: Optional[Dict[str, Any]] = None
        self.loaded_best = False
        self.best: Optional[BestTracker] = None  # the best evaluation so far (hf_tpu_ext.best_metric)

    # ------------------------------------------------------------------ devices
    def setup(self, training_args) -> None:
        """Devices (a mesh over every JAX device of every process), the chief, the precision plan.

        Raises:
            BackendError: Keras runs on another backend than JAX (``KERAS_BACKEND``; one line saying what to do).
        """
        os.environ.setdefault("KERAS_BACKEND", "jax")
        import keras  # the backend Keras was imported with wins (it reads KERAS_BACKEND once)

        refuse_keras_backend(keras.backend.backend())  # hf-tpu train refused it before any import already
        # before the JAX client's threads first allocate: its executor threads allocate each step's temporaries
        self.host_memory_tuned = keep_step_memory(single_arena=True)
        self.distributed = maybe_initialize_distributed()
        import jax

        args = training_args
        self.placement = Placement(fsdp=getattr(args, "fsdp", None), fsdp_config=getattr(args, "fsdp_config", None))
        self.num_replicas = self.placement.num_devices
        self.is_chief = is_main_process()  # hf_tpu_ext.distributed: the one answer every module asks
        platform = jax.devices()[0].platform.upper()
        self.accelerator = {"CPU": "CPU", "GPU": "GPU", "CUDA": "GPU", "ROCM": "GPU"}.get(platform, "TPU")
        self.device_kind = jax.devices()[0].device_kind
        native = has_native_bf16(self.accelerator, gpu_check=lambda: _jax_gpu_has_bf16(jax.devices()[0]))
        # the JAX step's bf16 matmuls have float32 results on a CPU (bf16_dot.py): native there, faster with AMX
        self.precision = resolve_precision(args.bf16, True, self.accelerator, native, bf16_dots=True,
                                           bf16_dots_faster=xla_bf16_dots_faster(self.accelerator))
        logger.info("keras %s on JAX %s: %d %s device(s) in %d process(es), data parallel over all of them; "
                    "host memory: %s", _version("keras"), jax.__version__, self.num_replicas, self.device_kind,
                    jax.process_count(), "malloc_tuned" if self.host_memory_tuned else "defaults")
        if self.is_chief:  # the TensorFlow backend's precision line: precision, compiler path and why (precision.py)
            logger.info("precision %s, compiler path: XLA (JAX). Why: %s.", self.precision.precision,
                        self.precision.reason)

    def device_summary(self) -> Dict[str, Any]:
        import jax

        return {"accelerator": self.accelerator, "device_kind": self.device_kind, "num_devices": self.num_replicas,
                "strategy": (f"jax.sharding FSDP {self.placement.strategy} (Keras 3 on JAX)" if self.placement.strategy
                             else "jax.sharding data parallel (Keras 3 on JAX)"), "num_replicas": self.num_replicas,
                "num_workers": jax.process_count(), **(self.trainer.sharding_fields() if self.trainer is not None
                                                     else self.placement.summary_fields())}  # --fsdp, memory

    # ------------------------------------------------------------------ checkpoints (no model needed)
    def find_checkpoints(self, folder: str) -> List[str]:
        return find_checkpoints(folder)

    def checkpoint_info(self, path: str) -> CheckpointInfo:
        """Read every tensor of the checkpoint, its ``checkpoint.json`` and trainer state
        (:func:`hf_tpu_ext.backends.keras.checkpoint.read_checkpoint_info`).

        Raises:
            CheckpointError: a file is missing, truncated or not JSON (named in the message).
        """
        return ckpt.read_checkpoint_info(path)

    def remove_incomplete_checkpoints(self, output_dir: str) -> List[str]:
        """Delete temporary checkpoint folders and ``checkpoint-N/`` without their trainer state (a killed save)."""
        return remove_incomplete(output_dir)

    def is_checkpoint_folder(self, folder: str) -> bool:
        return is_checkpoint_folder(folder)

    def checkpoint_state_file(self, path: str) -> str:
        return os.path.join(path, STATE_NAME)

    def checkpoint_files(self, path: str, with_state: bool = False) -> Dict[str, str]:
        """A checkpoint found on disk (the final push, a signal's); a save hands its own files to ``on_save``
        (:func:`~hf_tpu_ext.backends.keras.checkpoint.write_checkpoint`)."""
        return checkpoint_files(path, with_state)

    # ------------------------------------------------------------------ model and data
    def build(self, model_args, data_args, training_args, tokenizer, blocks, plan: RunPlan) -> None:
        from hf_tpu_ext.backends.keras.optimization import make_optimizer

        args = training_args
        self.args, self.plan, self.tokenizer = args, plan, tokenizer
        self.model_args, self.data_args = model_args, data_args
        self.accumulation = int(getattr(args, "gradient_accumulation_steps", 1) or 1)
        dtype = self.precision.keras_policy  # decided once, in setup
        if model_args.model_name_or_path:
            self.model, self.config = load_pretrained(model_args.model_name_or_path, dtype,
                                                      revision=model_args.model_revision,
                                                      overrides=dropout_overrides(model_args),
                                                      placement=self.placement)  # --fsdp: read by slices
            check_positions(self.config, plan.seq_length)
        else:
            self.config = build_config(model_args, tokenizer, plan.seq_length)
            self.model = build_masked_lm(self.config, dtype=dtype, seed=args.seed)
        self.optimizer, self.schedule = make_optimizer(args, plan.total_steps)
        self.optimizer.build(self.model.trainable_variables)
        self.model.optimizer = self.optimizer  # callbacks read model.optimizer
        masker = NumpyMasker.for_tokenizer(tokenizer, data_args.max_predictions_per_seq,
                                           getattr(data_args, "pack_documents", False))
        if masker.separator_token_id is not None:
            logger.info("Packed documents: attention and positions restart after each token id %d (the tokenizer's "
                        "separator ending every document).", masker.separator_token_id)
        self.masker = masker
        rows = self.placement.process_batch_rows(plan.global_batch_size, self.accumulation)  # this process's only
        self.train_batches = (stream_batches(self, blocks["train"], rows) if is_stream(blocks["train"]) else
                              TrainBatches(blocks["train"], plan.global_batch_size, args.seed, masker, rows,
                                           step_offset=data_step(plan, 0)))  # a new length's phase: in tokens
        self.eval_blocks = blocks.get("validation") if plan.has_eval else None
        self.best = BestTracker(BestMetric.from_args(args))
        report_to = getattr(args, "report_to", None) or ()
        self.summary_writer = EventWriter(args.logging_dir) if self.is_chief and "tensorboard" in report_to else None
        self.trackio = init_trackio(args, model_args) if self.is_chief and "trackio" in report_to else None
        self.trainer = self._make_trainer()
        try:  # the model type's record's count (the head runs at the masked positions only)
            self.flops_per_token = record_for(self.config.model_type).count_flops(
                self.config, plan.seq_length, min(1.0, data_args.max_predictions_per_seq / plan.seq_length))
        except Exception:  # a config without the fields the count needs: no MFU
            self.flops_per_token = None
        self.context = RunContext(model_args=model_args, data_args=data_args, training_args=args,
                                  num_replicas=self.num_replicas, global_batch_size=plan.global_batch_size,
                                  seq_length=plan.seq_length, steps_per_epoch=plan.steps_per_epoch,
                                  total_steps=plan.total_steps, tokenizer=tokenizer, model_config=self.config,
                                  model=self.model, output_dir=args.output_dir, flops_per_token=self.flops_per_token,
                                  max_predictions=int(data_args.max_predictions_per_seq))

    def _make_trainer(self) -> JaxTrainer:
        """The one trainer, given everything it reads (it never reads this backend)."""
        args = self.args
        self.steps_per_execution = int(getattr(args, "steps_per_execution", 1) or 1)  # read once, here
        target = CheckpointTarget(output_dir=args.output_dir, keep=args.save_total_limit, writes=self.is_chief,
                                  facts=self._checkpoint_facts)
        return JaxTrainer(self.model, self.optimizer, self.placement, batches=self.train_batches,
                          schedule=self.schedule, evaluate=self.evaluate, summary_writer=self.summary_writer,
                          checkpoints=target, bf16_dots=self.precision.bf16_dots, seed=int(args.seed),
                          accumulation=self.accumulation, steps_per_execution=self.steps_per_execution,
                          gradient_checkpointing=bool(getattr(args, "gradient_checkpointing", False)),
                          config=self.config)

    # ------------------------------------------------------------------ checkpoints with a model
    def _checkpoint_facts(self, step: int) -> Dict[str, Any]:
        """The run's fields of ``checkpoint-<step>/checkpoint.json`` (the trainer adds the loop's and its own)."""
        plan, args = self.plan, self.args
        meta = {"epoch": step / plan.steps_per_epoch,
                "model_config": {k: getattr(self.config, k, None) for k in MODEL_CONFIG_FIELDS},
                "data": {"seed": int(args.seed), "global_batch_size": plan.global_batch_size,
                         "num_train_blocks": plan.num_train_blocks, "seq_length": plan.seq_length},
                "keras_backend": "jax", "dtype_policy": self.precision.keras_policy,
                "keras_version": _version("keras"), "optim": args.optim}
        if _version("keras-hub") != "?":  # only where installed
            meta["keras_hub_version"] = _version("keras-hub")
        return meta

    def restore(self, path: str) -> int:
        """Load weights and optimizer state of a checkpoint (the trainer's), this process's ``--streaming``
        position and the best-model tracking; returns its global step.

        Raises:
            CheckpointError: a file is unreadable, or a variable is missing or of another shape (named).
        """
        meta = self.trainer.restore(path, self.args.optim)
        step = int(meta["global_step"])
        restore_data_state(self, path, step)  # --streaming: this process's position
        self._restored_meta = meta
        # a resume that only finishes the export reports what the training process measured (all_results, card)
        self.restored_fit_metrics = dict(meta.get("fit_metrics") or {}) or None

        restore_best(self)
        return step

    def run_context(self):
        return self.context

    # ------------------------------------------------------------------ training
    def current_step(self) -> int:
        return self.trainer.current_step() if self.trainer is not None else 0

    @property
    def best_model_checkpoint(self) -> Optional[str]:
        """``checkpoints/best/`` once a best evaluation's weights are kept there (``--load_best_model_at_end``:
        the trainer's ``keep_best``, or restored with the checkpoint), else None."""
        if self.best is None or self.best.step is None or not getattr(self.args, "load_best_model_at_end", False):
            return None
        return best_folder(self.args.output_dir)

    @scoring_probes  # with --probe_file also probe_top1, probe_top5, probe_mrr, probe_n
    def evaluate(self) -> Dict[str, float]:
        """``eval_loss``, ``perplexity``, ``eval_accuracy`` over the validation split's full batches ({} without)."""
        if self.eval_blocks is None or self.trainer is None:
            return {}

        loss = correct = count = 0.0
        rows = self.placement.process_batch_rows(self.plan.eval_batch_size)
        for batch in eval_batches(self.eval_blocks, self.plan.eval_batch_size, self.args.seed, self.masker, rows):
            l, c, n = self.trainer.eval_sums(batch)
            loss, correct, count = loss + l, correct + c, count + n
        if not count:
            return {}
        eval_loss = loss / count
        return {"eval_loss": eval_loss, "perplexity": float(math.exp(min(eval_loss, 700.0))),
                "eval_accuracy": correct / count}

    @preparing_probes  # --probe_file parsed and tokenized before the first step
    def fit(self, callbacks: list, on_save: SaveHook, start_step: int,
            log_history: List[Dict[str, Any]]) -> Dict[str, Any]:
        """Train from ``start_step`` to the plan's last step (the shared :class:`~hf_tpu_ext.backends.loop.StepLoop`
        on :class:`~hf_tpu_ext.backends.keras.trainer.JaxTrainer`: ``--steps_per_execution`` steps per device call),
        then checkpoint the step reached; returns the segment's figures (``train_loss``, ``train_runtime``,
        ``steady_tokens_per_second``, ``mfu``, ``global_step``, ...).

        Raises:
            KeyboardInterrupt: after SIGINT/SIGTERM (the step reached is checkpointed first).
            FloatingPointError: a non-finite training loss.
        """
        import keras

        args, plan = self.args, self.plan
        spe, total = plan.steps_per_epoch, plan.total_steps
        trainer, step = self.trainer, int(start_step)
        trainer.start(step, on_save)
        self.log_history = log_history
        self.trainer_ran = True
        cb = keras.callbacks.CallbackList(list(callbacks), add_history=False, add_progbar=False, model=self.model,
                                          epochs=max(1, math.ceil(total / spe)), steps=spe, verbose=0)
        self.mfu_of = make_mfu_meter(self.flops_per_token, "CPU" if self.accelerator == "CPU" else self.device_kind,
                                     self.precision.bf16, self.num_replicas, self.is_chief, per="device",
                                     cpu_devices=_host_device_count() if self.accelerator == "CPU" else 1)
        # the logging window of the checkpoint resumed from: the next entry averages the same steps as without a
        # stop; the restored checkpoint (start_step) is never written again
        loop = StepLoop(trainer, args, plan, cb, log_history, step,
                        restored_loss_window(self._restored_meta, step), self.mfu_of, best=self.best,
                        saved_step=step, is_chief=self.is_chief, trackio=self.trackio, passes_of=self.data_passes)
        try:
            with trainer.counting_compiles():  # XLA's compilations of the step, from JAX's events
                step = loop.run()
        finally:
            if self.trackio is not None:
                self.trackio.finish()
        loop.finish(step)  # the final checkpoint; after a signal, KeyboardInterrupt
        self.callbacks = cb
        trainer.write_variables()
        if getattr(args, "load_best_model_at_end", False):
            load_best(self)
        self.final_logs = loop.logs
        return {**loop.results(step), "first_step_seconds": loop.meter.first_step, **trainer.compile_figures()}

    def end_training(self, logs: Dict[str, Any]) -> None:
        cb = getattr(self, "callbacks", None)
        if cb is not None:
            cb.on_train_end(logs or {})

    # ------------------------------------------------------------------ export and summary
    def export(self, folder: str, tokenizer) -> List[str]:
        """``config.json``, ``model.safetensors`` (the architecture's transformers names, ``format: pt``), the
        tokenizer (and, for RoBERTa, the keras-hub preset) through :mod:`hf_tpu_ext.backends.keras.export`."""
        if self.trainer is None or self.loaded_best:
            return export_masked_lm(self.model, folder, tokenizer=tokenizer, config=self.config)
        with self.trainer.bound_weights():  # the state's arrays, one tensor on the host at a time
            return export_masked_lm(self.model, folder, tokenizer=tokenizer, config=self.config)

    def model_config(self):
        return self.config

    def data_passes(self, step: int):
        return stream_passes(self, step)  # --streaming: the stream's own pass count

    def model_summary(self) -> Dict[str, Any]:
        from hf_tpu_ext.backends.keras.optimization import optimizer_description

        return {**model_summary_fields(self.config, count_parameters(self.model)),
                "optimizer": optimizer_description(self.args), "jit_compile": True,
                "precision": self.precision.precision,
                "steps_per_execution": self.steps_per_execution, "compiler": "XLA (JAX), whole step in one program"}


def _version(dist: str) -> str:
    from importlib import metadata

    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "?"


def _jax_gpu_has_bf16(device) -> bool:
    """Whether a JAX GPU ``device`` has bf16 tensor cores: CUDA compute capability >= 8.0 (Ampere on, as
    :func:`hf_tpu_ext.precision.gpu_has_native_bf16` asks TensorFlow); a device without the attribute (ROCm) counts
    as native (every ROCm GPU JAX supports multiplies bf16)."""
    capability = getattr(device, "compute_capability", None)
    if not capability:
        return True
    major, _, minor = str(capability).partition(".")
    return (int(major), int(minor or 0)) >= (8, 0)
