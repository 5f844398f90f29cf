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
``checkpoint-<step>/`` folders). The loop (:mod:`~hf_tpu_ext.backends.keras.loop`: ``--steps_per_execution``
steps per device call) checks :mod:`hf_tpu_ext.interrupts` between calls, so SIGINT/SIGTERM stop it at a call
boundary. Keras 3 callbacks (``callback_kind = "keras"``) get the standard hooks
(``on_train_begin``, ``on_epoch_begin/end``, ``on_train_batch_begin/end``, ``on_train_end``) with
``model.train_function`` set to the compiled step.

KERAS_BACKEND is ``jax`` by default (set when unset). ``KERAS_BACKEND=tensorflow`` runs the same loop with the
step of :mod:`~hf_tpu_ext.backends.keras.step_tf` (one XLA-compiled ``tf.function`` updating the variables, one
device, Keras' own dropout); other Keras backends are refused.
"""

from __future__ import annotations

import logging
import math
import os
from typing import Any, Dict, List, Optional

from hf_tpu_ext.backends.base import BackendDefaults, CheckpointInfo, RunPlan, SaveHook, data_step
from hf_tpu_ext.backends.keras import checkpoint as ckpt
from hf_tpu_ext.backends.keras.architectures.name_table import renamed_paths
from hf_tpu_ext.backends.keras.best import load_best, restore_best
from hf_tpu_ext.backends.keras.checkpoint import (STATE_NAME, export_checkpoint_folder, find_checkpoints,
                                                  is_checkpoint_folder, remove_incomplete)
from hf_tpu_ext.backends.keras.processes import maybe_initialize_distributed
from hf_tpu_ext.backends.keras.events import EventWriter
from hf_tpu_ext.backends.keras.export import export_masked_lm
from hf_tpu_ext.backends.keras.tensor_files import bound_variables
from hf_tpu_ext.backends.keras.loop import KerasTrainer
from hf_tpu_ext.backends.keras.model import build_masked_lm, count_parameters, load_pretrained
from hf_tpu_ext.backends.keras.placement import Placement
from hf_tpu_ext.backends.keras.probes import preparing_probes, scoring_probes, wants_probes
from hf_tpu_ext.backends.keras.step import CompileCounter
from hf_tpu_ext.backends.keras.stream_state import restore_data_state, stream_batches
from hf_tpu_ext.backends.loop import StepLoop, restored_loss_window
from hf_tpu_ext.backends.trackio_log import init_trackio
from hf_tpu_ext.best_metric import BestMetric, BestTracker
from hf_tpu_ext.data.numpy_batches import NumpyMasker, TrainBatches, eval_batches
from hf_tpu_ext.data.streaming import is_stream
from hf_tpu_ext.errors import BackendError, CheckpointError
from hf_tpu_ext.extras import require_extra
from hf_tpu_ext.host_memory import keep_step_memory
from hf_tpu_ext.mfu import make_mfu_meter
from hf_tpu_ext.model_config import build_config, check_positions, dropout_overrides, model_summary_fields
from hf_tpu_ext.model_types import record_for
from hf_tpu_ext.precision import has_native_bf16, resolve_precision, xla_bf16_dots_faster
from hf_tpu_ext.run_context import RunContext

logger = logging.getLogger("hf_tpu_ext")

#: checkpoint keys of the model's non-trainable variables (by position)
NON_TRAINABLE_PREFIX = "non_trainable/"


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
    scores_probes = property(wants_probes)  # --probe_file scored at each evaluation (backends/keras/probes.py)

    def __init__(self):
        self.num_replicas = 1
        self.is_chief = True
        self.model = None
        self.config = None
        self.placement = None
        self.trainer: Optional[KerasTrainer] = None  # the train state, compiled steps, step reached (build on)
        self.trainer_ran = False
        self._restored_meta: Dict[str, Any] = {}
        self.restored_fit_metrics: Optional[Dict[str, Any]] = None
        self.loaded_best = False
        self.best_model_checkpoint = None
        self.best: Optional[BestTracker] = None  # the best evaluation so far (hf_tpu_ext.best_metric)

    # ------------------------------------------------------------------ devices
    def setup(self, training_args) -> None:
        os.environ.setdefault("KERAS_BACKEND", "jax")
        import keras  # the backend Keras was imported with wins (it reads KERAS_BACKEND once)

        self.keras_backend = keras.backend.backend()
        if self.keras_backend not in ("jax", "tensorflow"):
            raise BackendError(
                f"--backend keras trains on Keras 3's JAX (default) or TensorFlow backend, but Keras runs on "
                f"{self.keras_backend!r} (KERAS_BACKEND): unset it, or set KERAS_BACKEND=jax or tensorflow.")
        if self.keras_backend == "tensorflow":
            self._setup_tensorflow(training_args)
            return
        # before the JAX client's threads first allocate: its executor threads allocate each step's temporaries
        self.host_memory_tuned = keep_step_memory(single_arena=True)
        self.distributed = maybe_initialize_distributed()
        import jax

        args = training_args
        self.placement = Placement()
        self.num_replicas = self.placement.num_devices
        from hf_tpu_ext.distributed import is_main_process

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
        self._log_precision()

    def _setup_tensorflow(self, args) -> None:
        """``KERAS_BACKEND=tensorflow``: one device (a GPU when TensorFlow sees one), this process the chief."""
        require_extra("tensorflow", "--backend keras with KERAS_BACKEND=tensorflow", modules=("tensorflow",))
        import tensorflow as tf

        self.placement, self.num_replicas, self.is_chief = None, 1, True
        self.accelerator = "GPU" if tf.config.list_physical_devices("GPU") else "CPU"
        self.device_kind = self.accelerator
        native = has_native_bf16(self.accelerator)  # a GPU: TensorFlow's own compute-capability check
        self.precision = resolve_precision(args.bf16, True, self.accelerator, native)
        logger.info("keras %s on TensorFlow %s: one %s device", _version("keras"), tf.__version__, self.accelerator)
        self._log_precision()

    def _log_precision(self) -> None:
        """The TensorFlow backend's precision line: precision, compiler path and why (hf_tpu_ext/precision.py)."""
        if self.is_chief:
            compiler = "XLA (Keras 3 on TensorFlow)" if self.on_tensorflow else "XLA (JAX)"
            logger.info("precision %s, compiler path: %s. Why: %s.", self.precision.precision, compiler,
                        self.precision.reason)

    @property
    def on_tensorflow(self) -> bool:
        return getattr(self, "keras_backend", "jax") == "tensorflow"

    def device_summary(self) -> Dict[str, Any]:
        if self.on_tensorflow:
            return {"accelerator": self.accelerator, "device_kind": self.device_kind, "num_devices": 1,
                    "strategy": "one device (Keras 3 on TensorFlow)", "num_replicas": 1, "num_workers": 1}
        import jax

        return {"accelerator": self.accelerator, "device_kind": self.device_kind, "num_devices": self.num_replicas,
                "strategy": "jax.sharding data parallel (Keras 3 on JAX)", "num_replicas": self.num_replicas,
                "num_workers": jax.process_count()}

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

    def export_checkpoint(self, path: str, folder: str) -> str:
        return export_checkpoint_folder(path, folder)

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
                                                      overrides=dropout_overrides(model_args))
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
        place = self.placement  # this process's rows only; None on Keras-on-TensorFlow (one device: every row)
        rows = place.process_batch_rows(plan.global_batch_size, self.accumulation) if place else None
        self.train_batches = (stream_batches(self, blocks["train"], rows) if is_stream(blocks["train"]) else
                              TrainBatches(blocks["train"], plan.global_batch_size, args.seed, masker, rows,
                                           step_offset=data_step(plan, 0)))  # a new length's phase: in tokens
        self.eval_blocks = blocks.get("validation") if plan.has_eval else None
        self.trainer = KerasTrainer(self, self.precision, int(args.seed), self.accumulation,
                                    getattr(args, "steps_per_execution", 1))
        self.best = BestTracker(BestMetric.from_args(args))
        report_to = getattr(args, "report_to", None) or ()
        self.summary_writer = EventWriter(args.logging_dir) if self.is_chief and "tensorboard" in report_to else None
        self.trackio = init_trackio(args, model_args) if self.is_chief and "trackio" in report_to else None
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

    @property
    def state(self):
        """The train state (:attr:`KerasTrainer.state`; None before ``build`` and on Keras-on-TensorFlow)."""
        return self.trainer.state if self.trainer is not None else None

    # ------------------------------------------------------------------ checkpoints with a model
    def _named_state(self):
        # the train state's arrays as they are (any sharding: each process writes the blocks it holds);
        # Keras on TensorFlow: its variables as NumPy
        trainable, non_trainable, opt = self.trainer.state if self.state is not None else self.trainer.host_state()
        # trainable variables by path (keras-hub names every layer); non-trainable ones (dropout seed states,
        # auto-numbered "seed_generator_N" per process) and the optimizer's by position
        model_vars = {var.path: value for var, value in zip(self.model.trainable_variables, trainable)}
        model_vars.update({f"{NON_TRAINABLE_PREFIX}{i:05d}": value for i, value in enumerate(non_trainable)})
        opt_vars = {f"{i:05d}/{var.path}": value for i, (var, value) in enumerate(zip(self.optimizer.variables, opt))}
        return model_vars, opt_vars

    def save(self, step: int, fields: Optional[Dict[str, Any]] = None) -> Optional[str]:
        """Checkpoint the state at ``step`` (process 0 writes; every process takes part in the device read) with the
        loop's ``fields`` (:meth:`~hf_tpu_ext.backends.loop.StepLoop.checkpoint_fields`: ``loss_window``,
        ``fit_metrics``, to which this backend adds its XLA compile counts)."""
        from hf_tpu_ext.backends.keras.checkpoint import MODEL_CONFIG_FIELDS, save_checkpoint

        model_vars, opt_vars = self._named_state()
        from hf_tpu_ext.backends.keras.stream_state import data_state_files

        data_states = data_state_files(self, step)  # --streaming: every process's position (a collective)
        plan, args = self.plan, self.args
        meta = {"epoch": step / plan.steps_per_epoch,
                "model_config": {k: getattr(self.config, k, None) for k in MODEL_CONFIG_FIELDS},
                "data": {"seed": int(args.seed), "global_batch_size": plan.global_batch_size,
                         "num_train_blocks": plan.num_train_blocks, "seq_length": plan.seq_length},
                "keras_backend": self.keras_backend, "dtype_policy": self.precision.keras_policy,
                "keras_version": _version("keras"), "optim": args.optim}
        if _version("keras-hub") != "?":  # only where installed
            meta["keras_hub_version"] = _version("keras-hub")
        meta.update(fields or {})  # the loop's: the logging window and what this process measured
        if "fit_metrics" in meta:
            meta["fit_metrics"] = {**meta["fit_metrics"], **self._compile_figures()}
        # every process writes its blocks (a collective); the folder's path on process 0, None elsewhere
        return save_checkpoint(args.output_dir, step, model_vars, opt_vars, meta, keep=args.save_total_limit,
                               extra_files=data_states)

    def restore(self, path: str) -> int:
        """Load weights and optimizer state of a checkpoint; returns its global step.

        Raises:
            CheckpointError: a file is unreadable, or a variable is missing or of another shape (named).
        """
        meta = ckpt.read_meta(path)
        self._restore_arrays(path, meta)
        step = self.trainer.step = int(meta["global_step"])

        restore_data_state(self, path, step)  # --streaming: this process's position
        self._restored_meta = meta
        # a resume that only finishes the export reports what the training process measured (all_results, card)
        self.restored_fit_metrics = dict(meta.get("fit_metrics") or {}) or None

        restore_best(self)
        return step

    def _restore_arrays(self, path: str, meta: Dict[str, Any]) -> None:
        """The checkpoint's arrays read onto the train state's shardings (any device count or mesh it was saved
        from; :func:`~hf_tpu_ext.backends.keras.checkpoint.restore_state`); Keras on TensorFlow: its variables."""
        from types import SimpleNamespace

        state = self.trainer.state if self.state is not None else None
        variables = (self.model.trainable_variables, self.model.non_trainable_variables, self.optimizer.variables)
        targets = [[SimpleNamespace(shape=tuple(v.shape), dtype=v.dtype, sharding=v.sharding if state else None)
                    for v in (state[part] if state is not None else variables[part])] for part in range(3)]
        # an older checkpoint's variable paths renamed to the model's (e.g. RoBERTa before the shared encoder)
        saved = renamed_paths({k: (k, s) for k, s in ckpt.state_shapes(path, ckpt.MODEL_STEM).items()},
                              getattr(self.model, "legacy_paths", ()))
        names = [var.path for var in variables[0]] + [f"{NON_TRAINABLE_PREFIX}{i:05d}" for i in range(len(variables[1]))]
        model_targets = {}
        for key, var, target in zip(names, [*variables[0], *variables[1]], [*targets[0], *targets[1]]):
            old, shape = saved.get(key, (None, None))
            if old is None or tuple(shape) != tuple(var.shape):
                raise CheckpointError(
                    f"Checkpoint {path} does not fit the model: variable {var.path} "
                    f"{'is missing' if old is None else f'has shape {tuple(shape)}, the model {tuple(var.shape)}'}.")
            model_targets[old] = target
        opt_saved = ckpt.state_shapes(path, ckpt.OPTIMIZER_STEM)
        ordered = sorted(opt_saved)  # by position
        if len(ordered) != len(variables[2]) or any(
                tuple(opt_saved[k]) != tuple(v.shape) for k, v in zip(ordered, variables[2])):
            trained = (f"trained with --optim {meta['optim']}" if meta.get("optim") not in (None, self.args.optim)
                       else f"its optimizer state has {len(ordered)} variables, --optim {self.args.optim} "
                            f"{len(variables[2])}")
            raise CheckpointError(f"--optim {self.args.optim} contradicts the checkpoint {path} ({trained}): drop "
                                  "--optim or start a new run in another --output_dir.")
        values = list(ckpt.restore_state(path, model_targets, ckpt.MODEL_STEM).values())
        values += list(ckpt.restore_state(path, dict(zip(ordered, targets[2])), ckpt.OPTIMIZER_STEM).values())
        split = (len(variables[0]), len(variables[0]) + len(variables[1]))
        restored = (values[: split[0]], values[split[0]: split[1]], values[split[1]:])
        if state is not None:  # the state is what trains; the Keras variables follow it at export
            self.trainer.state = tuple(restored)
            return
        for part, vs in zip(restored, variables):
            for var, value in zip(vs, part):
                var.assign(value)

    def run_context(self):
        return self.context

    # ------------------------------------------------------------------ training
    def current_step(self) -> int:
        return int(self.trainer.step) if self.trainer is not None else 0

    @scoring_probes  # with --probe_file also probe_top1, probe_top5, probe_mrr, probe_n
    def evaluate(self) -> Dict[str, float]:
        """``eval_loss``, ``perplexity``, ``eval_accuracy`` over the validation split's full batches ({} without)."""
        if self.eval_blocks is None or (self.state is None and not self.on_tensorflow):
            return {}

        loss = correct = count = 0.0
        rows = self.placement.process_batch_rows(self.plan.eval_batch_size) if self.placement else None
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
        on :class:`~hf_tpu_ext.backends.keras.loop.KerasTrainer`: ``--steps_per_execution`` steps per device call),
        then checkpoint the step reached; returns the segment's figures (``train_loss``, ``train_runtime``,
        ``steady_tokens_per_second``, ``mfu``, ``global_step``, ...).

        Raises:
            KeyboardInterrupt: after SIGINT/SIGTERM (the step reached is checkpointed first).
            FloatingPointError: a non-finite training loss.
        """
        import keras

        args, plan = self.args, self.plan
        spe, total = plan.steps_per_epoch, plan.total_steps
        trainer = self.trainer
        step = trainer.step = int(start_step)
        trainer.on_save = on_save
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
                                     saved_step=step, is_chief=self.is_chief, trackio=self.trackio,
                                     passes_of=self.data_passes)
        compiles = self._compiles = CompileCounter("train_step")
        if not self.on_tensorflow:
            compiles.__enter__()  # XLA's compilations of the step, from JAX's events
        try:
            step = loop.run()
        finally:
            if not self.on_tensorflow:
                compiles.__exit__(None, None, None)
            if self.trackio is not None:
                self.trackio.finish()
        loop.finish(step)  # the final checkpoint; after a signal, KeyboardInterrupt
        self.callbacks = cb
        trainer.variables_from_state()
        if getattr(args, "load_best_model_at_end", False):

            load_best(self)
        self.final_logs = loop.logs
        return {**loop.results(step), "first_step_seconds": loop.meter.first_step, **self._compile_figures()}

    def _compile_figures(self) -> Dict[str, Any]:
        """The train step's XLA compilations in this segment (``xla_step_compilations``: 1 = compiled once) and
        their seconds."""
        compiles = self._compiles
        count = (int(self.trainer.train_step.experimental_get_tracing_count()) if self.on_tensorflow
                 else compiles.count)
        return {"xla_step_compilations": int(count), "xla_step_compile_seconds": round(float(compiles.seconds), 3)}

    def end_training(self, logs: Dict[str, Any]) -> None:
        cb = getattr(self, "callbacks", None)
        if cb is not None:
            cb.on_train_end(logs or {})

    # ------------------------------------------------------------------ export and summary
    def export(self, folder: str, tokenizer) -> List[str]:
        """``config.json``, ``model.safetensors`` (the architecture's transformers names, ``format: pt``), the
        tokenizer (and, for RoBERTa, the keras-hub preset) through :mod:`hf_tpu_ext.backends.keras.export`."""
        if self.state is None or self.loaded_best:
            return export_masked_lm(self.model, folder, tokenizer=tokenizer, config=self.config)
        # the state's arrays read through the variables, one tensor on the host at a time (tensor_files.py)
        with bound_variables([*self.model.trainable_variables, *self.model.non_trainable_variables],
                             [*self.state[0], *self.state[1]]):
            return export_masked_lm(self.model, folder, tokenizer=tokenizer, config=self.config)

    def model_config(self):
        return self.config

    def data_passes(self, step: int):
        from hf_tpu_ext.backends.keras.stream_state import stream_passes

        return stream_passes(self, step)  # --streaming: the stream's own pass count

    def model_summary(self) -> Dict[str, Any]:
        from hf_tpu_ext.backends.keras.optimization import optimizer_description

        return {**model_summary_fields(self.config, count_parameters(self.model)),
                "optimizer": optimizer_description(self.args), "jit_compile": True,
                "precision": self.precision.precision,
                "steps_per_execution": self.trainer.steps_per_execution,
                "compiler": ("XLA (Keras 3 on TensorFlow), whole step in one program" if self.on_tensorflow
                             else "XLA (JAX), whole step in one program")}


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
