"""``ModelArguments``: which model ``hf-tpu train`` trains (run_mlm's class of the same name)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from hf_tpu_ext.args.checks import check_number
from hf_tpu_ext.model_types import DEFAULT_MODEL_TYPE, DROPOUT_FLAGS, MODEL_TYPE_CHOICES, SIZE_OVERRIDES
from hf_tpu_ext.errors import ArgumentError


@dataclass
class ModelArguments:
    """Which model to train: continue from ``model_name_or_path`` or build one from a config."""

    model_name_or_path: Optional[str] = field(
        default=None,
        metadata={"help": "A model folder or Hub repo id to continue pre-training from. Leave unset to train from scratch."},
    )
    model_type: str = field(
        default=DEFAULT_MODEL_TYPE,
        metadata={"help": "The architecture trained from scratch (its small preset, 4 layers x 256; ignored with "
                          "--model_name_or_path or --config_name, whose config says it).",
                  "choices": list(MODEL_TYPE_CHOICES)},
    )
    config_overrides: Optional[str] = field(
        default=None,
        metadata={"help": "Config fields set when training from scratch, run_mlm's syntax: "
                          "\"num_hidden_layers=4,hidden_size=256\" (typed as the field; applied last). With "
                          "--model_name_or_path only dropout fields, or the model's own values."},
    )
    do_lower_case: bool = field(
        default=True,
        metadata={"help": "Lower-case the text in a WordPiece tokenizer trained for --model_type (BERT uncased's)."},
    )
    config_name: Optional[str] = field(
        default=None,
        metadata={"help": "A config folder/repo id/config.json to train from scratch (default: --model_type's small preset)."},
    )
    tokenizer_name: Optional[str] = field(
        default=None,
        metadata={"help": "A tokenizer folder or repo id. Unset: use the model's, or train one for --model_type (its record's kind: byte-level BPE or WordPiece)."},
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
        if self.model_type not in MODEL_TYPE_CHOICES:
            raise ArgumentError(f"--model_type {self.model_type!r} is not one this package trains from scratch; choose "
                                f"from: {', '.join(MODEL_TYPE_CHOICES)} (any other masked LM: --model_name_or_path with "
                                "--backend torch_xla).")
        if self.config_overrides is not None and self.config_name:
            raise ArgumentError("--config_overrides and --config_name both set the config: put the fields in the "
                                "config file, or drop --config_name and use --model_type with --config_overrides.")
        for name in DROPOUT_FLAGS:
            if getattr(self, name) is not None:
                check_number(name, getattr(self, name), low=0.0, high=1.0, high_open=True)
        for name in SIZE_OVERRIDES:
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise ArgumentError(f"--{name} must be >= 1, got {getattr(self, name)}.")
        if self.vocab_size < 300:
            raise ArgumentError(f"--vocab_size {self.vocab_size} is too small for a tokenizer trained here (a byte-level "
                                "BPE's 256 bytes + specials); use >= 300.")
        if self.hidden_size and self.num_attention_heads and self.hidden_size % self.num_attention_heads:
            raise ArgumentError(
                f"--hidden_size {self.hidden_size} is not a multiple of --num_attention_heads {self.num_attention_heads}."
            )
