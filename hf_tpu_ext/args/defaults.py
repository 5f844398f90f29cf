"""Presets of ``hf-tpu train``'s arguments: the accepted choices and the defaults that differ from transformers'.

Every argument module, the backends and the Hub layer read these names (one definition each). The backend names,
the size flags and the ``--model_type`` choices are the model-type records' (:mod:`hf_tpu_ext.model_types`).
"""

# one definition each, in the records' package: BACKENDS (hf_tpu_ext.backends.BACKEND_REGISTRY has their classes),
# SIZE_OVERRIDES (model-shape flags, from scratch only), MODEL_TYPE_CHOICES (--model_type: one per record; a
# pretrained --model_name_or_path may be of more types, see hf_tpu_ext.run.checks)
from hf_tpu_ext.model_types import BACKENDS, MODEL_TYPE_CHOICES, SIZE_OVERRIDES  # noqa: F401 (re-exported)

STRATEGIES = ("no", "steps", "epoch")
HUB_STRATEGIES = ("end", "every_save", "checkpoint", "all_checkpoints")
DEFAULT_CALLBACKS = "throughput,xla_recompile_guard"
SHORT_USAGE = "%(prog)s [CONFIG.json] [--name value ...]   (every argument: %(prog)s --help)"
# transformers' SchedulerType values whose formula needs only (step, warmup, total): the ones implemented
LR_SCHEDULER_TYPES = ("linear", "cosine", "cosine_with_restarts", "polynomial", "constant", "constant_with_warmup",
                      "inverse_sqrt")
# optim names accepted -> the optimizer both backends build (see hf_tpu_ext.backends.*)
OPTIMIZERS = {
    "adamw_torch": "adamw", "adamw_torch_fused": "adamw", "adamw_torch_xla": "adamw", "adamw_tf": "adamw",
    "adamw": "adamw", "adafactor": "adafactor", "sgd": "sgd",
}
REPORT_TO = ("tensorboard", "trackio")
# metric_for_best_model -> the evaluation key compared (perplexity = exp(eval_loss): same order as the loss)
BEST_METRICS = {"loss": "eval_loss", "eval_loss": "eval_loss", "perplexity": "eval_loss",
                "eval_perplexity": "eval_loss", "accuracy": "eval_accuracy", "eval_accuracy": "eval_accuracy"}
# extensions of the data files --train_file reads (hf_tpu_ext.data.loading.SUPPORTED_EXTENSIONS, less .json: a
# lone .json argument is a config file); a positional argument with one of them was meant as --train_file
DATA_FILE_EXTENSIONS = (".txt", ".text", ".jsonl", ".csv", ".parquet")

# Defaults that differ from transformers' (TrainingArguments, run_mlm's argument classes): name -> (transformers'
# effective default, why). The README's table is generated from this (scripts/argument_reference.py); a test
# compares the first column with transformers' own dataclass defaults.
DEFAULTS_DIFFERING_FROM_TRANSFORMERS = {
    "output_dir": ("trainer_output", "a named folder: the model card and the default Hub repo take its name"),
    "do_train": (False, "`hf-tpu train` trains without `--do_train`; false (evaluation only) is refused"),
    "do_eval": (False, "unset means: evaluate when `--eval_strategy` is not `no` (transformers evaluates then too)"),
    "learning_rate": (5e-5, "pre-training a small model from scratch; 5e-5 is a fine-tuning rate"),
    "weight_decay": (0.0, "BERT/RoBERTa pre-training use 0.01"),
    "optim": ("adamw_torch_fused", "the fused AdamW kernel does not run on XLA devices; the same AdamW update"),
    "logging_steps": (500, "a short TPU run shows its loss within seconds"),
    "eval_strategy": ("no", "a pre-training run reports its validation loss; `--do_eval false` turns it off"),
    "save_strategy": ("steps", "one checkpoint per epoch; `--save_steps N` alone switches to `steps`"),
    "save_total_limit": (None, "a checkpoint holds the optimizer state (3x the model): keep the last two, not all"),
    "report_to": ("all", "TensorBoard (TensorFlow writes it without extra packages); `all` = every installed one"),
    "max_seq_length": (None, "a static block length for XLA; run_mlm's unset value is the tokenizer's maximum"),
    "bf16": (False, "unset: bfloat16 on a TPU (its native compute type), float32 elsewhere; `--bf16 auto` picks per device"),
}
