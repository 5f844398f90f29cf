"""What a callback's ``from_run(run)`` may read about the run it is built for: one :class:`RunContext`.

Every backend fills one (``Backend.run_context()``); a field a backend has no value for keeps its default
(None, 0 or ""), so a callback reads the same names whatever the backend. No framework is imported here: the
callbacks layer reads it without importing a backend.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional


@dataclasses.dataclass
class RunContext:
    """The run as a callback sees it.

    Attributes:
        model_args, data_args, training_args: the run's argument dataclasses (:mod:`hf_tpu_ext.args`).
        num_replicas: data-parallel replicas (devices); global_batch_size: sequences per optimizer step.
        seq_length: tokens per sequence; steps_per_epoch, total_steps: in global optimizer steps.
        tokenizer: the run's tokenizer; model_config: the model's ``PretrainedConfig`` (or the Keras model's
            config); model: the framework model; output_dir: the run's output folder.
        eval_dataset: the evaluation data (TF: a ``tf.data.Dataset`` of global batches; torch: a dataset), or
            None; eval_steps: batches in it (TF), or None; eval_collator: the torch collator, or None.
        strategy: the ``tf.distribute`` strategy (TF), or None; strategy_info: the backend's device facts
            (``device_kind``, ...: TF ``StrategyInfo``, torch_xla device info), or None; checkpointer: the TF
            ``TrainingCheckpointer``, or None.
        max_predictions: masked positions per sequence (``max_predictions_per_seq``).
        flops_per_token: training FLOPs per token (:func:`hf_tpu_ext.flops.flops_per_token`), or None.
        logs_throughput: the backend's own loop logs tokens/s at each logging step (the throughput callback
            then logs no line of its own).
        precision: the backend's :class:`hf_tpu_ext.precision.PrecisionPlan` (``--bf16 auto`` resolved once, in
            its setup; the arguments keep what the user asked), or None outside a backend.
    """

    model_args: Any = None
    data_args: Any = None
    training_args: Any = None
    num_replicas: int = 1
    global_batch_size: int = 0
    seq_length: int = 0
    steps_per_epoch: int = 0
    total_steps: int = 0
    tokenizer: Any = None
    model_config: Any = None
    model: Any = None
    output_dir: str = ""
    eval_dataset: Any = None
    eval_steps: Optional[int] = None
    eval_collator: Any = None
    strategy: Any = None
    strategy_info: Any = None
    checkpointer: Any = None
    max_predictions: int = 1
    flops_per_token: Optional[float] = None
    logs_throughput: bool = True
    precision: Any = None

    @property
    def compute_dtype(self) -> str:
        """``"bfloat16"`` when the run computes in bf16 (the precision plan's decision; without a plan, an explicit
        ``--bf16 true``), else ``"float32"``: the dtype a device's peak FLOP/s is read for."""
        if self.precision is not None:
            return "bfloat16" if self.precision.bf16 else "float32"
        return "bfloat16" if getattr(self.training_args, "bf16", None) is True else "float32"

    @property
    def device_info(self) -> Any:
        """The torch_xla name of :attr:`strategy_info` (its device facts)."""
        return self.strategy_info
