"""The record of one model family (:class:`ModelTypeRecord`) and what every record shares: the backend names, the
size/dropout flags, the tokenizer kinds, the encoder FLOP count. Framework-free: only :mod:`hf_tpu_ext.errors`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Optional, Tuple

from hf_tpu_ext.errors import ArgumentError

#: ``--backend`` names, in ``--help`` order (:data:`hf_tpu_ext.backends.BACKEND_REGISTRY` has one entry per name)
BACKENDS = ("tensorflow", "torch_xla", "keras")
#: the model-shape flags of ``ModelArguments`` (from scratch only; a resumed checkpoint decides the ones left unset)
SIZE_OVERRIDES = ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size")
#: the dropout flags (accepted with a pretrained model too: they change no weight's shape)
DROPOUT_FLAGS = ("hidden_dropout_prob", "attention_probs_dropout_prob")
#: every flag a record's :attr:`ModelTypeRecord.flag_fields` may rename
CONFIG_FLAGS = SIZE_OVERRIDES + DROPOUT_FLAGS
#: tokenizers :mod:`hf_tpu_ext.data.tokenizer` trains from text (its ``TRAINERS`` table has one trainer per kind):
#: ``byte_level_bpe`` (``<s> <pad> </s> <unk> <mask>``), ``wordpiece`` (``[PAD] [UNK] [CLS] [SEP] [MASK]``, honours
#: ``--do_lower_case``), ``bracket_bpe`` (a cased byte-level BPE with ``[UNK] [CLS] [SEP] [PAD] [MASK]``),
#: ``llama_bpe`` (Llama 3's split and byte-level BPE with ``<|begin_of_text|> <|end_of_text|> <|mask|> <|pad|>``)
TOKENIZER_KINDS = ("byte_level_bpe", "wordpiece", "bracket_bpe", "llama_bpe")


def no_reserved_positions(config) -> int:
    """Positions a config reserves before the first token: none (positions numbered from 0, or rotary)."""
    return 0


def encoder_flops_per_token(config, seq_length: int, masked_fraction: Optional[float] = None,
                            intermediate_field: str = "intermediate_size") -> float:
    """Training FLOPs (forward + backward) per input token of a post-LN transformer encoder masked LM, PaLM's
    accounting (Chowdhery et al. 2022, App. B; Kaplan et al. 2020 Table 1): ``6 N`` for ``N = n_layer (4 h^2 +
    2 h i)`` non-embedding parameters, ``12 n_layer h seq_length`` for ``Q K^T`` and ``A V``, the LM head
    ``6 (h^2 + h V)`` times ``masked_fraction`` (None: every position). Embedding lookups, norms, softmax: not
    counted.

    Args:
        config: a transformers config with ``hidden_size``, ``num_hidden_layers``, ``vocab_size`` and the feed-forward
            width in ``intermediate_field`` (``4 * hidden_size`` when absent).
        seq_length: tokens per sequence (>= 1). masked_fraction: in [0, 1], or None.

    Raises:
        ArgumentError: ``seq_length < 1`` or ``masked_fraction`` outside [0, 1].
    """
    check_count_arguments(seq_length, masked_fraction)
    h, n_layer = float(config.hidden_size), float(config.num_hidden_layers)
    inter = float(getattr(config, intermediate_field, None) or 4 * config.hidden_size)
    non_embedding = n_layer * (4.0 * h * h + 2.0 * h * inter)
    attention = 12.0 * n_layer * h * float(seq_length)
    return 6.0 * non_embedding + attention + head_flops(config, masked_fraction)


def head_flops(config, masked_fraction: Optional[float]) -> float:
    """The LM head's training FLOPs per token: ``6 (h^2 + h V)`` (dense transform + vocabulary projection) times
    ``masked_fraction`` (None: 1)."""
    h, vocab = float(config.hidden_size), float(config.vocab_size)
    return 6.0 * (h * h + h * vocab) * (1.0 if masked_fraction is None else float(masked_fraction))


def check_count_arguments(seq_length: int, masked_fraction: Optional[float]) -> None:
    """Raise ``ArgumentError`` for ``seq_length < 1`` or a ``masked_fraction`` outside [0, 1]."""
    if seq_length < 1:
        raise ArgumentError(f"seq_length must be >= 1, got {seq_length}.")
    if masked_fraction is not None and not 0.0 <= masked_fraction <= 1.0:
        raise ArgumentError(f"masked_fraction must be in [0, 1] (or None for every position), got {masked_fraction}.")


@dataclass(frozen=True)
class ModelTypeRecord:
    """Everything about one model family that is not a framework's: read by the arguments, the config builder, the
    tokenizer trainer, the FLOP count, the export and every backend.

    Attributes:
        name: the ``--model_type`` value and the family's name (``"roberta"``).
        masked_lm_classes: transformers ``model_type`` -> its masked-LM class (``config.architectures``; transformers
            4.57 and 5 both have each); the first key is ``name``, the others checkpoints of the same weights
            (``"xlm-roberta"``).
        small_preset: ``AutoConfig.for_model(name, **small_preset)``: the config trained from scratch (every other
            field the config class's default).
        tokenizer_kind: one of :data:`TOKENIZER_KINDS`: what ``--model_type`` trains from text.
        backends: the ``--backend`` names (:data:`BACKENDS`) that train it; a backend left out refuses it before
            compute (the refusal names one that trains it).
        flag_fields: flag of :data:`CONFIG_FLAGS` -> the config fields it sets where the config names it otherwise
            (DistilBERT's ``dim``); a flag absent here sets the field of its own name.
        reserved_positions: ``(config) -> int``: position rows before the first token (RoBERTa's
            ``pad_token_id + 1``); the longest input is ``max_position_embeddings`` less this.
        positions_fit_run: from scratch, ``max_position_embeddings`` is the run's ``max_seq_length`` plus the
            reserved rows (RoBERTa's preset), not the preset's table.
        scratch_fields: config fields set on every from-scratch config after the tokenizer (RoBERTa's
            ``type_vocab_size=1``).
        flops_per_token: ``(config, seq_length, masked_fraction) -> float``: training FLOPs per input token, PaLM's
            accounting (:func:`encoder_flops_per_token` by default, read through :attr:`flag_fields`).
        same_positions: transformers ``model_type`` values outside this family whose positions follow the same
            rule (the fill-mask demo loads any masked LM: ``roberta-prelayernorm``); no backend trains them as this
            family.
    """

    name: str
    masked_lm_classes: Mapping[str, str]
    small_preset: Mapping[str, Any]
    tokenizer_kind: str
    backends: Tuple[str, ...]
    flag_fields: Mapping[str, Tuple[str, ...]] = field(default_factory=dict)
    reserved_positions: Callable[[Any], int] = no_reserved_positions
    positions_fit_run: bool = False
    scratch_fields: Mapping[str, Any] = field(default_factory=dict)
    flops_per_token: Optional[Callable[..., float]] = None
    same_positions: Tuple[str, ...] = ()

    def __post_init__(self):
        if next(iter(self.masked_lm_classes)) != self.name:
            raise ValueError(f"record {self.name!r}: masked_lm_classes must start with {self.name!r}.")
        if self.tokenizer_kind not in TOKENIZER_KINDS:
            raise ValueError(f"record {self.name!r}: tokenizer_kind {self.tokenizer_kind!r} is not one of "
                             f"{TOKENIZER_KINDS}.")
        if set(self.backends) - set(BACKENDS) or set(self.flag_fields) - set(CONFIG_FLAGS):
            raise ValueError(f"record {self.name!r}: backends {self.backends} / flags {tuple(self.flag_fields)} "
                             f"outside {BACKENDS} / {CONFIG_FLAGS}.")

    @property
    def model_types(self) -> Tuple[str, ...]:
        """The transformers ``model_type`` values of this family (``name`` first)."""
        return tuple(self.masked_lm_classes)

    def fields(self, flag: str) -> Tuple[str, ...]:
        """The config fields ``--<flag>`` sets (DistilBERT's ``("dim",)`` for ``hidden_size``)."""
        return tuple(self.flag_fields.get(flag, (flag,)))

    def max_sequence_length(self, config) -> int:
        """Longest input ``config``'s positions allow: ``max_position_embeddings`` less the reserved rows."""
        return int(getattr(config, "max_position_embeddings", 0) or 0) - int(self.reserved_positions(config))

    def count_flops(self, config, seq_length: int, masked_fraction: Optional[float] = None) -> float:
        """:attr:`flops_per_token`, or the encoder count with the feed-forward width under this family's name.

        Raises:
            ArgumentError: ``seq_length < 1`` or ``masked_fraction`` outside [0, 1].
        """
        if self.flops_per_token is not None:
            return float(self.flops_per_token(config, seq_length, masked_fraction))
        return encoder_flops_per_token(config, seq_length, masked_fraction, self.fields("intermediate_size")[0])
