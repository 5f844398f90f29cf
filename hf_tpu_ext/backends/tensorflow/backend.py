"""The TensorFlow backend behind :class:`hf_tpu_ext.backends.base.Backend`: strategy, model, loop, checkpoints.

It builds the model and optimizer under the strategy, drives :class:`~hf_tpu_ext.backends.tensorflow.trainer.TFTrainer`
and reads/writes ``tf.train`` checkpoints. It writes no run file (the training run does) and talks to no Hub.
"""

from __future__ import annotations

import json
import logging
import os
import re
import tempfile
from typing import Any, Dict, List, Union

from hf_tpu_ext.backends.base import BackendDefaults, CheckpointInfo, RunPlan, SaveHook
from hf_tpu_ext.backends.tensorflow import fusion
from hf_tpu_ext.backends.trackio_log import init_trackio
from hf_tpu_ext.errors import CheckpointError, IncompleteCheckpointError
from hf_tpu_ext.precision import has_native_bf16, resolve_precision
from hf_tpu_ext.run_context import RunContext

# the modules that import TensorFlow (strategy, checkpoint, model, trainer, data.pipeline, metrics.masked_lm_tf) are
# imported inside the methods: the registry makes this backend, and the run checks it, before TensorFlow may load

logger = logging.getLogger("hf_tpu_ext")

_INDEX_RE = re.compile(r"^ckpt-(\d+)\.index$")
#: the run's trainer state saved with each checkpoint: ``ckpt-N.trainer_state.json`` next to ``ckpt-N.index``
STATE_SUFFIX = ".trainer_state.json"  # the same as backends.tensorflow.checkpoint.STATE_SUFFIX (no TF import here)


def checkpoint_state_file(path: str) -> str:
    """Where the trainer state of checkpoint prefix ``path`` (``.../ckpt-N``) is kept."""
    return path + STATE_SUFFIX


def _precision_plan(args, accelerator: str, elementwise_fusion: bool):
    """:func:`hf_tpu_ext.precision.resolve_precision` for this machine (GPU details read only on a GPU)."""
    return resolve_precision(args.bf16, args.jit_compile, accelerator, has_native_bf16(accelerator),
                             elementwise_fusion=elementwise_fusion)


class TensorFlowBackend(BackendDefaults):
    """``--backend tensorflow``: ``tf.distribute`` strategy, tf_keras model, the XLA training loop."""

    name = "tensorflow"
    callback_kind = "tf_keras"
    supports_tfrecord = True

    def __init__(self):
        self.info = None
        self.num_replicas = 1
        self.is_chief = True
        self.needs_remote_data = False
        self.trainer = None
        self.model = None
        self.checkpointer = None
        self.loaded_best = False

    # ------------------------------------------------------------------ devices
    def setup(self, training_args) -> None:
        from hf_tpu_ext.backends.tensorflow.strategy import configure_host_memory, resolve_strategy

        args = training_args
        host_memory = configure_host_memory()  # before TensorFlow's first allocation
        fusion_setup = fusion.prepare()  # before TensorFlow initializes its devices (it reads TF_XLA_FLAGS then)
        self.info = resolve_strategy(args.tpu_name, args.tpu_zone, args.gcp_project)
        self.num_replicas = self.info.strategy.num_replicas_in_sync
        self.is_chief = self.info.is_chief
        self.needs_remote_data = bool(self.info.is_tpu_node)
        self.precision = _precision_plan(args, self.info.accelerator, fusion_setup.ready)
        self.compiler_note = fusion_setup.compiler_note
        if not fusion_setup.ready and _precision_plan(args, self.info.accelerator, True).fuse_elementwise:
            logger.info(fusion_setup.not_fused_message())
        logger.info("strategy %s: %d replica(s) on %d %s device(s); host memory: %s", self.info.strategy_name,
                    self.num_replicas, self.info.num_devices, self.info.accelerator,
                    ", ".join(k for k, v in host_memory.items() if v) or "defaults")

    def device_summary(self) -> Dict[str, Any]:
        info = self.info
        return {"accelerator": info.accelerator, "num_devices": info.num_devices, "strategy": info.strategy_name,
                "num_replicas": info.num_replicas, "num_workers": info.num_workers}

    # ------------------------------------------------------------------ checkpoints (no model needed)
    def find_checkpoints(self, folder: str) -> List[str]:
        """``ckpt-N`` prefixes in ``folder/checkpoints``, ``folder/last-checkpoint`` and ``folder``, newest first."""
        import tensorflow as tf

        from hf_tpu_ext.backends.tensorflow.checkpoint import CHECKPOINTS_DIRNAME, LAST_CHECKPOINT_DIRNAME

        if re.search(r"ckpt-\d+(\.index)?$", folder):
            return [folder[: -len(".index")] if folder.endswith(".index") else folder]
        found = []
        for sub in (os.path.join(folder, CHECKPOINTS_DIRNAME), os.path.join(folder, LAST_CHECKPOINT_DIRNAME), folder):
            if not tf.io.gfile.isdir(sub):
                continue
            steps = sorted((int(m.group(1)) for m in (_INDEX_RE.match(n) for n in tf.io.gfile.listdir(sub)) if m),
                           reverse=True)
            found.extend(os.path.join(sub, f"ckpt-{s}") for s in steps)
            if found:
                break
        return found

    def checkpoint_info(self, path: str) -> CheckpointInfo:
        """Verify that every tensor of the checkpoint reads back, and read its sidecar and trainer state.

        Raises:
            CheckpointError: a file of the checkpoint is missing, truncated or not JSON (the message names it).
        """
        import tensorflow as tf

        from hf_tpu_ext.backends.tensorflow.checkpoint import is_complete, read_sidecar

        if tf.io.gfile.exists(path + ".index") and not is_complete(path):
            raise IncompleteCheckpointError(
                f"Checkpoint {path} is incomplete: its sidecar names {os.path.basename(path)}{STATE_SUFFIX}, which is "
                "missing or of another step (the save was stopped half-way); the next run in this folder removes it.")
        try:
            reader = tf.train.load_checkpoint(path)
            for name in reader.get_variable_to_shape_map():
                reader.get_tensor(name)
        except Exception as err:  # OpError, IndexError, ... from a truncated/garbled file
            data = [n for n in tf.io.gfile.glob(path + ".*") if ".data-" in n or n.endswith(".index")]
            raise CheckpointError(
                f"Checkpoint {path} cannot be read ({type(err).__name__}: {str(err).splitlines()[0][:200] if str(err) else ''}); "
                f"its files: {', '.join(sorted(os.path.basename(d) for d in data)) or 'none'}."
            ) from None
        sidecar = read_sidecar(path) or {}
        state = None
        for candidate in (checkpoint_state_file(path), os.path.join(os.path.dirname(path), "trainer_state.json")):
            if tf.io.gfile.exists(candidate):
                try:
                    with tf.io.gfile.GFile(candidate, "r") as f:
                        state = json.loads(f.read())
                except json.JSONDecodeError as err:
                    raise CheckpointError(f"{candidate} is not valid JSON ({err}); delete the checkpoint.") from None
                if int(state.get("global_step", -1)) == int(path.rsplit("-", 1)[1]):
                    break
                state = None
        step = int(sidecar.get("global_step", path.rsplit("-", 1)[1]))
        return CheckpointInfo(path=path, global_step=step, model_config=dict(sidecar.get("model_config") or {}),
                              trainer_state=state)

    def is_checkpoint_folder(self, folder: str) -> bool:
        return os.path.isdir(folder) and any(n.endswith(".index") for n in os.listdir(folder))

    def remove_incomplete_checkpoints(self, output_dir: str) -> List[str]:
        """Delete what a killed save or export left: incomplete ``checkpoints/ckpt-N.*``, ``ckpt-N_temp/``, and
        the temp files of atomic writes (``.tf_model.h5.*.tmp``, ``.model.safetensors.*.tmp``) in ``output_dir``.

        Returns:
            The paths removed, relative to ``output_dir``.
        """
        import tensorflow as tf

        from hf_tpu_ext.backends.tensorflow.checkpoint import CHECKPOINTS_DIRNAME, remove_incomplete

        removed = [os.path.join(CHECKPOINTS_DIRNAME, n)
                   for n in remove_incomplete(os.path.join(output_dir, CHECKPOINTS_DIRNAME))]
        if tf.io.gfile.isdir(output_dir) and "://" not in output_dir:
            for n in os.listdir(output_dir):  # fileio.atomic_write's temp names: "." + name + ".<random>.tmp"
                if n.startswith(".") and n.endswith(".tmp") and os.path.isfile(os.path.join(output_dir, n)):
                    os.remove(os.path.join(output_dir, n))
                    removed.append(n)
        return removed

    def checkpoint_state_file(self, path: str) -> str:
        return checkpoint_state_file(path)

    def checkpoint_files(self, path: str, with_state: bool = False) -> Dict[str, Union[str, bytes]]:
        """``ckpt-N.*`` files, a ``checkpoint`` state file and ``trainer_state.json`` (see
        :func:`hf_tpu_ext.backends.tensorflow.checkpoint.checkpoint_files`; a save hands its own to ``on_save``)."""
        from hf_tpu_ext.backends.tensorflow.checkpoint import checkpoint_files

        return checkpoint_files(path, with_state)

    # ------------------------------------------------------------------ model and training
    def build(self, model_args, data_args, training_args, tokenizer, blocks, plan: RunPlan) -> None:
        import numpy as np
        import tensorflow as tf
        import tf_keras

        from hf_tpu_ext.backends.tensorflow.checkpoint import TrainingCheckpointer
        from hf_tpu_ext.backends.tensorflow.model import build_model
        from hf_tpu_ext.backends.tensorflow.trainer import make_optimizer
        from hf_tpu_ext.data.masking import make_mask_fn
        from hf_tpu_ext.data.pipeline import make_eval_dataset, make_train_dataset

        args, info = training_args, self.info
        self.args, self.plan, self.tokenizer = args, plan, tokenizer
        self.model_args, self.data_args = model_args, data_args
        strategy = info.strategy
        L = plan.seq_length
        # bf16: bfloat16 compute, float32 variables (so checkpoints and the export stay float32); the loss's
        # softmax runs on float32 logits (model.masked_lm_sums)
        tf_keras.mixed_precision.set_global_policy(self.precision.keras_policy)  # decided once, in setup
        with strategy.scope():
            self.model = build_model(model_args, tokenizer, L, seed=args.seed)
            self.optimizer, self.schedule = make_optimizer(args, plan.total_steps)
            # non-chief workers of MultiWorkerMirroredStrategy save too (collective), into a throw-away folder
            folder = args.output_dir if info.is_chief else tempfile.mkdtemp(prefix="hf-tpu-worker-")
            self.checkpointer = TrainingCheckpointer(self.model, self.optimizer, os.path.join(folder, "checkpoints"),
                                                     max_to_keep=args.save_total_limit)
        mask_fn = make_mask_fn(tokenizer, data_args.max_predictions_per_seq, data_args.mlm_probability)
        train = blocks["train"]

        def make_train(start):
            source, kwargs = (train, {}) if isinstance(train, np.ndarray) else (train[0], {"num_blocks": plan.num_train_blocks})
            return make_train_dataset(source, global_batch_size=plan.global_batch_size, seed=args.seed,
                                      start_step=start, mask_fn=mask_fn, **kwargs)

        self.make_train = make_train
        self.eval_ds, self.eval_steps = None, None
        if plan.has_eval:
            val = blocks["validation"]
            source, kwargs = (val, {}) if isinstance(val, np.ndarray) else (val[0], {"num_blocks": val[1]})
            self.eval_ds, self.eval_steps = make_eval_dataset(source, global_batch_size=plan.eval_batch_size,
                                                              seed=args.seed, mask_fn=mask_fn, **kwargs)
        report_to = getattr(args, "report_to", None) or ()
        self.summary_writer = (tf.summary.create_file_writer(args.logging_dir)
                               if info.is_chief and "tensorboard" in report_to else None)
        self.trackio = init_trackio(args, model_args) if info.is_chief and "trackio" in report_to else None
        self.context = RunContext(model_args=model_args, data_args=data_args, training_args=args, strategy=strategy,
                                  precision=self.precision,
                                  strategy_info=info, num_replicas=self.num_replicas,
                                  global_batch_size=plan.global_batch_size, seq_length=L,
                                  steps_per_epoch=plan.steps_per_epoch, total_steps=plan.total_steps,
                                  eval_dataset=self.eval_ds, eval_steps=self.eval_steps, tokenizer=tokenizer,
                                  checkpointer=self.checkpointer, model_config=self.model.config, model=self.model,
                                  output_dir=args.output_dir)

    def restore(self, path: str) -> int:
        self.checkpointer.validate_compatible(path, self.model.config)
        return self.checkpointer.restore(path)

    def run_context(self):
        return self.context

    #: a first SIGINT/SIGTERM stops the loop at the next step boundary, which is saved (see backends/base.py)
    checks_interrupts = True

    def fit(self, callbacks: list, on_save: SaveHook, start_step: int, log_history: List[Dict[str, Any]]) -> Dict[str, Any]:
        from hf_tpu_ext.backends.tensorflow.trainer import TFTrainer

        plan, args = self.plan, self.args
        self.trainer = TFTrainer(self.model, self.optimizer, self.schedule, args, self.info, self.make_train,
                                 self.eval_ds, self.eval_steps, plan.steps_per_epoch, plan.total_steps,
                                 plan.seq_length, checkpointer=self.checkpointer, callbacks=callbacks,
                                 start_step=start_step, log_history=log_history, summary_writer=self.summary_writer,
                                 trackio=self.trackio, on_save=on_save,
                                 jit_compile=self.precision.jit_compile, bf16=self.precision.bf16,
                                 fuse_elementwise=self.precision.fuse_elementwise, compiler_note=self.compiler_note)
        if self.is_chief:
            # one level of parentheses at most: the compiler path may hold "(oneDNN)", the reason none
            logger.info("precision %s, compiler path: %s. Why: %s.", self.precision.precision, self.trainer.compiler_path,
                        self.precision.reason)
        if self.scores_probes:
            from hf_tpu_ext.metrics.masked_lm_tf import make_probe_scorer

            self.trainer.probe_scorer = make_probe_scorer(self.model, self.tokenizer, args.probe_file, plan.seq_length,
                                                          batch_size=max(8, args.per_device_eval_batch_size))
        try:
            # auto-clustering is read when the step's function is instantiated: during train()
            with fusion.elementwise_fusion(self.precision.fuse_elementwise):
                metrics = self.trainer.train()
        finally:
            if self.trackio is not None:
                self.trackio.finish()
        self.loaded_best = bool(self.trainer.loaded_best)
        metrics["train_function_traces"] = self.trainer.train_function.experimental_get_tracing_count()
        metrics["xla_step_traces"] = self.trainer.step_function.experimental_get_tracing_count()
        return metrics

    @property
    def scores_probes(self) -> bool:
        """``--probe_file`` with evaluations: each evaluation also scores the probe set (``probe_mrr``, ...)."""
        args = getattr(self, "args", None)
        return bool(args is not None and getattr(args, "probe_file", None) and args.eval_strategy != "no")

    def evaluate(self) -> Dict[str, float]:
        if self.trainer is not None:  # masked-LM metrics and, with --probe_file, the probe scores
            return self.trainer.evaluate()
        if self.eval_ds is None or not self.eval_steps:
            return {}
        from hf_tpu_ext.metrics.masked_lm_tf import evaluate_masked_lm

        metrics = evaluate_masked_lm(self.model, self.eval_ds, steps=self.eval_steps, strategy=self.info.strategy)
        return {k: float(v) for k, v in metrics.items() if k in ("eval_loss", "perplexity", "eval_accuracy")}

    def current_step(self) -> int:
        """Optimizer steps done so far (0 before :meth:`build`)."""
        return int(self.optimizer.iterations.numpy()) if self.model is not None else 0

    def end_training(self, logs: Dict[str, Any]) -> None:
        """Fire the callbacks' ``on_train_end`` (after the outputs are written)."""
        if self.trainer is not None:
            self.trainer.end_training(logs)

    @property
    def best_model_checkpoint(self):
        """Where the best evaluation's weights are kept (``--load_best_model_at_end``), or None."""
        return self.trainer.best_model_checkpoint if self.trainer is not None else None

    def export(self, folder: str, tokenizer) -> List[str]:
        import tensorflow as tf

        from hf_tpu_ext.backends.tensorflow.export import save_model_folder
        from hf_tpu_ext.backends.tensorflow.trainer import BEST_DIRNAME

        best = os.path.join(self.checkpointer.directory, BEST_DIRNAME, "model")
        if (self.trainer is None and getattr(self.args, "load_best_model_at_end", False)
                and tf.io.gfile.exists(best + ".index")):
            # a finished run completed after a kill: export the best weights, as the uninterrupted run did
            tf.train.Checkpoint(model=self.model).read(best).expect_partial()
            logger.info("loaded the best model kept in %s (load_best_model_at_end)", os.path.dirname(best))
        return save_model_folder(self.model, folder, tokenizer=tokenizer)

    def model_summary(self) -> Dict[str, Any]:
        from hf_tpu_ext.backends.tensorflow.optimization import optimizer_description
        from hf_tpu_ext.backends.tensorflow.trainer import model_summary_fields

        args = self.args
        return {**model_summary_fields(self.model), "optimizer": optimizer_description(args),
                "jit_compile": self.precision.jit_compile, "precision": self.precision.precision,
                "steps_per_execution": args.steps_per_execution,
                "compiler": self.trainer.compiler_path if self.trainer is not None else None}

    def model_config(self):
        return self.model.config
