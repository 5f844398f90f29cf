"""Arguments of ``hf-tpu train``, parsed by :class:`transformers.HfArgumentParser`.

The three dataclasses reuse the field names of transformers' ``run_mlm`` example
(``ModelArguments``, ``DataTrainingArguments``) and of :class:`transformers.TrainingArguments`, so a
JSON config written for those examples mostly works here. Fields that transformers does not have are
TPU/XLA specific (``tpu_name``, ``jit_compile``, ``steps_per_execution``, ...) or hf-tpu-ext specific
(``callbacks``, ``backend``, ``hub_space_id``, ``max_predictions_per_seq``).

Example:
    >>> from hf_tpu_ext.args import parse_args
    >>> model_args, data_args, training_args = parse_args(["--output_dir", "out", "--max_steps", "10"])
    >>> training_args.per_device_train_batch_size
    8
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import sys
from dataclasses import asdict, dataclass, field, fields
from typing import List, Optional, Tuple

from hf_tpu_ext.console import resolve_backend
from hf_tpu_ext.errors import ArgumentError, check_choice

logger = logging.getLogger("hf_tpu_ext")

BACKENDS = ("tensorflow", "torch_xla", "keras")  # hf_tpu_ext.backends.BACKEND_REGISTRY has their classes
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
# from scratch, longer blocks are refused: attention memory grows with the square of the length
MAX_SCRATCH_SEQ_LENGTH = 4096
#: model-shape overrides of ModelArguments (from scratch only; a resumed checkpoint decides the ones left unset)
SIZE_OVERRIDES = ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size")
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


@dataclass
class ModelArguments:
    """Which model to train: continue from ``model_name_or_path`` or build one from a config."""

    model_name_or_path: Optional[str] = field(
        default=None,
        metadata={"help": "A model folder or Hub repo id to continue pre-training from. Leave unset to train from scratch."},
    )
    config_name: Optional[str] = field(
        default=None,
        metadata={"help": "A config folder/repo id/config.json to train from scratch (default: a small RoBERTa config)."},
    )
    tokenizer_name: Optional[str] = field(
        default=None,
        metadata={"help": "A tokenizer folder or repo id. Unset: use the model's, or train a byte-level BPE tokenizer."},
    )
    vocab_size: int = field(default=8000, metadata={"help": "Vocabulary size of the tokenizer trained when none is given."})
    hidden_size: Optional[int] = field(default=None, metadata={"help": "Override of the config's hidden size (from scratch)."})
    num_hidden_layers: Optional[int] = field(default=None, metadata={"help": "Override of the number of layers (from scratch)."})
    num_attention_heads: Optional[int] = field(default=None, metadata={"help": "Override of the number of heads (from scratch)."})
    intermediate_size: Optional[int] = field(default=None, metadata={"help": "Override of the feed-forward size (from scratch)."})
    hidden_dropout_prob: Optional[float] = field(default=None, metadata={"help": "Override of the config's dropout (0 for deterministic runs)."})
    attention_probs_dropout_prob: Optional[float] = field(default=None, metadata={"help": "Override of the config's attention dropout."})
    cache_dir: Optional[str] = field(default=None, metadata={"help": "Where Hub downloads are cached."})
    model_revision: str = field(default="main", metadata={"help": "Branch, tag or commit of model_name_or_path."})

    def __post_init__(self):
        if self.model_name_or_path and any(
            v is not None for v in (self.hidden_size, self.num_hidden_layers, self.num_attention_heads, self.intermediate_size)
        ):
            raise ArgumentError(
                "Size overrides (--hidden_size, --num_hidden_layers, --num_attention_heads, --intermediate_size) only apply "
                "when training from scratch; drop them or drop --model_name_or_path."
            )
        for name in ("hidden_dropout_prob", "attention_probs_dropout_prob"):
            if getattr(self, name) is not None:
                _check_number(name, getattr(self, name), low=0.0, high=1.0, high_open=True)
        for name in SIZE_OVERRIDES:
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise ArgumentError(f"--{name} must be >= 1, got {getattr(self, name)}.")
        if self.vocab_size < 300:
            raise ArgumentError(f"--vocab_size {self.vocab_size} is too small for a byte-level BPE (256 bytes + specials); use >= 300.")
        if self.hidden_size and self.num_attention_heads and self.hidden_size % self.num_attention_heads:
            raise ArgumentError(
                f"--hidden_size {self.hidden_size} is not a multiple of --num_attention_heads {self.num_attention_heads}."
            )


@dataclass
class DataTrainingArguments:
    """What text to train and evaluate on. With none of the data fields set, the embedded default corpus is used."""

    dataset_name: Optional[str] = field(default=None, metadata={"help": "A dataset on the Hub (datasets.load_dataset)."})
    dataset_config_name: Optional[str] = field(default=None, metadata={"help": "The dataset's configuration name."})
    text_column_name: Optional[str] = field(default=None, metadata={"help": "Column holding the text (default: 'text', else the first string column)."})
    train_file: Optional[str] = field(default=None, metadata={"help": "Training data: .txt, .json/.jsonl, .csv or .parquet, or a folder/gs:// path of TFRecord shards from `hf-tpu prepare-data`."})
    validation_file: Optional[str] = field(default=None, metadata={"help": "Validation data, same formats as --train_file."})
    validation_split_percentage: int = field(default=5, metadata={"help": "Percent of the training data held out when no validation data is given."})
    max_train_samples: Optional[int] = field(default=None, metadata={"help": "Keep the first N training blocks, N >= 1 (debugging, quick runs). Unset: all, as in run_mlm."})
    max_eval_samples: Optional[int] = field(default=None, metadata={"help": "Keep the first N validation blocks, N >= 1. Unset: all."})
    preprocessing_num_workers: Optional[int] = field(default=None, metadata={"help": "Processes for datasets.map tokenization."})
    overwrite_cache: bool = field(default=False, metadata={"help": "Recompute the datasets cache."})
    max_seq_length: int = field(default=128, metadata={"help": "Tokens per block (static sequence length)."})
    mlm_probability: float = field(default=0.15, metadata={"help": "Share of tokens masked per sequence (BERT: 0.15)."})
    max_predictions_per_seq: Optional[int] = field(
        default=None,
        metadata={"help": "Masked positions per sequence the MLM head is computed on (default: round(max_seq_length * mlm_probability), as in BERT's TPU code)."},
    )
    line_by_line: bool = field(
        default=False,
        metadata={"help": "run_mlm's one-sequence-per-line mode: not supported (texts are concatenated and cut into full blocks); only false is accepted."},
    )
    pad_to_max_length: bool = field(
        default=False,
        metadata={"help": "run_mlm's padding switch. Accepted either way: every block is max_seq_length tokens (static shapes), so nothing is padded."},
    )

    def __post_init__(self):
        _check_number("mlm_probability", self.mlm_probability, low=0.0, high=1.0, low_open=True, high_open=True)
        if self.line_by_line:
            raise ArgumentError(
                "--line_by_line true is not supported: the texts are concatenated and cut into full blocks of "
                "--max_seq_length tokens (run_mlm's default grouping), so every position is a real token and every "
                "batch has the same static shape for XLA. Drop --line_by_line (or pass --line_by_line false)."
            )
        if self.max_seq_length < 8:
            raise ArgumentError(f"--max_seq_length must be at least 8, got {self.max_seq_length}.")
        for name in ("max_train_samples", "max_eval_samples"):
            # run_mlm keeps the first min(n, len) examples and only None means all: 0 or -1 would select none
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise ArgumentError(f"--{name} must be >= 1 (leave it unset to keep every block, as in transformers' "
                                    f"run_mlm), got {getattr(self, name)}.")
        if self.preprocessing_num_workers is not None and self.preprocessing_num_workers < 1:
            raise ArgumentError(f"--preprocessing_num_workers must be >= 1, got {self.preprocessing_num_workers}.")
        if not 0 <= self.validation_split_percentage < 100:
            raise ArgumentError(f"--validation_split_percentage must be in [0, 100), got {self.validation_split_percentage}.")
        if self.dataset_name and self.train_file:
            raise ArgumentError("Give either --dataset_name or --train_file, not both.")
        if self.max_predictions_per_seq is None:
            self.max_predictions_per_seq = max(1, int(round(self.max_seq_length * self.mlm_probability)))
        if not 1 <= self.max_predictions_per_seq <= self.max_seq_length:
            raise ArgumentError(
                f"--max_predictions_per_seq must be in [1, max_seq_length={self.max_seq_length}], got {self.max_predictions_per_seq}."
            )

    @property
    def uses_default_corpus(self) -> bool:
        return not (self.dataset_name or self.train_file)


@dataclass
class TrainingArguments:
    """How to train: names and defaults follow :class:`transformers.TrainingArguments` where it has the field."""

    output_dir: str = field(default="hf-tpu-output", metadata={"help": "Where the model, checkpoints, logs and card are written."})
    overwrite_output_dir: bool = field(default=False, metadata={"help": "Allow training into a non-empty output_dir: an earlier run's checkpoints, run state and results are removed first (once the checks pass), so a resume or hf-tpu push never takes them."})
    resume_from_checkpoint: Optional[str] = field(
        default=None,
        metadata={"help": "A checkpoint folder, 'true' for the latest in output_dir, or a Hub repo id 'user/name[@revision]' holding last-checkpoint/."},
    )
    backend: Optional[str] = field(default=None, metadata={"help": f"Training backend: one of {', '.join(BACKENDS)}. Unset: keras when Keras 3 and JAX are installed, else tensorflow, else torch_xla."})
    do_train: bool = field(default=True, metadata={"help": "Train (run_mlm's flag). `hf-tpu train` always trains: false is refused."})
    do_eval: Optional[bool] = field(
        default=None,
        metadata={"help": "Evaluate on the validation split: false turns every evaluation off; true with --eval_strategy no evaluates once at the end. Unset: true unless --eval_strategy is no."},
    )
    per_device_train_batch_size: int = field(default=8, metadata={"help": "Batch size per replica for training."})
    per_device_eval_batch_size: int = field(default=8, metadata={"help": "Batch size per replica for evaluation."})
    learning_rate: float = field(default=5e-4, metadata={"help": "Peak learning rate of AdamW (after warmup)."})
    weight_decay: float = field(default=0.01, metadata={"help": "Decoupled weight decay (not applied to LayerNorm and biases)."})
    adam_beta1: float = field(default=0.9, metadata={"help": "AdamW beta1."})
    adam_beta2: float = field(default=0.999, metadata={"help": "AdamW beta2."})
    adam_epsilon: float = field(default=1e-8, metadata={"help": "AdamW epsilon."})
    max_grad_norm: float = field(default=1.0, metadata={"help": "Global gradient-norm clipping (0 disables)."})
    optim: str = field(
        default="adamw_torch",
        metadata={"help": f"Optimizer: {', '.join(OPTIMIZERS)}. Every adamw name is AdamW with decoupled weight decay (not on LayerNorm/biases); adafactor without relative steps (transformers' Trainer settings); sgd with weight decay added to the gradient (torch.optim.SGD)."},
    )
    gradient_accumulation_steps: int = field(
        default=1,
        metadata={"help": "Micro-batches summed per optimizer step (TensorFlow: inside the one compiled step, static shapes). Steps, logging and schedules count optimizer steps."},
    )
    lr_scheduler_type: str = field(
        default="linear",
        metadata={"help": f"Learning-rate schedule after warmup, transformers' formulas: {', '.join(LR_SCHEDULER_TYPES)}."},
    )
    warmup_ratio: float = field(default=0.0, metadata={"help": "Share of the total steps used for linear warmup, in [0, 1]."})
    warmup_steps: int = field(default=0, metadata={"help": "Linear warmup steps (give this or warmup_ratio, not both)."})
    num_train_epochs: float = field(default=3.0, metadata={"help": "Epochs to train (ignored when max_steps > 0)."})
    max_steps: int = field(default=-1, metadata={"help": "Total optimizer steps; > 0 overrides num_train_epochs; -1: unset (another negative is refused)."})
    logging_steps: int = field(default=10, metadata={"help": "Log the training loss every N global steps."})
    eval_strategy: str = field(default="epoch", metadata={"help": "When to evaluate: no, steps or epoch (--eval_steps N alone means steps)."})
    evaluation_strategy: Optional[str] = field(
        default=None, metadata={"help": "Deprecated spelling of --eval_strategy (transformers < 4.46); sets it."},
    )
    eval_on_start: bool = field(default=False, metadata={"help": "Evaluate once before the first step (the untrained baseline)."})
    eval_steps: Optional[int] = field(default=None, metadata={"help": "Evaluate every N global steps with eval_strategy=steps (default: logging_steps)."})
    probe_file: Optional[str] = field(
        default=None,
        metadata={"help": "Cloze probes scored at each evaluation (TensorFlow and Keras backends): lines 'The capital "
                          "of France is <mask>. => Paris', CSV or JSONL; top-1/top-5 accuracy and MRR go to the log "
                          "history (probe_top1, probe_top5, probe_mrr) and the card. Same scoring as `hf-tpu probe`."},
    )
    save_strategy: str = field(default="epoch", metadata={"help": "When to write a checkpoint: no, steps or epoch (--save_steps N alone means steps)."})
    save_steps: int = field(default=500, metadata={"help": "Checkpoint every N global steps with save_strategy=steps."})
    save_total_limit: Optional[int] = field(default=2, metadata={"help": "Checkpoints kept in output_dir (oldest removed first)."})
    save_on_signal_timeout: float = field(default=25.0, metadata={"help": "Seconds after SIGINT/SIGTERM for saving the step reached and pushing it (25: fits the 30 s preemption notice); what did not land is reported."})
    load_best_model_at_end: bool = field(
        default=False,
        metadata={"help": "Export and push the weights of the best evaluation instead of the last (needs matching eval/save strategies, as in transformers)."},
    )
    metric_for_best_model: Optional[str] = field(
        default=None,
        metadata={"help": f"Metric that picks the best model: {', '.join(BEST_METRICS)} (default with load_best_model_at_end: loss)."},
    )
    greater_is_better: Optional[bool] = field(
        default=None, metadata={"help": "Whether a larger metric_for_best_model is better (default: false for loss/perplexity, true otherwise)."},
    )
    report_to: Optional[List[str]] = field(
        default=None,
        metadata={"help": "Where logs go: tensorboard, trackio (when installed), all (every installed one) or none. Unset: tensorboard."},
    )
    seed: int = field(default=42, metadata={"help": "Seed of initialization, shuffling and masking."})
    bf16: Optional[str] = field(
        default=None,
        metadata={"help": "Mixed bfloat16 compute, float32 weights and loss: true, false or auto (bf16 where the hardware "
                          "has it natively: TPU, GPU with compute capability >= 8.0, CPU with AVX512-BF16/AMX when the step runs on "
                          "TensorFlow's kernels; an XLA:CPU step, e.g. the Keras backend's, keeps float32). "
                          "Unset: auto on a TPU, float32 elsewhere. See hf_tpu_ext/precision.py.",
                  "nargs": "?", "const": "true"},
    )
    fp16: bool = field(default=False, metadata={"help": "float16 mixed precision: refused (no float16 compute on CPU/TPU, no loss scaling in the XLA step); use --bf16."})
    jit_compile: Optional[bool] = field(
        default=None,
        metadata={"help": "XLA-compile the training step (unset: yes, except bf16 on a CPU with native bf16, "
                          "where TensorFlow's oneDNN kernels are faster). On one device the whole step (forward, "
                          "backward, AdamW) is one XLA program; with a distribution strategy, the per-replica forward/backward. "
                          "Dropout then uses counter-based masks (XLA's own RNG is slow on CPU, see benchmarks/NOTES.md)."},
    )
    steps_per_execution: int = field(default=1, metadata={"help": "Train steps run per call into the device (TPU: 50-200 hides host overhead)."})
    tpu_name: Optional[str] = field(default=None, metadata={"help": "TPU to use: a name, a grpc:// address, or 'local' on a TPU VM."})
    tpu_zone: Optional[str] = field(default=None, metadata={"help": "GCP zone of the TPU (TPU Nodes)."})
    gcp_project: Optional[str] = field(default=None, metadata={"help": "GCP project of the TPU (TPU Nodes)."})
    callbacks: str = field(default=DEFAULT_CALLBACKS, metadata={"help": "Comma-separated registered callback names (see `hf-tpu callbacks`); '' for none."})
    logging_dir: Optional[str] = field(default=None, metadata={"help": "TensorBoard folder (default: output_dir/runs)."})
    disable_tqdm: bool = field(default=False, metadata={"help": "Turn the progress bar off."})
    log_level: str = field(
        default="passive",
        metadata={"help": "Terminal output, transformers' names: passive (default) shows this package's INFO lines "
                          "without TensorFlow's C++ start-up lines and transformers' deprecation warnings; debug, "
                          "info or warning set that level and bring them back; error or critical quieten this "
                          "package too.",
                  "choices": ["passive", "debug", "info", "warning", "error", "critical"]},
    )
    push_to_hub: bool = field(default=False, metadata={"help": "Push the model and its card to the Hub while training runs."})
    hub_model_id: Optional[str] = field(default=None, metadata={"help": "Repo id 'user/name' to push to (default: the output_dir name under your account)."})
    hub_strategy: str = field(default="every_save", metadata={"help": f"What is pushed when: one of {', '.join(HUB_STRATEGIES)} (as in transformers)."})
    hub_token: Optional[str] = field(default=None, metadata={"help": "Hub token (default: HF_TOKEN or the cached login). Never printed."})
    hub_private_repo: Optional[bool] = field(default=None, metadata={"help": "Create the repo private."})
    hub_revision: Optional[str] = field(default=None, metadata={"help": "Branch to push to; unset pushes to main."})
    hub_space_id: Optional[str] = field(default=None, metadata={"help": "Deploy the fill-mask demo to this Space when training ends."})
    hub_allow_push_failure: bool = field(default=False, metadata={"help": "Exit 0 even when the final push to the Hub failed (the failure is still logged and in training_summary.json)."})
    hub_commit_budget: int = field(default=100, metadata={"help": "At most this many commits per hour to the repo (the Hub allows 128): saves beyond it are folded into the next push; the final push always goes."})
    license: Optional[str] = field(default="apache-2.0", metadata={"help": "License written in the model card."})
    language: Optional[str] = field(default="en", metadata={"help": "Language written in the model card."})

    def __post_init__(self):
        from hf_tpu_ext.precision import parse_bf16

        try:
            self.bf16 = parse_bf16(self.bf16)
        except ValueError as e:
            raise ArgumentError(str(e)) from None
        self.backend = resolve_backend(self.backend, BACKENDS)  # unset: keras, else tensorflow, else one line
        if not self.do_train:
            raise ArgumentError(
                "--do_train false (evaluation only) is not supported: `hf-tpu train` always trains. Drop --do_train; "
                "to evaluate a finished model, train 0 more steps is not possible either: use transformers' run_mlm.py "
                "--do_eval on the output folder."
            )
        if self.fp16:
            raise ArgumentError(
                "--fp16 is not supported: CPUs and TPUs have no float16 compute and the XLA training step has no loss "
                "scaling, which float16 needs. Use --bf16 true (bfloat16 mixed precision, no loss scaling needed) or "
                "--bf16 auto (bfloat16 where the hardware has it), or float32."
            )
        self._eval_strategy_as_passed = self.eval_strategy  # before the old spelling overwrites it
        if self.evaluation_strategy is not None:
            logger.warning("--evaluation_strategy is deprecated (transformers renamed it in 4.46): use --eval_strategy %s.",
                           self.evaluation_strategy)
            self.eval_strategy = self.evaluation_strategy
        # what was asked before do_eval below may turn it off (check_user_flags reports conflicts)
        self._asked_eval_strategy = self.eval_strategy
        for name, choices in (("eval_strategy", STRATEGIES), ("save_strategy", STRATEGIES), ("hub_strategy", HUB_STRATEGIES)):
            check_choice(getattr(self, name), choices, f"--{name}")
        if self.lr_scheduler_type not in LR_SCHEDULER_TYPES:
            raise ArgumentError(f"--lr_scheduler_type {self.lr_scheduler_type!r} is not supported; choose one of: "
                                f"{', '.join(LR_SCHEDULER_TYPES)}.")
        if self.optim not in OPTIMIZERS:
            raise ArgumentError(f"--optim {self.optim!r} is not supported; choose one of: {', '.join(OPTIMIZERS)}.")
        for name in ("per_device_train_batch_size", "per_device_eval_batch_size", "steps_per_execution", "logging_steps",
                     "save_steps", "gradient_accumulation_steps", "hub_commit_budget"):
            if getattr(self, name) < 1:
                raise ArgumentError(f"--{name} must be >= 1, got {getattr(self, name)}.")
        if self.eval_steps is not None and self.eval_steps < 1:
            raise ArgumentError(f"--eval_steps must be >= 1, got {self.eval_steps}.")
        # every float hyper-parameter: finite and in range, named by its flag
        _check_number("learning_rate", self.learning_rate, low=0.0, low_open=True)
        _check_number("weight_decay", self.weight_decay, low=0.0)
        _check_number("adam_beta1", self.adam_beta1, low=0.0, high=1.0, high_open=True)
        _check_number("adam_beta2", self.adam_beta2, low=0.0, high=1.0, high_open=True)
        _check_number("adam_epsilon", self.adam_epsilon, low=0.0, low_open=True)
        _check_number("max_grad_norm", self.max_grad_norm, low=0.0)
        _check_number("warmup_ratio", self.warmup_ratio, low=0.0, high=1.0)
        _check_number("num_train_epochs", self.num_train_epochs, low=0.0)
        if self.optim == "adafactor" and self.backend == "tensorflow":
            raise ArgumentError(
                "--optim adafactor is not available with --backend tensorflow: tf_keras has Adafactor only in its new "
                "optimizer API, which this trainer's XLA step and checkpoints do not use. Use --optim adamw_torch or "
                "sgd, or --backend keras or torch_xla (transformers' Adafactor)."
            )
        if self.lr_scheduler_type == "constant" and (self.warmup_steps > 0 or self.warmup_ratio > 0):
            raise ArgumentError("--lr_scheduler_type constant has no warmup (as in transformers); use "
                                "--lr_scheduler_type constant_with_warmup, or drop --warmup_steps/--warmup_ratio.")
        if self.lr_scheduler_type == "polynomial" and self.learning_rate <= 1e-7:
            raise ArgumentError(f"--lr_scheduler_type polynomial decays to 1e-07, so --learning_rate must be larger, got "
                                f"{self.learning_rate}.")
        self._check_step_counts()
        if not (isinstance(self.save_on_signal_timeout, (int, float)) and 0 <= self.save_on_signal_timeout < math.inf):
            raise ArgumentError(f"--save_on_signal_timeout must be a number of seconds >= 0, got "
                                f"{self.save_on_signal_timeout!r}.")
        self.report_to = _resolve_report_to(self.report_to, self.backend)
        if self.do_eval is None:
            self.do_eval = self.eval_strategy != "no"
        elif not self.do_eval:
            self.eval_strategy = "no"  # run_mlm's meaning: no evaluation at all
        if self.eval_steps is None:
            self.eval_steps = self.logging_steps
        if isinstance(self.resume_from_checkpoint, str) and self.resume_from_checkpoint.lower() in ("false", "none", ""):
            self.resume_from_checkpoint = None
        if self.probe_file:
            self._check_probe_file()
        if self.hub_model_id is not None:
            check_repo_id(self.hub_model_id, "--hub_model_id")  # before TensorFlow starts, not at the first push
        if self.hub_space_id and not self.push_to_hub:
            raise ArgumentError("--hub_space_id deploys a Space for the pushed model: add --push_to_hub (and --hub_model_id).")
        if self.logging_dir is None:
            self.logging_dir = os.path.join(self.output_dir, "runs")
        if self.load_best_model_at_end and self.metric_for_best_model is None:
            self.metric_for_best_model = "loss"  # transformers' default
        if self.metric_for_best_model is not None:
            if self.metric_for_best_model not in BEST_METRICS:
                raise ArgumentError(f"--metric_for_best_model {self.metric_for_best_model!r} is not an evaluation metric "
                                    f"of this trainer; choose one of: {', '.join(BEST_METRICS)}.")
            if self.greater_is_better is None:  # transformers' rule: a loss is minimized, anything else maximized
                self.greater_is_better = BEST_METRICS[self.metric_for_best_model] != "eval_loss"
            elif self.greater_is_better and BEST_METRICS[self.metric_for_best_model] == "eval_loss":
                raise ArgumentError(f"--greater_is_better true with --metric_for_best_model {self.metric_for_best_model}: "
                                    "a larger loss/perplexity is never better; drop --greater_is_better.")
        self._check_combinations()

    def _check_combinations(self):
        """Checks across fields (strategies, evaluation, best model)."""
        if self.eval_on_start and not self.do_eval:
            raise ArgumentError("--eval_on_start needs evaluation, but --do_eval is false; drop one of them.")
        if self.load_best_model_at_end:
            if not self.do_eval or self.eval_strategy == "no":
                raise ArgumentError("--load_best_model_at_end needs evaluations to compare: set --eval_strategy steps or "
                                    "epoch (and the same --save_strategy).")
            # transformers' own checks (TrainingArguments.__post_init__), same wording
            if self.eval_strategy != self.save_strategy:
                raise ArgumentError(
                    "--load_best_model_at_end requires the save and eval strategy to match, but found\n- Evaluation "
                    f"strategy: {self.eval_strategy}\n- Save strategy: {self.save_strategy}"
                )
            if self.eval_strategy == "steps" and self.save_steps % self.eval_steps != 0:
                raise ArgumentError(
                    "--load_best_model_at_end requires the saving steps to be a round multiple of the evaluation "
                    f"steps, but found {self.save_steps}, which is not a round multiple of {self.eval_steps}."
                )

    @staticmethod
    def implied_by(given) -> dict:
        """Defaults implied by the flags the user passed: ``--save_steps N`` / ``--eval_steps N`` without a
        strategy mean the ``steps`` strategy (transformers' default strategy is ``steps``; ours is ``epoch``).

        Args:
            given: field names passed on the command line or in the JSON config (see :func:`given_field_names`).

        Returns:
            ``{field: value}`` to use as parser defaults (explicit values still win).
        """
        implied = {}
        if "save_steps" in given and "save_strategy" not in given:
            implied["save_strategy"] = "steps"
        if "eval_steps" in given and not ({"eval_strategy", "evaluation_strategy"} & set(given)):
            implied["eval_strategy"] = "steps"
        return implied

    def _check_step_counts(self) -> None:
        """Warmup, ``max_steps``/``num_train_epochs`` and ``save_total_limit`` counts (part of ``__post_init__``).

        Raises:
            ArgumentError: a negative count (``max_steps`` -1 is transformers' "unset"), both warmups, no length.
        """
        if self.warmup_steps < 0:
            raise ArgumentError(f"--warmup_steps must be >= 0, got {self.warmup_steps}.")
        if self.warmup_steps > 0 and self.warmup_ratio > 0:
            raise ArgumentError(f"Both --warmup_steps {self.warmup_steps} and --warmup_ratio {self.warmup_ratio} are set; "
                                "pass one of them (transformers would silently use warmup_steps).")
        if self.max_steps < -1:  # another negative is a typo, never "train by epochs"
            raise ArgumentError(f"--max_steps must be > 0 (or -1: train --num_train_epochs), got {self.max_steps}.")
        if self.max_steps <= 0 and self.num_train_epochs <= 0:
            raise ArgumentError("Set --max_steps > 0 or --num_train_epochs > 0.")
        if self.save_total_limit is not None and self.save_total_limit < 1:
            raise ArgumentError("--save_total_limit must be >= 1 (or unset to keep every checkpoint).")

    def check_user_flags(self, given) -> None:
        """Refuse a passed flag that would have no effect, with the reason (after :meth:`implied_by`).

        ``given`` holds the field names passed on the command line or in the JSON config (not inferred from
        values, so ``--save_steps 500`` counts although 500 is the default).

        Raises:
            ArgumentError: ``--save_steps``/``--eval_steps`` with another strategy or ``--do_eval false``;
                ``--do_eval false`` with an evaluation strategy; both spellings of the eval strategy, disagreeing.
        """
        given = set(given)
        eval_flag = "--evaluation_strategy" if "evaluation_strategy" in given else "--eval_strategy"
        if {"eval_strategy", "evaluation_strategy"} <= given and self.evaluation_strategy != self._eval_strategy_as_passed:
            raise ArgumentError(f"--evaluation_strategy {self.evaluation_strategy} and --eval_strategy "
                                f"{self._eval_strategy_as_passed} disagree; pass only --eval_strategy (the current name).")
        if "eval_steps" in given and "do_eval" in given and not self.do_eval:
            raise ArgumentError(f"--eval_steps {self.eval_steps} has no effect with --do_eval false; drop one of them.")
        for steps, strategy, flag, asked in (("save_steps", "save_strategy", "--save_strategy", self.save_strategy),
                                             ("eval_steps", "eval_strategy", eval_flag, self._asked_eval_strategy)):
            if steps in given and asked != "steps":
                raise ArgumentError(f"--{steps} {getattr(self, steps)} only applies with {flag} steps, but {flag} is "
                                    f"{asked}; drop --{steps} or pass {flag} steps.")
        if "do_eval" in given and not self.do_eval and ({"eval_strategy", "evaluation_strategy"} & given):
            if self._asked_eval_strategy != "no":
                raise ArgumentError(f"--do_eval false turns evaluation off, but {eval_flag} {self._asked_eval_strategy} "
                                    "asks for it; drop one of them.")
        hub_only = sorted(n for n in ("hub_model_id", "hub_strategy", "hub_private_repo", "hub_revision",
                                      "hub_commit_budget") if n in given)
        if hub_only and not self.push_to_hub:
            raise ArgumentError(f"{', '.join('--' + n for n in hub_only)} only appl{'ies' if len(hub_only) == 1 else 'y'} "
                                f"when pushing: add --push_to_hub, or drop {'it' if len(hub_only) == 1 else 'them'}.")
        if "save_total_limit" in given and self.save_strategy == "no":
            raise ArgumentError("--save_total_limit limits saved checkpoints, but --save_strategy is no; drop one of them.")
        if "logging_dir" in given and "tensorboard" not in self.report_to:
            raise ArgumentError("--logging_dir is the TensorBoard folder, but --report_to does not include tensorboard; "
                                "drop --logging_dir or add --report_to tensorboard.")
        if self.backend == "torch_xla":
            # the torch_xla backend runs every step as an XLA graph through transformers.Trainer, one step per call
            ignored = [f for f in ("steps_per_execution", "tpu_name", "tpu_zone", "gcp_project") if f in given]
            if "jit_compile" in given and self.jit_compile is False:
                ignored.append("jit_compile")
            if ignored:
                raise ArgumentError(f"{', '.join('--' + n for n in ignored)} only appl{'ies' if len(ignored) == 1 else 'y'} "
                                    "to --backend tensorflow (torch_xla compiles every step itself and finds its TPU "
                                    f"through PJRT_DEVICE); drop {'it' if len(ignored) == 1 else 'them'}.")
        if self.backend == "keras":
            # the Keras backend finds its devices through JAX (--steps_per_execution: steps per call, as TensorFlow)
            ignored = [f for f in ("tpu_name", "tpu_zone", "gcp_project") if f in given]
            if "jit_compile" in given and self.jit_compile is False:
                ignored.append("jit_compile")
            if ignored:
                raise ArgumentError(f"{', '.join('--' + n for n in ignored)} only appl{'ies' if len(ignored) == 1 else 'y'} "
                                    "to --backend tensorflow (--backend keras compiles every step with XLA and uses "
                                    f"every device JAX sees); drop {'it' if len(ignored) == 1 else 'them'}.")
        if "max_steps" in given and "num_train_epochs" in given and self.max_steps > 0:
            logger.info("--max_steps %d overrides --num_train_epochs %s (as in transformers).", self.max_steps,
                        self.num_train_epochs)

    def _check_probe_file(self) -> None:
        """Parse ``probe_file`` now (a bad file fails before any data or compute work)."""
        from hf_tpu_ext import probes
        from hf_tpu_ext.errors import DataError

        if self.backend not in ("tensorflow", "keras"):
            raise ArgumentError(f"--probe_file is scored by the TensorFlow and Keras backends' evaluation; with "
                                f"--backend {self.backend} score the pushed revisions with `hf-tpu probe` instead.")
        try:
            probes.read_probe_file(self.probe_file)
        except probes.ProbeError as err:
            raise DataError(f"--probe_file {err}") from None

    @property
    def resume_latest(self) -> bool:
        """True when ``resume_from_checkpoint`` asks for the latest checkpoint in ``output_dir``."""
        return isinstance(self.resume_from_checkpoint, str) and self.resume_from_checkpoint.lower() == "true"

    @property
    def callback_names(self) -> List[str]:
        return [n.strip() for n in (self.callbacks or "").split(",") if n.strip()]

    def total_steps(self, steps_per_epoch: int) -> int:
        """Optimizer steps of the whole run: ``max_steps`` if > 0, else ``ceil(num_train_epochs * steps_per_epoch)``."""
        if self.max_steps > 0:
            return self.max_steps
        return int(math.ceil(self.num_train_epochs * steps_per_epoch))

    def num_warmup_steps(self, total_steps: int) -> int:
        """``warmup_steps`` if > 0, else ``ceil(warmup_ratio * total_steps)`` (transformers' rule)."""
        return self.warmup_steps if self.warmup_steps > 0 else int(math.ceil(self.warmup_ratio * total_steps))

    def to_sanitized_dict(self) -> dict:
        """The arguments as a JSON-able dict with ``hub_token`` redacted (for training_args.json and the card)."""
        d = asdict(self)
        if d.get("hub_token"):
            d["hub_token"] = "<redacted>"
        return d

    def __repr__(self):  # keep the token out of logs and tracebacks
        items = ", ".join(f"{k}={v!r}" for k, v in self.to_sanitized_dict().items())
        return f"TrainingArguments({items})"

    __str__ = __repr__


def _check_number(name: str, value, low=None, high=None, low_open=False, high_open=False) -> None:
    """Raise ``ArgumentError`` naming ``--name`` unless ``value`` is a finite number in the given range."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ArgumentError(f"--{name} must be a finite number, got {value!r}.")
    below = low is not None and (value <= low if low_open else value < low)
    above = high is not None and (value >= high if high_open else value > high)
    if below or above:
        lo = "-inf" if low is None else f"{low:g}"
        hi = "inf" if high is None else f"{high:g}"
        interval = f"{'(' if low_open or low is None else '['}{lo}, {hi}{')' if high_open or high is None else ']'}"
        raise ArgumentError(f"--{name} must be in {interval}, got {value!r}.")


def check_repo_id(repo_id: str, flag: str) -> str:
    """Refuse a Hub repo id of the wrong form at once (before any start-up or network request).

    Uses ``huggingface_hub.utils.validate_repo_id`` (no request); its reason is kept, its ``repo_type`` hint
    (meant for Python callers) dropped.

    Args:
        repo_id: ``"user/name"`` or ``"name"``.
        flag: the option to name, e.g. ``"--hub_model_id"``.

    Returns:
        ``repo_id`` unchanged.

    Raises:
        ArgumentError: e.g. ``--hub_model_id 'bad repo//x' is not a valid Hub repo id: repo id must be in the
            form 'repo_name' or 'namespace/repo_name'. Use the form 'user/name'.``
    """
    import re

    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(repo_id)
    except HFValidationError as err:
        reason = str(err).replace(" Use `repo_type` argument if needed.", "")
        reason = re.sub(r":\s*'[^\n]*'\.?$", ".", reason)  # the id is named in our message already
        raise ArgumentError(f"{flag} {repo_id!r} is not a valid Hub repo id: {reason[:1].lower()}{reason[1:]} "
                            "Use the form 'user/name'.") from None
    return repo_id


def _resolve_report_to(value, backend: str) -> List[str]:
    """``report_to`` as a list of integrations (transformers' spellings: a name, a list, "all", "none").

    Raises:
        ArgumentError: an integration this package does not drive, or one whose package is not installed.
    """
    import importlib.util

    if value is None:
        value = ["tensorboard"]
    if isinstance(value, str):
        value = [value]
    names = [n.strip() for v in value for n in str(v).split(",") if n.strip()]

    def installed(name):
        # TensorFlow writes TensorBoard event files itself; the torch backend needs the tensorboard package
        if name == "tensorboard" and backend == "tensorflow":
            return True
        return importlib.util.find_spec(name) is not None

    if names in ([], ["none"]):
        return []
    if names == ["all"]:
        return [n for n in REPORT_TO if installed(n)]
    for name in names:
        if name not in REPORT_TO:
            raise ArgumentError(f"--report_to {name!r} is not supported; choose from: {', '.join(REPORT_TO)}, all, none.")
        if not installed(name):
            raise ArgumentError(f"--report_to {name} needs the {name!r} package, which is not installed: "
                                f"`pip install {name}`, or pass --report_to none.")
    return list(dict.fromkeys(names))


def check_arguments(model_args, data_args, training_args) -> None:
    """Checks that need more than one argument dataclass (run by :func:`parse_args`, cheap, no I/O).

    Raises:
        ArgumentError: ``max_seq_length`` above :data:`MAX_SCRATCH_SEQ_LENGTH` when training from scratch.
    """
    L = data_args.max_seq_length
    if not model_args.model_name_or_path and L > MAX_SCRATCH_SEQ_LENGTH:
        raise ArgumentError(
            f"--max_seq_length {L} is too long to train from scratch here (at most {MAX_SCRATCH_SEQ_LENGTH}): attention "
            f"memory and time grow with the square of the length ({L}x{L} scores per head and sequence) and the "
            f"model would need {L + 2} position embeddings. Pass --max_seq_length {MAX_SCRATCH_SEQ_LENGTH} or less "
            "(RoBERTa uses 512)."
        )


def hf_argument_parser_class():
    """:class:`transformers.HfArgumentParser`, without importing the ``transformers`` package when it is not loaded.

    ``import transformers`` imports torch (and its CUDA libraries) whenever torch is installed: 3 s or more
    before ``hf-tpu train --help`` or an argument error could print anything. The parser's module
    (``transformers/hf_argparser.py``) needs only the standard library and PyYAML, so it is loaded from the
    installed package's file on its own; where that fails (a future release importing the package from it),
    the ordinary import is used.

    Returns:
        The ``HfArgumentParser`` class (the installed transformers' code either way).
    """
    if "transformers" not in sys.modules:
        import importlib.util

        name = "hf_tpu_ext._transformers_hf_argparser"
        if name in sys.modules:
            return sys.modules[name].HfArgumentParser
        package = importlib.util.find_spec("transformers")
        for folder in (package.submodule_search_locations or []) if package else []:
            spec = importlib.util.spec_from_file_location(name, os.path.join(folder, "hf_argparser.py"))
            if spec is None or spec.loader is None:
                continue
            module = importlib.util.module_from_spec(spec)
            try:
                sys.modules[name] = module  # dataclass and typing machinery look modules up by name
                spec.loader.exec_module(module)
                return module.HfArgumentParser
            except Exception:  # e.g. a relative import in a newer release: use the package below
                sys.modules.pop(name, None)
    from transformers import HfArgumentParser

    return HfArgumentParser


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """``--help`` with each default said once: argparse's ``(default: X)`` is added only where the help text
    does not state the default itself ("default", "Unset: ...") and the default is not ``None`` (an unset
    optional field says nothing more than its help). HfArgumentParser's own formatter adds it to every option."""

    def _get_help_string(self, action):
        text = action.help or ""
        lowered = text.lower()
        # HfArgumentParser's --no_<flag> complement of a True default is a store_false action whose own
        # default (False) is not the field's: stating it would mislead
        if (action.default is None or "default" in lowered or "unset" in lowered
                or isinstance(action, argparse._StoreFalseAction)):
            return text
        return super()._get_help_string(action)


def _field_types(dataclass_types) -> dict:
    """``{field name: (type hint, dataclasses.Field)}`` of the argument dataclasses (string annotations resolved)."""
    import typing

    types = {}
    for dc in dataclass_types:
        hints = typing.get_type_hints(dc)
        for f in fields(dc):
            types[f.name] = (hints[f.name], f)
    return types


def _json_kind(value) -> str:
    """How a JSON value is named in a message: ``10.5 (a number)``, ``'yes' (a string)``."""
    kind = ("a boolean" if isinstance(value, bool) else "a number" if isinstance(value, (int, float))
            else "a string" if isinstance(value, str) else "a list" if isinstance(value, list)
            else "an object" if isinstance(value, dict) else "null")
    return f"{json.dumps(value)} ({kind})"


def check_config_types(data: dict, dataclass_types, source: str) -> dict:
    """Type-check the values of a JSON config before they become parser defaults (which argparse never converts).

    The command line is typed by argparse (``--max_steps 10.5`` is refused there); a JSON config is not, so
    ``"max_steps": 10.5`` would reach the training loop. Each value must have its field's type: ``int`` fields a
    whole number (``10.0`` is taken as 10), ``float`` fields a number, ``bool`` fields true/false, ``str`` fields a
    string, ``List[str]`` a string or a list of strings; ``null`` only for optional fields; ``choices`` respected.
    Exceptions with their own parsing: ``bf16`` (true/false/"auto"), ``resume_from_checkpoint`` (a boolean means
    ``"true"``/unset).

    Args:
        data: the config's object (unknown names already refused).
        dataclass_types: the argument dataclasses.
        source: how the config is named in messages (``"Config file run.json"``).

    Returns:
        ``data`` with whole-number floats as ints and booleans of ``resume_from_checkpoint`` as strings.

    Raises:
        ArgumentError: e.g. ``Config file run.json: "max_steps" must be a whole number, got 10.5 (a number).``
    """
    import typing

    types = _field_types(dataclass_types)
    out = {}
    for name, value in data.items():
        hint, f = types[name]
        args = typing.get_args(hint)
        optional = typing.get_origin(hint) is typing.Union and type(None) in args
        base = next((a for a in args if a is not type(None)), hint) if optional else hint

        def refuse(what, advice=""):
            raise ArgumentError(f"{source}: {json.dumps(name)} must be {what}, got {_json_kind(value)}{advice}.")

        if value is None:
            if not optional:
                refuse(f"given (it has no unset value; drop the field for its default {f.default!r})")
            out[name] = None
            continue
        if name == "resume_from_checkpoint" and isinstance(value, bool):
            out[name] = "true" if value else None
            continue
        if name == "bf16":
            if not isinstance(value, (bool, str)):
                refuse('true, false or "auto"')
            out[name] = value
            continue
        if base is bool:
            if not isinstance(value, bool):
                refuse("true or false (a JSON boolean, without quotes)")
        elif base is int:
            if isinstance(value, float) and value.is_integer():
                value = int(value)
            if isinstance(value, bool) or not isinstance(value, int):
                refuse("a whole number")
        elif base is float:
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                refuse("a number")
        elif base is str:
            if not isinstance(value, str):
                number = isinstance(value, (int, float)) and not isinstance(value, bool)
                refuse("a string", f"; write it in quotes: {json.dumps(str(value))}" if number else "")
        elif typing.get_origin(base) in (list, List):
            if not (isinstance(value, str) or (isinstance(value, list) and all(isinstance(v, str) for v in value))):
                refuse("a string or a list of strings")
        choices = f.metadata.get("choices")
        if choices and value not in choices:
            refuse(f"one of {', '.join(map(str, choices))}")
        out[name] = value
    return out


def positional_argument_error(token: str) -> str:
    """The message for a positional argument of ``hf-tpu train`` that is not an existing ``.json`` config.

    The only positional argument is a JSON config file (as in transformers' examples). A data file (``.txt``,
    ``.csv``, ..., or a folder) is pointed to ``--train_file``; a missing ``.json``-like name is "no such JSON
    config file", with a close ``*.json`` file of its folder when there is one.
    """
    import difflib

    ext = os.path.splitext(token)[1].lower()
    if ext in DATA_FILE_EXTENSIONS or (os.path.isdir(token) and not token.endswith(".json")):
        return (f"{token} looks like training data, which goes in --train_file: `hf-tpu train --train_file {token} "
                "[--validation_file FILE] ...`. The only positional argument of hf-tpu train is a JSON config file.")
    rule = ("The only positional argument of hf-tpu train is a JSON config file (a name ending in .json, holding "
            "argument names and values); every other argument is a --name value pair.")
    if os.path.isfile(token):
        return f"{token} is not a JSON config file (its name does not end in .json). {rule}"
    folder = os.path.dirname(token) or "."
    try:
        candidates = [n for n in os.listdir(folder) if n.endswith(".json")]
    except OSError:
        candidates = []
    close = difflib.get_close_matches(os.path.basename(token), candidates, n=1, cutoff=0.8)
    hint = f" Did you mean {os.path.join(os.path.dirname(token), close[0])}?" if close else ""
    return f"No such JSON config file: {token}.{hint} {rule}"


def given_field_names(argv: List[str], known) -> set:
    """Field names passed as ``--name``, ``--name=value`` or ``--no_name`` (HfArgumentParser's bool complement)."""
    names = set()
    for token in argv:
        if not token.startswith("--"):
            continue
        name = token[2:].split("=", 1)[0]
        if name not in known and name.startswith("no_") and name[3:] in known:
            name = name[3:]
        if name in known:
            names.add(name)
    return names


def parse_args(argv: Optional[List[str]] = None) -> Tuple[ModelArguments, DataTrainingArguments, TrainingArguments]:
    """Parse ``hf-tpu train`` arguments.

    A single argument ending in ``.json`` is read as a config file holding the fields of the three
    dataclasses (as in transformers' examples); its values are typed by :func:`check_config_types`. The
    returned ``training_args.passed_flags`` (a frozenset of field names) says which fields the command line or
    the config set: a resumed checkpoint decides the ones left at their defaults.

    Raises:
        ArgumentError: an invalid value or combination, with what to change; a positional argument that is not
            an existing ``.json`` file (:func:`positional_argument_error`).
        SystemExit: unknown command-line flags (argparse's own message).
    """
    HfArgumentParser = hf_argument_parser_class()
    argv = list(sys.argv[1:] if argv is None else argv)
    dataclass_types = (ModelArguments, DataTrainingArguments, TrainingArguments)
    parser = HfArgumentParser(dataclass_types, formatter_class=HelpFormatter)
    parser.prog = "hf-tpu train"
    parser.usage = SHORT_USAGE  # argparse errors print this, not every flag
    parser.allow_abbrev = False  # `--num_train_epoch` must not silently mean `--num_train_epochs`
    known = {f.name for dc in dataclass_types for f in fields(dc)}
    given = given_field_names(argv, known)
    if argv and not argv[0].startswith("-") and not (argv[0].endswith(".json") and os.path.isfile(argv[0])):
        raise ArgumentError(positional_argument_error(argv[0]))
    if argv and argv[0].endswith(".json"):
        # a config file, optionally followed by flags that override it
        path = os.path.abspath(argv[0])
        with open(path) as f:
            try:
                data = json.load(f)
            except json.JSONDecodeError as e:
                raise ArgumentError(f"Config file {argv[0]} is not valid JSON: {e}") from None
        if not isinstance(data, dict):
            raise ArgumentError(f"Config file {argv[0]} must hold a JSON object of argument names and values.")
        unknown = sorted(set(data) - known)
        if unknown:
            raise ArgumentError(f"Config file {argv[0]} has unknown fields: {', '.join(unknown)}."
                                + _suggest(unknown, known))
        # argparse never converts defaults: the JSON values are typed here, before anything runs
        data = check_config_types(data, dataclass_types, f"Config file {argv[0]}")
        parser.set_defaults(**data)
        given |= set(data)
        argv = argv[1:]
    # a passed --save_steps/--eval_steps means the steps strategy unless one is given
    parser.set_defaults(**TrainingArguments.implied_by(given))
    *parsed, remaining = parser.parse_args_into_dataclasses(args=argv, return_remaining_strings=True)
    if remaining:
        # the flag names only: `--hub_tokn=hf_...` must not print the token
        flags = [a.split("=", 1)[0] for a in remaining if a.startswith("-")]
        if not flags:  # a stray positional argument (a data file, a misspelt config name)
            raise ArgumentError(positional_argument_error(remaining[0]))
        raise ArgumentError(
            f"Unknown argument(s): {' '.join(flags)}." + _suggest([a.lstrip('-').split('=')[0] for a in flags], known)
            + " Run `hf-tpu train --help` for the list."
        )
    model_args, data_args, training_args = parsed
    training_args.check_user_flags(given)
    check_arguments(model_args, data_args, training_args)
    # which fields the user set (command line or config): a resumed checkpoint decides the others
    training_args.passed_flags = frozenset(given)
    return model_args, data_args, training_args


def _suggest(names, known) -> str:
    import difflib

    hints = []
    for name in names:
        close = difflib.get_close_matches(name, sorted(known), n=1)
        if close:
            hints.append(f"--{close[0]} (for {name})")
    return f" Did you mean: {', '.join(hints)}?" if hints else ""
