"""``DataTrainingArguments``: what text ``hf-tpu train`` reads (run_mlm's class of the same name)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from hf_tpu_ext.args.checks import check_number
from hf_tpu_ext.errors import ArgumentError


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
    max_eval_samples: Optional[int] = field(default=None, metadata={"help": "Keep the first N validation blocks, N >= 1. Unset: all (with --streaming: the first 1000)."})
    streaming: bool = field(default=False, metadata={"help": "Enable streaming mode: read --dataset_name or the data files as a datasets IterableDataset, each process its own slice (--backend keras; needs --max_steps and a tokenizer)."})
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
    pack_documents: bool = field(
        default=False,
        metadata={"help": "Packing by document (--backend keras): blocks stay full, but attention and positions restart at each document boundary (the tokenizer's separator/eos ending each document). Off: documents run into each other (run_mlm's grouping). Recommended for long --max_seq_length."},
    )
    pad_to_max_length: bool = field(
        default=False,
        metadata={"help": "run_mlm's padding switch. Accepted either way: every block is max_seq_length tokens (static shapes), so nothing is padded."},
    )

    def __post_init__(self):
        check_number("mlm_probability", self.mlm_probability, low=0.0, high=1.0, low_open=True, high_open=True)
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
        if self.streaming:
            self._check_streaming()
        if self.max_predictions_per_seq is None:
            self.max_predictions_per_seq = max(1, int(round(self.max_seq_length * self.mlm_probability)))
        if not 1 <= self.max_predictions_per_seq <= self.max_seq_length:
            raise ArgumentError(
                f"--max_predictions_per_seq must be in [1, max_seq_length={self.max_seq_length}], got {self.max_predictions_per_seq}."
            )

    def _check_streaming(self) -> None:
        """``--streaming`` needs a source to stream, and reads as many blocks as ``--max_steps`` asks for."""
        if self.uses_default_corpus:
            raise ArgumentError("--streaming reads a --dataset_name or --train_file; the default corpus is held in "
                                "memory already: pass one of them, or drop --streaming.")
        if self.max_train_samples is not None:
            raise ArgumentError("--max_train_samples does not apply with --streaming: the run reads --max_steps x "
                                "the global batch blocks from the stream; drop --max_train_samples.")

    @property
    def uses_default_corpus(self) -> bool:
        return not (self.dataset_name or self.train_file)
