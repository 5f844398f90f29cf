"""Backend-neutral model configuration from the model-type records (:mod:`hf_tpu_ext.model_types`): the
``--model_type`` preset, size and dropout flags under each family's field names, ``--config_overrides``, position
limits, the summary's model fields.

Every backend builds its model from :func:`build_config`, so the same arguments give the same architecture
whichever backend trains it. No TensorFlow or torch import here.
"""

from __future__ import annotations

from hf_tpu_ext.errors import ArgumentError
from hf_tpu_ext.model_types import (CONFIG_FLAGS, DROPOUT_FLAGS, find_record, flag_fields, masked_lm_class,
                                    max_sequence_length, record_for)


def parse_config_overrides(text) -> dict:
    """``--config_overrides`` (run_mlm's syntax, ``"n_embd=10,resid_pdrop=0.2"``) as ``{key: value string}``.

    Raises:
        ArgumentError: a piece without ``=`` or with an empty key.
    """
    pairs = {}
    for piece in (p.strip() for p in str(text or "").split(",")):
        if not piece:
            continue
        key, sep, value = piece.partition("=")
        if not sep or not key.strip():
            raise ArgumentError(f"--config_overrides {text!r}: {piece!r} is not key=value; write it as "
                                "\"num_hidden_layers=4,hidden_size=256\".")
        pairs[key.strip()] = value.strip()
    return pairs


def check_positions(config, max_seq_length: int) -> None:
    """Raise ``ArgumentError`` when ``max_seq_length`` is longer than the model's positions allow."""
    limit = max_sequence_length(config)
    if max_seq_length > limit:
        raise ArgumentError(
            f"--max_seq_length {max_seq_length} is larger than the model allows ({limit} tokens: "
            f"max_position_embeddings={config.max_position_embeddings}). Use --max_seq_length {limit} or less."
        )


def apply_config_overrides(config, text) -> None:
    """Apply ``--config_overrides`` to ``config`` with ``PretrainedConfig.update_from_string`` (each value typed as
    the field it replaces: int, float, bool, str).

    Raises:
        ArgumentError: a key the config does not have (its ``model_type`` and the closest field named), or a value
            of the wrong type.
    """
    import difflib

    for key, value in parse_config_overrides(text).items():
        if key in ROPE_THETA_FIELDS and isinstance(getattr(config, "rope_parameters", None), dict):
            _set_rope_theta(config, key, value)  # transformers 5 keeps them in rope_parameters
            continue
        if not hasattr(config, key):
            close = difflib.get_close_matches(key, [*config.to_dict(), *getattr(config, "attribute_map", {})], n=1)
            hint = f"did you mean {close[0]!r}?" if close else "see the fields of its config.json."
            raise ArgumentError(f"--config_overrides: a {config.model_type} config has no field {key!r}; {hint}")
        try:
            config.update_from_string(f"{key}={value}")
        except ValueError as err:
            raise ArgumentError(f"--config_overrides {key}={value}: {err}.") from None


#: ModernBERT's RoPE thetas (transformers 4.57's fields; 5's ``rope_parameters`` kinds): what a context-extension
#: phase may change on resume (``--config_overrides global_rope_theta=160000``)
ROPE_THETA_FIELDS = {"global_rope_theta": "full_attention", "local_rope_theta": "sliding_attention"}


def _set_rope_theta(config, key: str, value: str) -> None:
    """``key`` (:data:`ROPE_THETA_FIELDS`) on a transformers 5 config: its ``rope_parameters`` kind's ``rope_theta``
    and the attribute (the constructor reads it back from ``scratch_config``'s fields)."""
    try:
        theta = float(value)
    except ValueError:
        raise ArgumentError(f"--config_overrides {key}={value}: a RoPE theta is a number, e.g. 160000.") from None
    config.rope_parameters = {k: dict(v) for k, v in config.rope_parameters.items()}
    config.rope_parameters.setdefault(ROPE_THETA_FIELDS[key], {"rope_type": "default"})["rope_theta"] = theta
    setattr(config, key, theta)


def check_overrides_of_pretrained(config, text, name: str) -> None:
    """Refuse ``--config_overrides`` that change a pretrained model's architecture (its weights' shapes or
    wiring): only dropout fields, or a field set to the value the model has, may be given with
    ``--model_name_or_path``.

    Raises:
        ArgumentError: one line naming the field, the model's value and what to do.
    """
    import copy

    for key, value in parse_config_overrides(text).items():
        if "dropout" in key:
            continue
        probe = copy.deepcopy(config)
        apply_config_overrides(probe, f"{key}={value}")
        if getattr(probe, key) != getattr(config, key):
            raise ArgumentError(
                f"--config_overrides {key}={value} contradicts --model_name_or_path {name} ({key}={getattr(config, key)}"
                "): a pretrained model's size and wiring are its weights'. Drop it, or drop --model_name_or_path to "
                "train from scratch (--model_type with --config_overrides).")


def scratch_config(model_args):
    """The config ``--model_type``'s preset (its record's ``small_preset``, via ``AutoConfig.for_model``) or
    ``--config_name`` makes with the size flags and then ``--config_overrides`` (applied last, as run_mlm does),
    before the tokenizer fills its vocabulary (:func:`build_config` finishes it).

    Raises:
        ArgumentError: an unknown ``--config_overrides`` key or a value of the wrong type; a hidden size that is
            not a multiple of the heads; a ``--model_type`` the installed transformers has no config class for
            (EuroBERT before transformers 5).
    """
    import transformers
    from transformers import CONFIG_MAPPING, AutoConfig

    record = record_for(getattr(model_args, "model_type", None))
    model_type, preset = record.name, {} if model_args.config_name else dict(record.small_preset)
    if not model_args.config_name and model_type not in CONFIG_MAPPING:
        raise ArgumentError(f"--model_type {model_type}: transformers {transformers.__version__} has no {model_type} "
                            "config; install a transformers release that has it (pip install -U transformers).")

    def make(**fields):
        if model_args.config_name:
            return AutoConfig.from_pretrained(model_args.config_name, cache_dir=model_args.cache_dir, **fields)
        return AutoConfig.for_model(model_type, **{**preset, **fields})

    config = make()
    fields = {}
    for name in CONFIG_FLAGS:
        value = getattr(model_args, name)
        if value is not None:
            fields.update({field_name: value for field_name in set_fields(config.model_type, name)})
    probe = make(**fields)
    text = getattr(model_args, "config_overrides", None)
    apply_config_overrides(probe, text)  # checks each key and types its value as the field
    fields.update({key: getattr(probe, key) for key in parse_config_overrides(text)})
    # built again with every field as a constructor argument: fields derived in __init__ (transformers 5's
    # ModernBERT layer_types from num_hidden_layers) follow the overrides
    config = make(**fields)
    if config.hidden_size % config.num_attention_heads:
        raise ArgumentError(
            f"hidden_size {config.hidden_size} is not a multiple of num_attention_heads {config.num_attention_heads}."
        )
    return config


def _sized_to_run(config, model_args) -> bool:
    """Whether :func:`build_config` sets the positions from ``max_seq_length``: a record with ``positions_fit_run``
    (RoBERTa's preset: exactly the run's length; its ``--config_name``: widened to fit), not positions set by
    ``--config_overrides``."""
    overrides = parse_config_overrides(getattr(model_args, "config_overrides", None))
    record = find_record(config.model_type)
    return bool(record and record.positions_fit_run) and "max_position_embeddings" not in overrides


def check_scratch_positions(config, model_args, max_seq_length: int) -> None:
    """Refuse a ``max_seq_length`` longer than a from-scratch config's position table (BERT's 512), naming the
    limit (a RoBERTa config sized by the run is not refused).

    Raises:
        ArgumentError: the limit and the two ways out.
    """
    if _sized_to_run(config, model_args):
        return
    limit = max_sequence_length(config)
    if max_seq_length > limit:
        wanted = int(config.max_position_embeddings) - limit + max_seq_length
        raise ArgumentError(
            f"--max_seq_length {max_seq_length} is longer than a {config.model_type} model with "
            f"max_position_embeddings={config.max_position_embeddings} takes ({limit} tokens): pass --max_seq_length "
            f"{limit} or less, or --config_overrides max_position_embeddings={wanted}.")


def build_config(model_args, tokenizer, max_seq_length: int):
    """The config of a model trained from scratch: :func:`scratch_config` with the tokenizer's vocabulary and
    special ids. A record with ``positions_fit_run`` (the default RoBERTa) gets ``max_seq_length`` + its reserved
    rows (RoBERTa's 2), or
    ``model_args.checkpoint_max_position_embeddings`` when a resume set it (the checkpoint's, which hold a shorter
    ``--max_seq_length``); a RoBERTa ``--config_name`` is widened to fit.

    Raises:
        ArgumentError: see :func:`scratch_config`; too few positions for ``max_seq_length``.
    """
    config = scratch_config(model_args)
    _set_tokenizer_ids(config, tokenizer)
    _apply_vocab_override(config, model_args, len(tokenizer))
    record = find_record(config.model_type)
    if _sized_to_run(config, model_args):
        wanted = max_seq_length + record.reserved_positions(config)  # RoBERTa's start at padding_idx + 1
        if model_args.config_name:
            config.max_position_embeddings = max(config.max_position_embeddings or 0, wanted)
        else:  # the default config gets exactly the positions it is trained on (a resumed one: the checkpoint's)
            resumed = getattr(model_args, "checkpoint_max_position_embeddings", None)
            config.max_position_embeddings = int(resumed) if resumed else wanted
    for field_name, value in (record.scratch_fields if record else {}).items():
        setattr(config, field_name, value)
    check_positions(config, max_seq_length)
    return config


def _apply_vocab_override(config, model_args, tokens: int) -> None:
    """A ``--config_overrides vocab_size=N`` is kept when it holds the tokenizer's ``tokens`` (spare rows, as
    BERT's unused ones); fewer rows than tokens is refused (the model is otherwise sized to the tokenizer).

    Raises:
        ArgumentError: N below the tokenizer's size.
    """
    wanted = parse_config_overrides(getattr(model_args, "config_overrides", None)).get("vocab_size")
    if wanted is None:
        return
    rows = int(wanted)  # scratch_config typed it already (a non-integer was refused there)
    if rows < tokens:
        raise ArgumentError(f"--config_overrides vocab_size={wanted} gives fewer embedding rows than the tokenizer's "
                            f"{tokens} tokens: drop it (the model gets one row per token) or give {tokens} or more.")
    config.vocab_size = rows


def _set_tokenizer_ids(config, tokenizer) -> None:
    """The tokenizer's vocabulary size and special ids on ``config``. A config whose class sets ``bos_token_id`` /
    ``eos_token_id`` (ModernBERT's: ``[CLS]``/``[SEP]``) gets the tokenizer's ``[CLS]``/``[SEP]`` where the
    tokenizer has no BOS/EOS token; ``cls_token_id``/``sep_token_id``/``mask_token_id`` where the config names them
    (EuroBERT's ``mask_token_id`` defaults to Llama 3's 128002, outside a trained vocabulary)."""
    config.vocab_size = len(tokenizer)
    config.pad_token_id = tokenizer.pad_token_id
    ids = {"bos_token_id": tokenizer.bos_token_id, "eos_token_id": tokenizer.eos_token_id,
           "cls_token_id": tokenizer.cls_token_id, "sep_token_id": tokenizer.sep_token_id,
           "mask_token_id": tokenizer.mask_token_id}
    for field_name, fallback in (("bos_token_id", "cls_token_id"), ("eos_token_id", "sep_token_id")):
        if ids[field_name] is None and getattr(config, field_name, None) is not None:
            ids[field_name] = ids[fallback]
    for field_name, token_id in ids.items():
        if token_id is not None and (field_name in ("bos_token_id", "eos_token_id") or hasattr(config, field_name)):
            setattr(config, field_name, token_id)


def set_fields(model_type, flag: str) -> tuple:
    """The config fields ``--<flag>`` sets on a ``model_type`` config (:func:`flag_fields`).

    Raises:
        ArgumentError: the flag is given but the config has no field it could set (EuroBERT has no hidden dropout),
            so it would change nothing.
    """
    names = flag_fields(model_type, flag)
    if not names:
        raise ArgumentError(f"--{flag} changes nothing in a {model_type} model (its config has no such field); "
                            "drop the flag.")
    return names


def dropout_overrides(model_args, model_type=None) -> dict:
    """Config kwargs for a model loaded from ``model_name_or_path``: the dropout flags (under ``model_type``'s
    field names, :func:`flag_fields`: DistilBERT's ``dropout``, ...) and the dropout fields of
    ``--config_overrides`` (the only ones accepted there: :func:`check_overrides_of_pretrained`), as floats."""
    overrides = {field: getattr(model_args, name) for name in DROPOUT_FLAGS
                 if getattr(model_args, name) is not None for field in set_fields(model_type, name)}
    for key, value in parse_config_overrides(getattr(model_args, "config_overrides", None)).items():
        if "dropout" in key:
            try:
                overrides[key] = float(value)
            except ValueError:
                raise ArgumentError(f"--config_overrides {key}={value}: a dropout is a number in [0, 1).") from None
    return overrides


def model_summary_fields(config, num_parameters: int) -> dict:
    """``num_parameters``, ``model_type`` and ``model_config`` (sizes under transformers' common names, e.g.
    DistilBERT's ``dim`` as ``hidden_size``; ``model_type`` and ``architectures``: the masked-LM class), for
    ``training_summary.json`` and the card."""
    fields = {k: getattr(config, k, None) for k in (
        "vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "max_position_embeddings")}
    for flag in ("intermediate_size", "hidden_dropout_prob", "attention_probs_dropout_prob"):
        names = flag_fields(config.model_type, flag)
        fields[flag] = getattr(config, names[0], None) if names else None
    architectures = [a[2:] if a.startswith("TF") else a for a in getattr(config, "architectures", None) or []]
    if not architectures and masked_lm_class(config.model_type):
        architectures = [masked_lm_class(config.model_type)]
    return {
        "num_parameters": int(num_parameters),
        "model_type": config.model_type,
        "model_config": {**fields, "model_type": config.model_type, "architectures": architectures},
    }
