"""The TensorFlow backend's compiled step behind the shared loop: XLA per-replica step, cross-replica update.

The loop itself (cadence, logging window, best model, signal save, final checkpoint, results) is
:class:`hf_tpu_ext.backends.loop.StepLoop`; :class:`TFTrainer` is its :class:`~hf_tpu_ext.backends.loop.StepBackend`
(``train_function`` of ``--steps_per_execution`` steps, evaluation, ``tf.train`` checkpoints, the best weights).

Why not ``model.fit(jit_compile=True)``: under ``MirroredStrategy`` XLA cannot compile the cross-replica
update (variables live on other devices). With several replicas only the per-replica forward/backward is
XLA-compiled (``jit_compile=True``); the all-reduce, clipping and optimizer update run outside it. On one
device (``OneDeviceStrategy``) the whole step (forward, backward, clipping, AdamW) is one XLA program. Under XLA, dropout masks
come from :mod:`hf_tpu_ext.backends.tensorflow.dropout` (counter-based, keyed by seed, step and replica).
The loop still drives standard ``tf_keras`` callbacks (``CallbackList``), so every Keras callback works
unchanged and reads the global step from ``model.optimizer.iterations``.

Loss normalization: each replica returns the summed masked-token loss and the gradient of
``loss_sum / global_num_masked`` (the count all-reduced first), so N replicas x B and 1 device x N*B give
the same update.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
from types import SimpleNamespace
from typing import Any, Dict, List, Optional

import numpy as np
import tensorflow as tf
import tf_keras

from hf_tpu_ext import interrupts
from hf_tpu_ext.backends.loop import StepLoop, Unbuffered, format_entry, restored_loss_window
from hf_tpu_ext.backends.tensorflow import optimization
from hf_tpu_ext.backends.tensorflow.checkpoint import checkpoint_files
from hf_tpu_ext.backends.tensorflow.dropout import counter_based_dropout, dropout_key
from hf_tpu_ext.backends.tensorflow.model import count_parameters, masked_lm_sums
from hf_tpu_ext.best_metric import BestMetric, BestTracker
from hf_tpu_ext.distributed import DistributedType
from hf_tpu_ext.flops import default_device_kind, flops_per_token
from hf_tpu_ext.metrics.masked_lm_tf import evaluate_masked_lm
from hf_tpu_ext.mfu import MFUMeter, make_mfu_meter
from hf_tpu_ext.model_config import model_summary_fields as fields
from hf_tpu_ext.precision import FUSED_COMPILER_SUFFIX

logger = logging.getLogger("hf_tpu_ext")

BEST_DIRNAME = "best"  # checkpoints/best/: weights of the best evaluation (load_best_model_at_end)


def read_best_sidecar(prefix: str) -> Optional[dict]:
    """``{"global_step", "metric", "value"}`` of the best-model weights at ``prefix``, or None."""
    path = prefix + ".json"
    if not tf.io.gfile.exists(path):
        return None
    with tf.io.gfile.GFile(path) as f:
        return json.loads(f.read())


class TFTrainer:
    """Trains a masked LM built under ``strategy_info.strategy`` on global batches from ``make_dataset``.

    Args:
        model: a TF masked LM created under the strategy's scope.
        optimizer: a ``tf_keras`` optimizer created under the strategy's scope.
        lr_schedule: callable step -> learning rate (for logging).
        training_args: :class:`hf_tpu_ext.args.TrainingArguments`.
        strategy_info: :class:`hf_tpu_ext.backends.tensorflow.strategy.StrategyInfo`.
        make_train_dataset: ``start_step -> tf.data.Dataset`` of global batches (infinite).
        eval_dataset: finite dataset of global eval batches, or None.
        eval_steps: number of batches in ``eval_dataset``.
        steps_per_epoch, total_steps: in global optimizer steps.
        seq_length: tokens per sequence.
        checkpointer: a ``TrainingCheckpointer`` (None: no checkpoints).
        callbacks: ``tf_keras`` callbacks driven by the loop.
        summary_writer: TensorBoard writer of ``--report_to tensorboard`` (None: no event files).
        trackio: the ``trackio`` module, initialised, for ``--report_to trackio`` (None: not used).
        log_history: list the log entries are appended to (kept, not copied).
        on_save: ``on_save(global_step, checkpoint_prefix, files)`` after every checkpoint (all processes; ``files``:
            what a push of it takes, on the chief).
        jit_compile, bf16: the run's :class:`hf_tpu_ext.precision.PrecisionPlan` decisions (the XLA step or
            TensorFlow's kernels; bf16 compute, also the MFU peak's dtype).
        fuse_elementwise: on TensorFlow's kernels (``jit_compile`` false), the run fuses the element-wise ops
            between them with XLA (:mod:`hf_tpu_ext.backends.tensorflow.fusion`; the caller switches it on around
            :meth:`train`): dropout then takes the XLA step's counter-based masks, which fuse too.
        compiler_note: added to the compiler path of a step on TensorFlow's kernels that is not fused
            (:func:`hf_tpu_ext.backends.tensorflow.fusion.compiler_note`: the user's own auto-clustering).
    """

    def __init__(self, model, optimizer, lr_schedule, training_args, strategy_info, make_train_dataset,
                 eval_dataset, eval_steps, steps_per_epoch, total_steps, seq_length, checkpointer=None,
                 callbacks=(), start_step: int = 0, log_history=None, summary_writer=None, trackio=None,
                 on_save=None, jit_compile: bool = True, bf16: bool = False, fuse_elementwise: bool = False,
                 compiler_note: str = ""):
        self.model = model
        # the precision plan's decisions (--jit_compile unset and --bf16 auto resolved), not the arguments'
        self.jit_compile, self.bf16 = bool(jit_compile), bool(bf16)
        self.fuse_elementwise = bool(fuse_elementwise) and not self.jit_compile
        self.compiler_note = compiler_note
        self.optimizer = optimizer
        self.lr_schedule = lr_schedule
        self.args = training_args
        self.info = strategy_info
        self.strategy = strategy_info.strategy
        self.make_train_dataset = make_train_dataset
        self.eval_dataset = eval_dataset
        self.eval_steps = eval_steps
        self.steps_per_epoch = steps_per_epoch
        self.total_steps = total_steps
        self.seq_length = seq_length
        # sequences per optimizer step (transformers' total_train_batch_size)
        self.global_batch_size = (training_args.per_device_train_batch_size * self.strategy.num_replicas_in_sync
                                  * int(getattr(training_args, "gradient_accumulation_steps", 1) or 1))
        self.checkpointer = checkpointer
        self.start_step = start_step
        # the caller's list, appended to in place (the training run saves it with every checkpoint)
        self.log_history: List[Dict[str, Any]] = log_history if log_history is not None else []
        self.on_save = on_save
        self.summary_writer = summary_writer
        self.trackio = trackio  # the trackio module after trackio.init (--report_to trackio), or None
        # best-model tracking (transformers' metric_for_best_model / greater_is_better; eval_loss, lower is
        # better, when unset): the best so far of the restored history, then of this run's evaluations
        metric = BestMetric.from_args(training_args)
        self.best = BestTracker(metric, *metric.best_of(self.log_history))
        self.best_model_checkpoint: Optional[str] = None
        self.loaded_best = False
        if self.best.step is not None and checkpointer is not None:
            side = read_best_sidecar(self._best_prefix())
            if side and side.get("global_step") == self.best.step:
                self.best_model_checkpoint = self._best_prefix()
        self.probe_scorer = None  # () -> dict of probe metrics, set by the run when --probe_file is given
        # Keras callbacks read model.optimizer (global step) and model.train_function (recompile guard)
        model.optimizer = optimizer
        # slots exist before the first trace, so the train function is traced (and compiled) exactly once
        with self.strategy.scope():
            optimizer._create_all_weights(model.trainable_variables)
        self.callbacks = tf_keras.callbacks.CallbackList(
            list(callbacks), add_history=True, add_progbar=False, model=model,
            epochs=max(1, math.ceil(total_steps / steps_per_epoch)), steps=steps_per_epoch, verbose=0,
        )
        self._build_functions()

    # ------------------------------------------------------------------ compiled functions
    def _build_functions(self, autograph: bool = False):
        """Build ``train_function`` and ``step_function``.

        ``autograph=False`` first: AutoGraph's source conversion of every layer's ``call`` was ~11 s of the
        ~20 s from the first call to the first finished step on the small preset (2 CPU cores, benchmarks/
        NOTES.md), and the step needs none of it (its loops are ``tf.while_loop``, its branches Python
        values). A model whose ``call`` branches on a tensor in Python raises
        ``OperatorNotAllowedInGraphError`` while tracing; :meth:`train` then rebuilds with ``autograph=True``.
        """
        self.autograph = autograph
        use_xla = self.jit_compile
        # one device, no cross-replica update: forward, backward, clipping and AdamW in one XLA program
        # (Mirrored/MultiWorker strategies route apply_gradients through merge_call, which XLA cannot hold)
        self.fused_update = use_xla and self.info.distributed_type == DistributedType.NO
        if not use_xla:
            self.compiler_path = "TensorFlow kernels" + (" (oneDNN)" if self.info.accelerator == "CPU" else "")
            self.compiler_path += FUSED_COMPILER_SUFFIX if self.fuse_elementwise else self.compiler_note
        else:
            self.compiler_path = ("XLA, whole step in one program" if self.fused_update
                                  else "XLA per-replica forward/backward, update outside XLA")
        replica_step = self._replica_step(self._gradients_function(use_xla), use_xla, autograph)
        self.train_function = self._make_train_function(replica_step, autograph)
        self.model.train_function = self.train_function

    def _gradients_function(self, use_xla: bool):
        """``compute_gradients(batch, global_count, step, replica_id) -> (loss_sum, count, grads)`` of one
        replica's batch (``gradient_accumulation_steps`` micro-batches), dense gradients, one per variable."""
        model, args = self.model, self.args
        seed = int(args.seed)
        accum = int(getattr(args, "gradient_accumulation_steps", 1) or 1)

        # counter-based dropout under XLA, whole step or fused element-wise ops (XLA's own RNG is slow on CPU, and
        # TensorFlow's RandomUniform was the largest unfused kernel of the fused step); TF's kernels otherwise
        counter_masks = use_xla or self.fuse_elementwise

        def micro_gradients(batch, global_count, key_step, replica_id):
            key = dropout_key(seed, key_step, replica_id) if counter_masks else None
            with counter_based_dropout(key), tf.GradientTape() as tape:
                loss_sum, _, count = masked_lm_sums(model, batch, training=True)
                loss = loss_sum / global_count
            grads = tape.gradient(loss, model.trainable_variables)
            # dense gradients: one all-reduce shape per variable, XLA/TPU friendly
            grads = [tf.convert_to_tensor(g) if g is not None else tf.zeros_like(v)
                     for g, v in zip(grads, model.trainable_variables)]
            return loss_sum, count, grads

        def compute_gradients(batch, global_count, step, replica_id):
            """Gradient of ``loss_sum / global_count`` over the whole (replica) batch of ``accum`` micro-batches.

            With ``gradient_accumulation_steps > 1`` the batch ``[accum * B, ...]`` is viewed as
            ``[accum, B, ...]`` and a ``tf.while_loop`` (inside the compiled step) sums the micro-batch
            gradients: static shapes, one program, one optimizer update. Every micro-batch divides by the count
            of the whole batch, so the sum is the gradient of one ``accum * B`` batch.
            """
            if accum == 1:
                return micro_gradients(batch, global_count, step, replica_id)

            def split(v):
                rows = v.shape[0] if v.shape[0] is not None else tf.shape(v)[0]
                return tf.reshape(v, [accum, rows // accum] + v.shape.as_list()[1:])

            micro = {k: split(v) for k, v in batch.items()}

            def body(i, loss_sum, count, grads):
                # one dropout key per micro-batch: (optimizer step, micro-batch) -> a distinct counter
                l, c, g = micro_gradients({k: v[i] for k, v in micro.items()}, global_count,
                                          step * accum + tf.cast(i, tf.int64), replica_id)
                return i + 1, loss_sum + l, count + c, [a + b for a, b in zip(grads, g)]

            zeros = [tf.zeros_like(v) for v in model.trainable_variables]
            _, loss_sum, count, grads = tf.while_loop(
                lambda i, *_: i < accum, body,
                (tf.constant(0), tf.constant(0.0, tf.float32), tf.constant(0.0, tf.float32), zeros))
            return loss_sum, count, grads

        return compute_gradients

    def _replica_step(self, compute_gradients, use_xla: bool, autograph: bool):
        """``replica_step(batch) -> (loss_sum, count)``: gradients, all-reduce, clipping and the optimizer update
        of one replica (one XLA program when :attr:`fused_update`); sets :attr:`step_function` (the compiled part)."""
        model, optimizer, args = self.model, self.optimizer, self.args

        def apply_update(grads):
            if args.max_grad_norm and args.max_grad_norm > 0:
                grads, _ = tf.clip_by_global_norm(grads, args.max_grad_norm)
            optimizer.apply_gradients(zip(grads, model.trainable_variables), experimental_aggregate_gradients=False)

        def step_inputs(ctx):
            # read outside XLA, mixed into the dropout key inside it
            return (tf.convert_to_tensor(optimizer.iterations, tf.int64),
                    tf.cast(ctx.replica_id_in_sync_group, tf.int32))

        if self.fused_update:
            @tf.function(jit_compile=True, reduce_retracing=False, autograph=autograph)
            def xla_step(batch, step, replica_id):
                global_count = tf.maximum(tf.reduce_sum(tf.cast(batch["masked_lm_weights"], tf.float32)), 1.0)
                loss_sum, count, grads = compute_gradients(batch, global_count, step, replica_id)
                apply_update(grads)
                return loss_sum, count

            def replica_step(batch):
                return xla_step(batch, *step_inputs(tf.distribute.get_replica_context()))

            self.step_function = xla_step
        else:
            forward_backward = tf.function(compute_gradients, jit_compile=use_xla, reduce_retracing=False,
                                           autograph=autograph)

            def replica_step(batch):
                ctx = tf.distribute.get_replica_context()
                local_count = tf.reduce_sum(tf.cast(batch["masked_lm_weights"], tf.float32))
                global_count = tf.maximum(ctx.all_reduce(tf.distribute.ReduceOp.SUM, local_count), 1.0)
                loss_sum, count, grads = forward_backward(batch, global_count, *step_inputs(ctx))
                apply_update(ctx.all_reduce(tf.distribute.ReduceOp.SUM, grads))
                return loss_sum, count

            self.step_function = forward_backward
        return replica_step

    def _make_train_function(self, replica_step, autograph: bool):
        """``train_function(iterator, num_steps) -> mean loss``: ``num_steps`` replica steps in one
        ``tf.function`` (a ``tf.while_loop``), the loss token-weighted over all of them."""
        strategy = self.strategy

        @tf.function(autograph=autograph)
        def train_function(iterator, num_steps):
            def body(i, total_loss, total_count):
                loss_sum, count = strategy.run(replica_step, args=(next(iterator),))
                return (i + 1, total_loss + strategy.reduce(tf.distribute.ReduceOp.SUM, loss_sum, axis=None),
                        total_count + strategy.reduce(tf.distribute.ReduceOp.SUM, count, axis=None))

            _, total_loss, total_count = tf.while_loop(
                lambda i, *_: i < num_steps, body,
                (tf.constant(0, num_steps.dtype), tf.constant(0.0, tf.float32), tf.constant(0.0, tf.float32)))
            return total_loss / tf.maximum(total_count, 1.0)

        return train_function

    def _call_train_function(self, iterator, n: int, first: bool):
        """``train_function(iterator, n)``; on the first call, a model that needs AutoGraph gets it (see
        :meth:`_build_functions`). A failed trace runs nothing, so the iterator and the weights are untouched."""
        try:
            return self.train_function(iterator, tf.constant(n, tf.int32))
        except tf.errors.OperatorNotAllowedInGraphError:
            if not first or self.autograph:
                raise
            logger.info("This model's call() needs AutoGraph (Python control flow on tensors); tracing it again "
                        "with AutoGraph (slower to start, same step).")
            self._build_functions(autograph=True)
            return self.train_function(iterator, tf.constant(n, tf.int32))

    # ------------------------------------------------------------------ evaluation
    def evaluate(self) -> Dict[str, float]:
        """Masked-LM metrics on the whole validation set: ``eval_loss``, ``perplexity``, ``eval_accuracy``; with
        a ``probe_scorer`` (``--probe_file``) also ``probe_top1``, ``probe_top5``, ``probe_mrr``, ``probe_n``."""
        metrics: Dict[str, float] = {}
        if self.eval_dataset is not None and self.eval_steps:
            found = evaluate_masked_lm(self.model, self.eval_dataset, steps=self.eval_steps, strategy=self.strategy)
            metrics = {k: float(v) for k, v in found.items() if k in ("eval_loss", "perplexity", "eval_accuracy")}
        if self.probe_scorer is not None:  # --probe_file: probe_top1, probe_top5, probe_mrr, probe_n
            metrics.update(self.probe_scorer())
        return metrics

    # ------------------------------------------------------------------ the shared loop's calls (StepBackend)
    def open_batches(self, calls):
        """The distributed dataset's iterator for every call: the train function takes its batches itself."""
        return Unbuffered(lambda start, k: self._iterator)

    def run_steps(self, iterator, start: int, k: int) -> List[float]:
        """``k`` optimizer steps in one ``train_function`` call; its token-weighted mean loss for each step."""
        loss = float(self._call_train_function(iterator, k, first=self._first_call))  # waits for the steps
        self._first_call = False
        return [loss] * k

    def learning_rate(self, step: int) -> float:
        # a NumPy step, not a Python int: see uncached_scalar (one cached tensor per step was ~1 KB per step)
        return float(self.lr_schedule(uncached_scalar(step)))

    def save(self, step: int, fields: Dict[str, Any]) -> None:
        self._save(step, fields)

    def keep_best(self, step: int, key: str, value: float) -> None:
        self._save_best(step)

    def signalled(self) -> bool:
        return interrupts.received() is not None

    def write_scalars(self, entry: Dict[str, Any]) -> None:
        if self.summary_writer is None:
            return
        with self.summary_writer.as_default():
            for k, v in entry.items():
                if k not in ("step", "epoch") and isinstance(v, (int, float)):
                    tf.summary.scalar(("train/" if not k.startswith("eval") and k != "perplexity" else "eval/") + k,
                                      np.asarray(float(v)), step=uncached_scalar(entry["step"]))
        self.summary_writer.flush()

    # ------------------------------------------------------------------ loop
    def train(self) -> Dict[str, Any]:
        """Run from ``start_step`` to ``total_steps`` (:class:`hf_tpu_ext.backends.loop.StepLoop`). Returns the
        train metrics (loss, runtime, tokens/s, MFU; see :meth:`~hf_tpu_ext.backends.loop.LoopMeter.results`).

        Raises:
            KeyboardInterrupt: after SIGINT/SIGTERM, once the step reached is checkpointed.
            FloatingPointError: a non-finite training loss.
        """
        step = self.start_step
        train_ds = self.make_train_dataset(step)
        mfu_of = self._mfu_function(train_ds.element_spec)
        self._iterator = iter(self.strategy.experimental_distribute_dataset(train_ds))
        self._first_call = True
        latest = self.checkpointer.latest if self.checkpointer is not None else None
        saved = re.search(r"-(\d+)$", latest or "")
        plan = SimpleNamespace(steps_per_epoch=self.steps_per_epoch, total_steps=self.total_steps,
                               global_batch_size=self.global_batch_size, seq_length=self.seq_length)
        # the logging window's loss sum and step count so far: a resume between two logging steps carries them
        # over from the checkpoint, so the next log entry is the mean over the same steps as without the stop
        loop = self.loop = StepLoop(
            self, self.args, plan, self.callbacks, self.log_history, step, self._restored_loss_window(step),
            mfu_of, best=self.best, saved_step=int(saved.group(1)) if saved else None, is_chief=self.info.is_chief,
            trackio=self.trackio, batch_end_after_eval=True, rate_of_first_call=True)
        step = loop.run()
        results = loop.results(step)
        loop.finish(step)  # the final checkpoint; after a signal, KeyboardInterrupt
        if getattr(self.args, "load_best_model_at_end", False):
            self.load_best_model()
        self.final_logs = loop.logs
        return results

    def end_training(self, logs: Optional[Dict[str, Any]] = None):
        """Fire ``on_train_end`` (the Hub callback pushes the final weights here); call after outputs are written."""
        self.callbacks.on_train_end(logs or {})

    def _mfu_function(self, element_spec) -> MFUMeter:
        """This run's :class:`hf_tpu_ext.mfu.MFUMeter`: ``mfu_of(tokens_per_second)`` -> fraction or None,
        ``mfu_of.summary(rate)``.

        FLOPs per token: :func:`hf_tpu_ext.flops.flops_per_token` with the LM head at the batch's
        ``masked_lm_positions`` only; peak: :func:`hf_tpu_ext.flops.device_peak` of one replica's device."""
        fpt, why = None, None
        try:
            spec = element_spec.get("masked_lm_positions") if isinstance(element_spec, dict) else None
            predictions = spec.shape[-1] if spec is not None and spec.shape.rank else None
            fraction = min(1.0, int(predictions) / self.seq_length) if predictions else None
            fpt = flops_per_token(self.model.config, self.seq_length, masked_fraction=fraction)
        except Exception as err:  # noqa: BLE001 (an unusual config: no MFU rather than no training)
            why = f"MFU left out: no FLOP count for this model config ({err})"
        # the GPU's name; a TPU's generation where the TPU VM states it (TPU_ACCELERATOR_TYPE)
        kind = _gpu_kind() if self.info.accelerator in ("GPU", "TPU") else self.info.accelerator
        replicas = self.strategy.num_replicas_in_sync  # on a CPU, --split_cpu's logical devices share its peak
        workers = int(getattr(self.info, "num_workers", 1) or 1)
        return make_mfu_meter(fpt, kind, self.bf16, replicas, self.info.is_chief, why=why,
                              cpu_devices=max(1, replicas // workers))

    # ------------------------------------------------------------------ best model
    def _best_prefix(self) -> str:
        return os.path.join(self.checkpointer.directory, BEST_DIRNAME, "model")

    def _save_best(self, step: int) -> None:
        """Model weights of the new best evaluation: ``checkpoints/best/model.*`` + ``model.json`` (every worker)."""
        if self.checkpointer is None:
            return
        prefix = self._best_prefix()
        tf.train.Checkpoint(model=self.model).write(prefix)
        with tf.io.gfile.GFile(prefix + ".json", "w") as f:
            f.write(json.dumps({"global_step": int(step), "metric": self.best.key, "value": self.best.value}) + "\n")
        self.best_model_checkpoint = prefix
        if self.info.is_chief:
            logger.info("new best %s=%.4g at step %d: weights kept in %s", self.best.key, self.best.value, step,
                        os.path.dirname(prefix))

    def load_best_model(self) -> bool:
        """Put the best evaluation's weights into the model (``load_best_model_at_end``); False when there is none.

        Called after the last checkpoint is written, so resuming still continues from the last step.
        """
        if self.best_model_checkpoint is None:
            if self.info.is_chief:
                logger.warning("load_best_model_at_end: no best checkpoint was kept (no evaluation after step 0); "
                               "the final weights are exported.")
            return False
        tf.train.Checkpoint(model=self.model).read(self.best_model_checkpoint).assert_existing_objects_matched()
        self.loaded_best = True
        if self.info.is_chief:
            logger.info("loaded the best model: %s=%.4g at step %d (load_best_model_at_end)", self.best.key,
                        self.best.value, self.best.step)
        return True

    def _restored_loss_window(self, step: int):
        """``(loss sum, steps)`` of the logging window at ``step``: from the restored checkpoint's sidecar when it
        was written at ``step``, else ``(0.0, 0)`` (a fresh run, or a checkpoint written before the window was kept)."""
        return restored_loss_window(getattr(self.checkpointer, "restored_sidecar", None), step)

    def _save(self, step: int, fields: Dict[str, Any]):
        """One checkpoint as one unit: weights + optimizer + sidecar (with the loop's logging window, ``fields``
        of :meth:`~hf_tpu_ext.backends.loop.StepLoop.checkpoint_fields`), then
        ``on_save`` (the run writes the checkpoint's trainer state: that completes it, and pushes), then the
        ``checkpoint`` state file and the rotation (see :mod:`~hf_tpu_ext.backends.tensorflow.checkpoint`)."""
        if self.checkpointer is None:
            return
        # every worker saves (MultiWorkerMirroredStrategy needs all of them); non-chiefs write to a temp dir
        path = self.checkpointer.write(step, epoch=step / self.steps_per_epoch,
                                       extra={"loss_window": fields["loss_window"]},
                                       with_state=self.on_save is not None and self.info.is_chief)
        interrupts.kill_for_test("checkpoint_weights", step)  # weights written, trainer state not yet
        if self.on_save is not None:  # the chief hands up what a push takes (remote: listed once the state is written)
            local_chief = self.info.is_chief and "://" not in path
            self.on_save(step, path, checkpoint_files(path, with_state=True) if local_chief else None)
        self.checkpointer.commit(path)
        if self.info.is_chief:
            logger.info("saved checkpoint %s", path)


def uncached_scalar(value: int) -> np.int64:
    """``value`` as a NumPy ``int64`` scalar, for an eager TensorFlow op called with a new number each time.

    Why: TensorFlow keeps the eager tensor of every distinct Python number it converts (its scalar cache, a
    process-wide map never emptied while the eager context lives), so a Python int step per call adds one
    tensor handle, its buffer and a map entry, ~1 KB, at every step for the whole run (issue 31 item 9). Only
    Python numbers (and ``numpy.float64``, a ``float``) are cached; a NumPy integer converts to the same
    tensor value, uncached.
    """
    return np.int64(value)


def _gpu_kind() -> str:
    return default_device_kind()


_format_entry = format_entry  # one wording for every backend (hf_tpu_ext.backends.loop)


def make_optimizer(training_args, total_steps: int):
    """See :func:`hf_tpu_ext.backends.tensorflow.optimization.make_optimizer` (``--optim``, ``--lr_scheduler_type``)."""
    return optimization.make_optimizer(training_args, total_steps)


def model_summary_fields(model) -> Dict[str, Any]:
    """See :func:`hf_tpu_ext.model_config.model_summary_fields` (parameters counted on the TF model)."""
    return fields(model.config, count_parameters(model))
