"""``--backend keras``: Keras 3 (JAX) behind :class:`hf_tpu_ext.backends.base.Backend`.

The model is keras-hub's ``RobertaMaskedLM`` (:mod:`~hf_tpu_ext.backends.keras.model`); the loop below drives one
compiled JAX program per optimizer step (:mod:`~hf_tpu_ext.backends.keras.step`): forward, backward, gradient
accumulation, clipping and AdamW, with counter-based dropout and bf16 compute on float32 weights under ``--bf16``.
Data parallel over every device of every process (a ``jax.sharding.Mesh``; global batch = per-device batch x
devices); on a multi-host TPU slice each host runs this process, ``jax.distributed.initialize()`` joins them
(:func:`maybe_initialize_distributed`) and only process 0 writes files.

Data: the run's text blocks, masked in NumPy by :mod:`hf_tpu_ext.data.numpy_batches` (seeded by
``(seed, global_step)``) and put on the devices by a background thread two steps ahead, so the loop's host work
per step is one queue read. Checkpoints: :mod:`~hf_tpu_ext.backends.keras.checkpoint` (atomic
``checkpoint-<step>/`` folders). The loop checks :mod:`hf_tpu_ext.interrupts` between steps, so SIGINT/SIGTERM
stop it at a step boundary. Keras 3 callbacks (``callback_kind = "keras"``) get the standard hooks
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
import statistics
import time
from collections import deque
from typing import Any, Dict, List, Optional

import numpy as np

from hf_tpu_ext.outputs import format_log_entry
from hf_tpu_ext.backends.base import BackendDefaults, CheckpointInfo, RunPlan, SaveHook
from hf_tpu_ext.errors import BackendError, CheckpointError

logger = logging.getLogger("hf_tpu_ext")

STEADY_WINDOW = 10_000
#: checkpoint keys of the model's non-trainable variables (by position)
NON_TRAINABLE_PREFIX = "non_trainable/"
#: ``HF_TPU_JAX_DISTRIBUTED=1``: this process is one of several (one per host of a TPU slice)
DISTRIBUTED_SWITCH = "HF_TPU_JAX_DISTRIBUTED"


def maybe_initialize_distributed() -> bool:
    """``jax.distributed.initialize()`` when the environment asks for several processes; True when it did.

    Asked for by ``HF_TPU_JAX_DISTRIBUTED=1`` (JAX then finds the cluster itself: Cloud TPU slices through their
    metadata, Slurm, Open MPI), by ``JAX_COORDINATOR_ADDRESS`` (with ``JAX_NUM_PROCESSES``/``JAX_PROCESS_ID``,
    JAX's own variables), or by ``TPU_WORKER_HOSTNAMES``/``TPU_PROCESS_ADDRESSES`` naming more than one host.
    Must run before anything touches the devices (``jax.devices()``).
    """
    hosts = [h for v in ("TPU_PROCESS_ADDRESSES", "TPU_WORKER_HOSTNAMES")
             for h in os.environ.get(v, "").split(",") if h.strip()]
    asked = os.environ.get(DISTRIBUTED_SWITCH, "").lower() in ("1", "true", "yes")
    if not (asked or os.environ.get("JAX_COORDINATOR_ADDRESS") or len(hosts) > 1):
        return False
    import jax

    jax.distributed.initialize()
    return True


def _crossed(prev_step: int, step: int, every: int) -> bool:
    return every > 0 and step // every > prev_step // every


class RunContext:
    """What a callback's ``from_run(run)`` reads (the fields of the TF backend's ``RunContext`` that apply)."""

    def __init__(self, **fields):
        self.__dict__.update(fields)


class KerasBackend(BackendDefaults):
    """``--backend keras``: keras-hub RoBERTa on Keras 3 + JAX, one XLA program per step (see the module doc)."""

    name = "keras"
    callback_kind = "keras"
    supports_tfrecord = False
    needs_remote_data = False
    checks_interrupts = True

    def __init__(self):
        self.num_replicas = 1
        self.is_chief = True
        self.model = None
        self.config = None
        self.state = None
        self.placement = None
        self._step = 0
        self.trainer_ran = False
        self.loaded_best = False
        self.best_model_checkpoint = None

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
        from hf_tpu_ext.host_memory import keep_step_memory

        # before the JAX client's threads first allocate: its executor threads allocate each step's temporaries
        self.host_memory_tuned = keep_step_memory(single_arena=True)
        self.distributed = maybe_initialize_distributed()
        import jax

        from hf_tpu_ext.backends.keras.step import Placement
        from hf_tpu_ext.precision import NATIVE_BF16_CPU_FLAGS, cpu_flags, resolve_precision

        args = training_args
        self.placement = Placement()
        self.num_replicas = self.placement.num_devices
        self.is_chief = jax.process_index() == 0
        platform = jax.devices()[0].platform.upper()
        self.accelerator = {"CPU": "CPU", "GPU": "GPU", "CUDA": "GPU", "ROCM": "GPU"}.get(platform, "TPU")
        self.device_kind = jax.devices()[0].device_kind
        native = self.accelerator != "CPU" or bool(cpu_flags() & NATIVE_BF16_CPU_FLAGS)
        self.precision = resolve_precision(args.bf16, True, self.accelerator, native)
        args.bf16, args.jit_compile = self.precision.bf16, True
        logger.info("keras %s on JAX %s: %d %s device(s) in %d process(es), data parallel over all of them; "
                    "host memory: %s", _version("keras"), jax.__version__, self.num_replicas, self.device_kind,
                    jax.process_count(), "malloc_tuned" if self.host_memory_tuned else "defaults")

    def _setup_tensorflow(self, args) -> None:
        """``KERAS_BACKEND=tensorflow``: one device (a GPU when TensorFlow sees one), this process the chief."""
        from hf_tpu_ext.extras import require_extra
        from hf_tpu_ext.precision import NATIVE_BF16_CPU_FLAGS, cpu_flags, resolve_precision

        require_extra("tensorflow", "--backend keras with KERAS_BACKEND=tensorflow", modules=("tensorflow",))
        import tensorflow as tf

        self.placement, self.num_replicas, self.is_chief = None, 1, True
        self.accelerator = "GPU" if tf.config.list_physical_devices("GPU") else "CPU"
        self.device_kind = self.accelerator
        native = self.accelerator != "CPU" or bool(cpu_flags() & NATIVE_BF16_CPU_FLAGS)
        self.precision = resolve_precision(args.bf16, True, self.accelerator, native)
        args.bf16, args.jit_compile = self.precision.bf16, True
        logger.info("keras %s on TensorFlow %s: one %s device", _version("keras"), tf.__version__, self.accelerator)

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
        from hf_tpu_ext.backends.keras.checkpoint import find_checkpoints

        return find_checkpoints(folder)

    def checkpoint_info(self, path: str) -> CheckpointInfo:
        """Read every tensor of the checkpoint, its ``checkpoint.json`` and trainer state.

        Raises:
            CheckpointError: a file is missing, truncated or not JSON (named in the message).
        """
        from hf_tpu_ext.backends.keras import checkpoint as ckpt

        meta = ckpt.read_meta(path)
        ckpt.load_tensors(path, ckpt.MODEL_NAME)
        ckpt.load_tensors(path, ckpt.OPTIMIZER_NAME)
        step = int(meta["global_step"])
        state = ckpt.read_trainer_state(path, step)
        if state is None:  # the save was killed before the run wrote its state: not a resume point
            raise CheckpointError(f"Checkpoint {path} is incomplete: it has no {ckpt.STATE_NAME} of step {step} "
                                  "(the save was interrupted).")
        return CheckpointInfo(path=path, global_step=step, model_config=dict(meta.get("model_config") or {}),
                              trainer_state=state)

    def remove_incomplete_checkpoints(self, output_dir: str) -> List[str]:
        """Delete temporary checkpoint folders and ``checkpoint-N/`` without their trainer state (a killed save)."""
        from hf_tpu_ext.backends.keras.checkpoint import remove_incomplete

        return remove_incomplete(output_dir)

    def is_checkpoint_folder(self, folder: str) -> bool:
        from hf_tpu_ext.backends.keras.checkpoint import is_checkpoint_folder

        return is_checkpoint_folder(folder)

    def checkpoint_state_file(self, path: str) -> str:
        from hf_tpu_ext.backends.keras.checkpoint import STATE_NAME

        return os.path.join(path, STATE_NAME)

    def export_checkpoint(self, path: str, folder: str) -> str:
        from hf_tpu_ext.backends.keras.checkpoint import export_checkpoint_folder

        return export_checkpoint_folder(path, folder)

    # ------------------------------------------------------------------ model and data
    def build(self, model_args, data_args, training_args, tokenizer, blocks, plan: RunPlan) -> None:
        from hf_tpu_ext.backends.keras.model import build_masked_lm, load_pretrained
        from hf_tpu_ext.backends.keras.optimization import make_optimizer
        from hf_tpu_ext.backends.keras.step import (jit_eval_step, jit_train_step, make_eval_step,
                                                    make_train_step)
        from hf_tpu_ext.data.numpy_batches import NumpyMasker, TrainBatches
        from hf_tpu_ext.model_config import build_config, check_positions, dropout_overrides

        args = training_args
        self.args, self.plan, self.tokenizer = args, plan, tokenizer
        self.model_args, self.data_args = model_args, data_args
        self.accumulation = int(getattr(args, "gradient_accumulation_steps", 1) or 1)
        dtype = "mixed_bfloat16" if args.bf16 else "float32"
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
        masker = NumpyMasker.for_tokenizer(tokenizer, data_args.max_predictions_per_seq)
        self.masker = masker
        self.train_batches = TrainBatches(blocks["train"], plan.global_batch_size, args.seed, masker)
        self.eval_blocks = blocks.get("validation") if plan.has_eval else None
        if self.on_tensorflow:
            from hf_tpu_ext.backends.keras import step_tf

            self.train_step = step_tf.make_train_step(self.model, self.optimizer, self.accumulation)
            self.eval_step = step_tf.make_eval_step(self.model)
        else:
            self.train_step = jit_train_step(make_train_step(self.model, self.optimizer, int(args.seed),
                                                             self.accumulation), self.placement)
            self.eval_step = jit_eval_step(make_eval_step(self.model))
        self.model.train_function = self.train_step  # the recompile guard watches this function
        self._state_from_variables()
        self._step = 0
        report_to = getattr(args, "report_to", None) or ()
        self.summary_writer = _EventWriter(args.logging_dir) if self.is_chief and "tensorboard" in report_to else None
        from hf_tpu_ext.flops import flops_per_token

        try:
            self.flops_per_token = flops_per_token(self.config, plan.seq_length,
                                                   min(1.0, data_args.max_predictions_per_seq / plan.seq_length))
        except Exception:  # a config without the fields the count needs: no MFU
            self.flops_per_token = None
        self.context = RunContext(model_args=model_args, data_args=data_args, training_args=args,
                                  num_replicas=self.num_replicas, global_batch_size=plan.global_batch_size,
                                  seq_length=plan.seq_length, steps_per_epoch=plan.steps_per_epoch,
                                  total_steps=plan.total_steps, tokenizer=tokenizer, model_config=self.config,
                                  model=self.model, output_dir=args.output_dir, flops_per_token=self.flops_per_token,
                                  eval_dataset=None, eval_steps=None, strategy=None, checkpointer=None)

    def _state_from_variables(self) -> None:
        if self.on_tensorflow:  # the TensorFlow step updates the variables themselves
            return
        p = self.placement
        self.state = (p.put_replicated([v.value for v in self.model.trainable_variables]),
                      p.put_replicated([v.value for v in self.model.non_trainable_variables]),
                      p.put_replicated([v.value for v in self.optimizer.variables]))

    def _variables_from_state(self) -> None:
        """Write the step's state back into the Keras variables (export, callbacks reading weights)."""
        from hf_tpu_ext.backends.keras.step import state_to_host

        if self.on_tensorflow:
            return
        trainable, non_trainable, opt = state_to_host(self.state)
        for var, value in zip(self.model.trainable_variables, trainable):
            var.assign(value)
        for var, value in zip(self.model.non_trainable_variables, non_trainable):
            var.assign(value)
        for var, value in zip(self.optimizer.variables, opt):
            var.assign(value)

    # ------------------------------------------------------------------ checkpoints with a model
    def _named_state(self):
        from hf_tpu_ext.backends.keras.step import state_to_host

        if self.on_tensorflow:
            from keras import ops

            trainable, non_trainable, opt = ([ops.convert_to_numpy(v.value) for v in vs] for vs in (
                self.model.trainable_variables, self.model.non_trainable_variables, self.optimizer.variables))
        else:
            trainable, non_trainable, opt = state_to_host(self.state)
        # trainable variables by path (keras-hub names every layer); non-trainable ones (dropout seed states,
        # auto-numbered "seed_generator_N" per process) and the optimizer's by position
        model_vars = {var.path: value for var, value in zip(self.model.trainable_variables, trainable)}
        model_vars.update({f"{NON_TRAINABLE_PREFIX}{i:05d}": value for i, value in enumerate(non_trainable)})
        opt_vars = {f"{i:05d}/{var.path}": value for i, (var, value) in enumerate(zip(self.optimizer.variables, opt))}
        return model_vars, opt_vars

    def save(self, step: int) -> Optional[str]:
        """Checkpoint the state at ``step`` (process 0 writes; every process takes part in the device read)."""
        from hf_tpu_ext.backends.keras.checkpoint import MODEL_CONFIG_FIELDS, save_checkpoint

        model_vars, opt_vars = self._named_state()
        if not self.is_chief:
            return None
        plan, args = self.plan, self.args
        meta = {"epoch": step / plan.steps_per_epoch,
                "model_config": {k: getattr(self.config, k, None) for k in MODEL_CONFIG_FIELDS},
                "data": {"seed": int(args.seed), "global_batch_size": plan.global_batch_size,
                         "num_train_blocks": plan.num_train_blocks, "seq_length": plan.seq_length},
                "keras_backend": self.keras_backend, "dtype_policy": "mixed_bfloat16" if args.bf16 else "float32",
                "keras_version": _version("keras"), "keras_hub_version": _version("keras-hub")}
        return save_checkpoint(args.output_dir, step, model_vars, opt_vars, meta, keep=args.save_total_limit)

    def restore(self, path: str) -> int:
        """Load weights and optimizer state of a checkpoint; returns its global step.

        Raises:
            CheckpointError: a file is unreadable, or a variable is missing or of another shape (named).
        """
        from hf_tpu_ext.backends.keras import checkpoint as ckpt

        meta = ckpt.read_meta(path)
        model_vars = ckpt.load_tensors(path, ckpt.MODEL_NAME)
        opt_vars = ckpt.load_tensors(path, ckpt.OPTIMIZER_NAME)
        named = [(var.path, var) for var in self.model.trainable_variables] + [
            (f"{NON_TRAINABLE_PREFIX}{i:05d}", var) for i, var in enumerate(self.model.non_trainable_variables)]
        for key, var in named:
            value = model_vars.get(key)
            if value is None or tuple(value.shape) != tuple(var.shape):
                raise CheckpointError(
                    f"Checkpoint {path} does not fit the model: variable {var.path} "
                    f"{'is missing' if value is None else f'has shape {tuple(value.shape)}, the model {tuple(var.shape)}'}.")
            var.assign(value)
        ordered = [opt_vars[k] for k in sorted(opt_vars)]
        if len(ordered) != len(self.optimizer.variables) or any(
                tuple(a.shape) != tuple(v.shape) for a, v in zip(ordered, self.optimizer.variables)):
            raise CheckpointError(f"Checkpoint {path}: its optimizer state ({len(ordered)} variables) does not fit "
                                  f"--optim {self.args.optim} ({len(self.optimizer.variables)} variables).")
        for var, value in zip(self.optimizer.variables, ordered):
            var.assign(value)
        self._state_from_variables()
        self._step = int(meta["global_step"])
        self._restore_best()
        return self._step

    def _restore_best(self) -> None:
        """Resume the best-model tracking from ``checkpoints/best/`` when it belongs to the restored history (its
        step at or before the checkpoint's, the same metric); a best of a killed later segment is redone."""
        from hf_tpu_ext.args import BEST_METRICS
        from hf_tpu_ext.backends.keras import checkpoint as ckpt

        if not getattr(self.args, "load_best_model_at_end", False):
            return
        best = ckpt.read_best(self.args.output_dir, with_weights=False)
        key = BEST_METRICS[getattr(self.args, "metric_for_best_model", None) or "loss"]
        if best is not None and best["metric"] == key and 0 < best["global_step"] <= self._step:
            self._best = (best["value"], best["global_step"])
            self.best_model_checkpoint = best["folder"]

    def run_context(self):
        return self.context

    # ------------------------------------------------------------------ training
    def current_step(self) -> int:
        return int(self._step)

    def _put(self, step: int):
        from hf_tpu_ext.backends.keras.step import split_micro_batches

        if self.on_tensorflow:
            from hf_tpu_ext.backends.keras.step_tf import to_tensors

            return to_tensors(split_micro_batches(self.train_batches(step), self.accumulation))
        return self.placement.put_batch(split_micro_batches(self.train_batches(step), self.accumulation), axis=1)

    def evaluate(self) -> Dict[str, float]:
        """``eval_loss``, ``perplexity``, ``eval_accuracy`` over the validation split's full batches ({} without)."""
        if self.eval_blocks is None or (self.state is None and not self.on_tensorflow):
            return {}
        from hf_tpu_ext.data.numpy_batches import eval_batches

        loss = correct = count = 0.0
        for batch in eval_batches(self.eval_blocks, self.plan.eval_batch_size, self.args.seed, self.masker):
            if self.on_tensorflow:
                from hf_tpu_ext.backends.keras.step_tf import to_tensors

                out = self.eval_step(to_tensors(batch))
            else:
                out = self.eval_step(self.state[0], self.state[1], self.placement.put_batch(batch, axis=0))
            l, c, n = (float(x) for x in out)
            loss, correct, count = loss + l, correct + c, count + n
        if not count:
            return {}
        eval_loss = loss / count
        return {"eval_loss": eval_loss, "perplexity": float(math.exp(min(eval_loss, 700.0))),
                "eval_accuracy": correct / count}

    def fit(self, callbacks: list, on_save: SaveHook, start_step: int,
            log_history: List[Dict[str, Any]]) -> Dict[str, Any]:
        import keras

        from hf_tpu_ext import interrupts
        from hf_tpu_ext.data.numpy_batches import Prefetcher

        args, plan = self.args, self.plan
        spe, total = plan.steps_per_epoch, plan.total_steps
        step = self._step = int(start_step)
        self.log_history = log_history
        self.trainer_ran = True
        tokens_per_step = plan.global_batch_size * plan.seq_length
        cb = keras.callbacks.CallbackList(list(callbacks), add_history=False, add_progbar=False, model=self.model,
                                          epochs=max(1, math.ceil(total / spe)), steps=spe, verbose=0)
        progress = None
        if self.is_chief and not args.disable_tqdm:
            from tqdm.auto import tqdm

            progress = tqdm(total=total, initial=step, desc="train", unit="step", dynamic_ncols=True,
                            bar_format="{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed}<{remaining}{postfix}]")
        mfu_of = self._mfu_function()
        train_loss_sum, train_loss_n, window_loss, window_n = 0.0, 0, 0.0, 0
        window_times: List[float] = []
        steady: "deque[float]" = deque(maxlen=STEADY_WINDOW)
        first_step: Optional[float] = None
        tokens_per_second = None
        steps_run = 0
        logs: Dict[str, Any] = {}
        prefetch = Prefetcher(self._put, range(step, total), depth=2)
        from hf_tpu_ext.backends.keras.step import CompileCounter

        compiles = CompileCounter("train_step")
        if not self.on_tensorflow:
            compiles.__enter__()  # XLA's compilations of the step, from JAX's events
        t_start = time.perf_counter()
        cb.on_train_begin()
        if args.eval_on_start and step == 0:
            self._evaluate_and_log(0)
        try:
            epoch, epoch_started = step // spe, False
            while step < total:
                # a signal is a save: at this step boundary (after the step's logs, evaluation and scheduled
                # checkpoint) write this step's checkpoint if none was, then stop with KeyboardInterrupt
                self._stop_if_signalled(step, int(start_step), on_save)
                if not epoch_started:
                    cb.on_epoch_begin(epoch)
                    epoch_started = True
                batch_index = step - epoch * spe
                cb.on_train_batch_begin(batch_index)
                batch = prefetch.get(step)
                t_call = time.perf_counter()
                if self.on_tensorflow:
                    loss_sum, count = self.train_step(batch)
                else:
                    self.state, loss_sum, count = self.train_step(self.state, batch, np.int32(step))
                loss = float(loss_sum) / max(float(count), 1.0)  # waits for the step
                secs = time.perf_counter() - t_call
                if first_step is None:
                    first_step = secs
                else:
                    window_times.append(secs)
                    steady.append(secs)
                if not math.isfinite(loss):
                    raise FloatingPointError(
                        f"Training loss became {loss} at global step {step + 1}; lower --learning_rate or use "
                        "--warmup_ratio. The last checkpoint in output_dir is intact.")
                prev, step = step, step + 1
                self._step = step
                steps_run += 1
                train_loss_sum += loss
                train_loss_n += 1
                window_loss += loss
                window_n += 1
                lr = self.schedule.value(step)
                logs = {"loss": loss, "learning_rate": lr, "global_step": step, "epoch": step / spe}
                if _crossed(prev, step, args.logging_steps) or step == total:
                    tokens_per_second = round(tokens_per_step / max(statistics.median(window_times or [first_step]),
                                                                    1e-9), 1)
                    entry = {"loss": round(window_loss / window_n, 6), "learning_rate": lr,
                             "epoch": round(step / spe, 4), "step": step, "tokens_per_second": tokens_per_second}
                    mfu = mfu_of(tokens_per_second)
                    if mfu is not None:
                        entry["mfu"] = round(mfu, 4)
                    self._log(entry)
                    window_loss, window_n, window_times = 0.0, 0, []
                if progress is not None:
                    progress.update(1)
                    postfix = {"loss": f"{loss:.4f}"}
                    if tokens_per_second is not None:
                        postfix["tokens/s"] = f"{tokens_per_second:,.0f}"
                    progress.set_postfix(postfix)
                # before evaluation and checkpoints: a callback's batch clock and compile watch cover the step only
                cb.on_train_batch_end(batch_index, logs)
                at_epoch_end = step % spe == 0 or step == total
                if args.eval_strategy == "steps" and _crossed(prev, step, args.eval_steps):
                    logs.update(self._evaluate_and_log(step))
                if args.save_strategy == "steps" and _crossed(prev, step, args.save_steps):
                    self._save(step, on_save)
                if at_epoch_end:
                    if args.eval_strategy == "epoch" and "eval_loss" not in logs:
                        logs.update(self._evaluate_and_log(step))
                    if args.save_strategy == "epoch":
                        self._save(step, on_save)
                    cb.on_epoch_end(epoch, dict(logs))
                    epoch, epoch_started = epoch + 1, False
                if getattr(self.model, "stop_training", False):
                    break
        finally:
            if not self.on_tensorflow:
                compiles.__exit__(None, None, None)
            prefetch.close()
            if progress is not None:
                progress.close()
        self._stop_if_signalled(step, int(start_step), on_save)
        runtime = time.perf_counter() - t_start
        self.callbacks = cb
        if getattr(self, "_saved_step", None) != step:
            self._save(step, on_save)  # the final checkpoint: a finished run can be extended and pushed
        self._variables_from_state()
        if getattr(args, "load_best_model_at_end", False):
            self._load_best()
        self.final_logs = logs
        steady_rate = tokens_per_step / max(statistics.median(steady or [first_step]), 1e-9) if first_step else 0.0
        return {
            **mfu_of.summary(steady_rate),
            "train_loss": train_loss_sum / max(train_loss_n, 1),
            "train_runtime": runtime,
            "train_steps_per_second": steps_run / max(runtime, 1e-9),
            "train_samples_per_second": steps_run * plan.global_batch_size / max(runtime, 1e-9),
            "train_tokens_per_second": steps_run * tokens_per_step / max(runtime, 1e-9),
            # tokens per median training step (the figure the log lines show); train_*_per_second above are the
            # segment's wall-time rates (transformers' meaning)
            "steady_tokens_per_second": steady_rate,
            "first_step_seconds": first_step,
            "global_step": step,
            "epoch": step / spe,
            "tokens_seen": step * tokens_per_step,
            # XLA compilations of the train step in this segment (JAX's compile events; 1 = compiled once)
            "xla_step_compilations": (int(self.train_step.experimental_get_tracing_count()) if self.on_tensorflow
                                      else compiles.count),
            "xla_step_compile_seconds": round(compiles.seconds, 3),
        }

    def _save(self, step: int, on_save: SaveHook) -> None:
        from hf_tpu_ext import interrupts

        path = self.save(step)
        self._saved_step = step
        if path is not None:
            logger.info("saved checkpoint %s", path)
            interrupts.kill_for_test("checkpoint_weights", step)  # weights written, trainer state not yet
            on_save(step, path)

    def _stop_if_signalled(self, step: int, start_step: int, on_save: SaveHook) -> None:
        """After a SIGINT/SIGTERM (:func:`hf_tpu_ext.interrupts.received`): checkpoint ``step`` unless it is saved
        or nothing was trained, then raise ``KeyboardInterrupt`` (:func:`hf_tpu_ext.interrupts.check`)."""
        from hf_tpu_ext import interrupts

        if interrupts.received() is None:
            return
        if step > start_step and getattr(self, "_saved_step", None) != step:
            logger.info("signal received: saving step %d before stopping", step)
            self._save(step, on_save)
        interrupts.check()

    def _evaluate_and_log(self, step: int) -> Dict[str, float]:
        metrics = self.evaluate()
        if metrics:
            self._log(dict(metrics, epoch=round(step / self.plan.steps_per_epoch, 4), step=step))
            self._track_best(metrics, step)
        return metrics

    def _log(self, entry: Dict[str, Any]) -> None:
        self.log_history.append(entry)
        if self.is_chief:
            logger.info(_format_entry(entry))
        if self.summary_writer is not None:
            self.summary_writer.scalars(entry)

    def _mfu_function(self):
        """``mfu_of(tokens_per_second) -> fraction or None`` with ``mfu_of.summary(rate)``, as the TensorFlow
        backend: FLOPs per token of :func:`hf_tpu_ext.flops.flops_per_token` (LM head at the masked positions),
        the peak of one device from :func:`hf_tpu_ext.flops.device_peak` (datasheet, or the CPU formula)."""
        from hf_tpu_ext.flops import above_peak_message, compute_mfu, device_peak

        fpt = self.flops_per_token
        kind = "CPU" if self.accelerator == "CPU" else self.device_kind
        peak = device_peak(kind, "bfloat16" if self.args.bf16 is True else "float32")
        note = {"why": None if fpt else "MFU left out: no FLOP count for this model config"}
        if note["why"] is None and not peak.flops:
            note["why"] = f"MFU left out: {peak.source}"
        if self.is_chief:
            if note["why"]:
                logger.info("%s.", note["why"])
            else:
                logger.info("MFU against the peak %.3g FLOP/s per device (%s).", peak.flops, peak.source)

        def mfu_of(tokens_per_second):
            if note["why"] is not None:
                return None
            value = compute_mfu(tokens_per_second / self.num_replicas, fpt, peak.flops)
            if value is None:  # above the peak: said once, left out from then on
                note["why"] = above_peak_message(tokens_per_second / self.num_replicas, fpt, peak)
                if self.is_chief:
                    logger.warning("%s.", note["why"])
            return value

        def summary(steady_tokens_per_second):
            """``mfu``, ``mfu_peak_flops``, ``mfu_peak_source`` of the steady rate; or ``mfu_note`` (why none)."""
            value = mfu_of(steady_tokens_per_second) if steady_tokens_per_second else None
            if value is None:
                return {"mfu_note": note["why"] or "MFU left out: no training steps were timed"}
            return {"mfu": value, "mfu_peak_flops": peak.flops, "mfu_peak_source": peak.source}

        mfu_of.summary = summary
        return mfu_of

    # ------------------------------------------------------------------ best model (load_best_model_at_end)
    def _track_best(self, metrics: Dict[str, float], step: int) -> None:
        from hf_tpu_ext.args import BEST_METRICS

        args = self.args
        if not getattr(args, "load_best_model_at_end", False) or step <= 0:
            return
        key = BEST_METRICS[getattr(args, "metric_for_best_model", None) or "loss"]
        greater = bool(getattr(args, "greater_is_better", None)) and key != "eval_loss"
        value = metrics.get(key)
        if value is None or not math.isfinite(value):
            return
        best = getattr(self, "_best", None)
        if best is None or (value > best[0] if greater else value < best[0]):
            from hf_tpu_ext.backends.keras import checkpoint as ckpt

            if self.is_chief:  # on disk, not in memory: a killed run's best survives into the resumed one
                if self.on_tensorflow:
                    from keras import ops

                    weights = [ops.convert_to_numpy(v.value) for v in self.model.trainable_variables]
                else:
                    import jax

                    weights = [np.asarray(x) for x in jax.device_get(self.state[0])]
                ckpt.save_best(self.args.output_dir, step, key, float(value),
                               {var.path: w for var, w in zip(self.model.trainable_variables, weights)})
                logger.info("new best %s=%.4g at step %d: weights kept in %s", key, value, step,
                            os.path.join(self.args.output_dir, ckpt.BEST_DIRNAME))
            self._best = (float(value), step)
            self.best_model_checkpoint = os.path.join(self.args.output_dir, ckpt.BEST_DIRNAME)

    def _load_best(self) -> None:
        from hf_tpu_ext.backends.keras import checkpoint as ckpt

        best = getattr(self, "_best", None)
        if best is None:
            logger.warning("load_best_model_at_end: no evaluation after step 0; the final weights are exported.")
            return
        if not self.is_chief:  # only the chief exports (and only it wrote the file)
            return
        kept = ckpt.read_best(self.args.output_dir)
        if kept is None or kept["global_step"] != best[1]:
            logger.warning("load_best_model_at_end: the best weights of step %d are gone from %s; the final weights "
                           "are exported.", best[1], os.path.join(self.args.output_dir, ckpt.BEST_DIRNAME))
            return
        for var in self.model.trainable_variables:
            var.assign(kept["weights"][var.path])
        self.loaded_best = True
        logger.info("loaded the best model of step %d (load_best_model_at_end)", best[1])

    def end_training(self, logs: Dict[str, Any]) -> None:
        cb = getattr(self, "callbacks", None)
        if cb is not None:
            cb.on_train_end(logs or {})

    # ------------------------------------------------------------------ export and summary
    def export(self, folder: str, tokenizer) -> List[str]:
        """``config.json``, ``model.safetensors`` (transformers' RoBERTa names, ``format: pt``), the tokenizer (and
        the keras-hub preset) through :mod:`hf_tpu_ext.backends.keras.export`."""
        if self.state is not None and not self.loaded_best:
            self._variables_from_state()
        from hf_tpu_ext.backends.keras.export import export_masked_lm

        return export_masked_lm(self.model, folder, tokenizer=tokenizer, config=self.config)

    def model_config(self):
        return self.config

    def model_summary(self) -> Dict[str, Any]:
        from hf_tpu_ext.backends.keras.model import count_parameters
        from hf_tpu_ext.backends.keras.optimization import optimizer_description
        from hf_tpu_ext.model_config import model_summary_fields

        return {**model_summary_fields(self.config, count_parameters(self.model)),
                "optimizer": optimizer_description(self.args), "jit_compile": True, "steps_per_execution": 1,
                "compiler": ("XLA (Keras 3 on TensorFlow), whole step in one program" if self.on_tensorflow
                             else "XLA (JAX), whole step in one program")}


_format_entry = format_log_entry  # the TensorFlow backend's wording (hf_tpu_ext.outputs)


def _version(dist: str) -> str:
    from importlib import metadata

    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "?"


class _EventWriter:
    """TensorBoard scalars without TensorFlow (the ``tensorboard`` package's event-file writer)."""

    def __init__(self, logdir: str):
        from tensorboard.summary.writer.event_file_writer import EventFileWriter

        self._writer = EventFileWriter(logdir)

    def scalars(self, entry: Dict[str, Any]) -> None:
        from tensorboard.compat.proto import event_pb2, summary_pb2

        values = [summary_pb2.Summary.Value(
            tag=("train/" if not k.startswith("eval") and k != "perplexity" else "eval/") + k, simple_value=float(v))
            for k, v in entry.items() if k not in ("step", "epoch") and isinstance(v, (int, float))]
        self._writer.add_event(event_pb2.Event(wall_time=time.time(), step=int(entry["step"]),
                                               summary=summary_pb2.Summary(value=values)))
        self._writer.flush()
