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

import json
import math
import os
import sys
from dataclasses import asdict, dataclass, field, fields
from typing import List, Optional, Tuple

from hf_tpu_ext.errors import ArgumentError

BACKENDS = ("tensorflow", "torch_xla")
STRATEGIES = ("no", "steps", "epoch")
HUB_STRATEGIES = ("end", "every_save", "checkpoint", "all_checkpoints")
DEFAULT_CALLBACKS = "throughput,xla_recompile_guard"
SHORT_USAGE = "%(prog)s [CONFIG.json] [--name value ...]   (every argument: %(prog)s --help)"


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
    max_train_samples: Optional[int] = field(default=None, metadata={"help": "Keep at most this many training blocks (debugging, quick runs)."})
    max_eval_samples: Optional[int] = field(default=None, metadata={"help": "Keep at most this many validation blocks."})
    preprocessing_num_workers: Optional[int] = field(default=None, metadata={"help": "Processes for datasets.map tokenization."})
    overwrite_cache: bool = field(default=False, metadata={"help": "Recompute the datasets cache."})
    max_seq_length: int = field(default=128, metadata={"help": "Tokens per block (static sequence length)."})
    mlm_probability: float = field(default=0.15, metadata={"help": "Share of tokens masked per sequence (BERT: 0.15)."})
    max_predictions_per_seq: Optional[int] = field(
        default=None,
        metadata={"help": "Masked positions per sequence the MLM head is computed on (default: round(max_seq_length * mlm_probability), as in BERT's TPU code)."},
    )

    def __post_init__(self):
        if not 0.0 < self.mlm_probability < 1.0:
            raise ArgumentError(f"--mlm_probability must be in (0, 1), got {self.mlm_probability}.")
        if self.max_seq_length < 8:
            raise ArgumentError(f"--max_seq_length must be at least 8, got {self.max_seq_length}.")
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
    overwrite_output_dir: bool = field(default=False, metadata={"help": "Allow writing into a non-empty output_dir (its files may be replaced)."})
    resume_from_checkpoint: Optional[str] = field(
        default=None,
        metadata={"help": "A checkpoint folder, 'true' for the latest in output_dir, or a Hub repo id 'user/name[@revision]' holding last-checkpoint/."},
    )
    backend: str = field(default="tensorflow", metadata={"help": f"Training backend: one of {', '.join(BACKENDS)}."})
    per_device_train_batch_size: int = field(default=8, metadata={"help": "Batch size per replica for training."})
    per_device_eval_batch_size: int = field(default=8, metadata={"help": "Batch size per replica for evaluation."})
    learning_rate: float = field(default=5e-4, metadata={"help": "Peak learning rate of AdamW (after warmup)."})
    weight_decay: float = field(default=0.01, metadata={"help": "Decoupled weight decay (not applied to LayerNorm and biases)."})
    adam_beta1: float = field(default=0.9, metadata={"help": "AdamW beta1."})
    adam_beta2: float = field(default=0.999, metadata={"help": "AdamW beta2."})
    adam_epsilon: float = field(default=1e-8, metadata={"help": "AdamW epsilon."})
    max_grad_norm: float = field(default=1.0, metadata={"help": "Global gradient-norm clipping (0 disables)."})
    warmup_ratio: float = field(default=0.0, metadata={"help": "Share of the total steps used for linear warmup."})
    warmup_steps: int = field(default=0, metadata={"help": "Linear warmup steps (overrides warmup_ratio when > 0)."})
    num_train_epochs: float = field(default=3.0, metadata={"help": "Epochs to train (ignored when max_steps > 0)."})
    max_steps: int = field(default=-1, metadata={"help": "Total optimizer steps; > 0 overrides num_train_epochs."})
    logging_steps: int = field(default=10, metadata={"help": "Log the training loss every N global steps."})
    eval_strategy: str = field(default="epoch", metadata={"help": "When to evaluate: no, steps or epoch."})
    eval_on_start: bool = field(default=False, metadata={"help": "Evaluate once before the first step (the untrained baseline)."})
    eval_steps: Optional[int] = field(default=None, metadata={"help": "Evaluate every N global steps with eval_strategy=steps (default: logging_steps)."})
    save_strategy: str = field(default="epoch", metadata={"help": "When to write a checkpoint: no, steps or epoch."})
    save_steps: int = field(default=500, metadata={"help": "Checkpoint every N global steps with save_strategy=steps."})
    save_total_limit: Optional[int] = field(default=2, metadata={"help": "Checkpoints kept in output_dir (oldest removed first)."})
    seed: int = field(default=42, metadata={"help": "Seed of initialization, shuffling and masking."})
    bf16: Optional[str] = field(
        default=None,
        metadata={"help": "Mixed bfloat16 compute, float32 weights and loss: true, false or auto (bf16 where the hardware "
                          "has it natively: TPU, GPU with compute capability >= 8.0, CPU with AVX512-BF16/AMX). "
                          "Unset: auto on a TPU, float32 elsewhere. See hf_tpu_ext/precision.py.",
                  "nargs": "?", "const": "true"},
    )
    jit_compile: Optional[bool] = field(
        default=None,
        metadata={"help": "XLA-compile the training step (unset: yes, except bf16 on a CPU with native bf16, where "
                          "TensorFlow's oneDNN kernels are faster). On one device the whole step (forward, "
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
    license: Optional[str] = field(default="apache-2.0", metadata={"help": "License written in the model card."})
    language: Optional[str] = field(default="en", metadata={"help": "Language written in the model card."})

    def __post_init__(self):
        from hf_tpu_ext.precision import parse_bf16

        try:
            self.bf16 = parse_bf16(self.bf16)
        except ValueError as e:
            raise ArgumentError(str(e)) from None
        if self.backend not in BACKENDS:
            raise ArgumentError(f"Unknown --backend {self.backend!r}; choose one of: {', '.join(BACKENDS)}.")
        for name in ("eval_strategy", "save_strategy"):
            if getattr(self, name) not in STRATEGIES:
                raise ArgumentError(f"--{name} must be one of {', '.join(STRATEGIES)}, got {getattr(self, name)!r}.")
        if self.hub_strategy not in HUB_STRATEGIES:
            raise ArgumentError(f"--hub_strategy must be one of {', '.join(HUB_STRATEGIES)}, got {self.hub_strategy!r}.")
        for name in ("per_device_train_batch_size", "per_device_eval_batch_size", "steps_per_execution", "logging_steps", "save_steps"):
            if getattr(self, name) < 1:
                raise ArgumentError(f"--{name} must be >= 1, got {getattr(self, name)}.")
        if self.max_steps <= 0 and self.num_train_epochs <= 0:
            raise ArgumentError("Set --max_steps > 0 or --num_train_epochs > 0.")
        if not 0.0 <= self.warmup_ratio < 1.0:
            raise ArgumentError(f"--warmup_ratio must be in [0, 1), got {self.warmup_ratio}.")
        if self.learning_rate <= 0:
            raise ArgumentError(f"--learning_rate must be > 0, got {self.learning_rate}.")
        if self.save_total_limit is not None and self.save_total_limit < 1:
            raise ArgumentError("--save_total_limit must be >= 1 (or unset to keep every checkpoint).")
        if self.eval_steps is None:
            self.eval_steps = self.logging_steps
        if isinstance(self.resume_from_checkpoint, str) and self.resume_from_checkpoint.lower() in ("false", "none", ""):
            self.resume_from_checkpoint = None
        if self.hub_space_id and not self.push_to_hub:
            raise ArgumentError("--hub_space_id deploys a Space for the pushed model: add --push_to_hub (and --hub_model_id).")
        if self.logging_dir is None:
            self.logging_dir = os.path.join(self.output_dir, "runs")

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


def parse_args(argv: Optional[List[str]] = None) -> Tuple[ModelArguments, DataTrainingArguments, TrainingArguments]:
    """Parse ``hf-tpu train`` arguments.

    A single argument ending in ``.json`` is read as a config file holding the fields of the three
    dataclasses (as in transformers' examples).

    Raises:
        ArgumentError: an invalid value or combination, with what to change.
        SystemExit: unknown command-line flags (argparse's own message).
    """
    from transformers import HfArgumentParser

    argv = list(sys.argv[1:] if argv is None else argv)
    dataclass_types = (ModelArguments, DataTrainingArguments, TrainingArguments)
    parser = HfArgumentParser(dataclass_types)
    parser.prog = "hf-tpu train"
    parser.usage = SHORT_USAGE  # argparse errors print this, not every flag
    parser.allow_abbrev = False  # `--num_train_epoch` must not silently mean `--num_train_epochs`
    known = {f.name for dc in dataclass_types for f in fields(dc)}
    if argv and argv[0].endswith(".json"):
        # a config file, optionally followed by flags that override it
        path = os.path.abspath(argv[0])
        if not os.path.isfile(path):
            raise ArgumentError(f"Config file {argv[0]} not found.")
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
        parser.set_defaults(**data)
        argv = argv[1:]
    *parsed, remaining = parser.parse_args_into_dataclasses(args=argv, return_remaining_strings=True)
    if remaining:
        flags = [a for a in remaining if a.startswith("-")] or remaining
        raise ArgumentError(
            f"Unknown argument(s): {' '.join(flags)}." + _suggest([a.lstrip('-').split('=')[0] for a in flags], known)
            + " Run `hf-tpu train --help` for the list."
        )
    return tuple(parsed)


def _suggest(names, known) -> str:
    import difflib

    hints = []
    for name in names:
        close = difflib.get_close_matches(name, sorted(known), n=1)
        if close:
            hints.append(f"--{close[0]} (for {name})")
    return f" Did you mean: {', '.join(hints)}?" if hints else ""
