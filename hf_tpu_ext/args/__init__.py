"""Arguments of ``hf-tpu train``, parsed by :class:`transformers.HfArgumentParser`.

The three dataclasses reuse the field names of transformers' ``run_mlm`` example
(``ModelArguments``, ``DataTrainingArguments``) and of :class:`transformers.TrainingArguments`, so a
JSON config written for those examples mostly works here. Fields that transformers does not have are
TPU/XLA specific (``tpu_name``, ``jit_compile``, ``steps_per_execution``, ...) or hf-tpu-ext specific
(``callbacks``, ``backend``, ``hub_space_id``, ``max_predictions_per_seq``).

The package, by job: :mod:`~hf_tpu_ext.args.defaults` (choices and the defaults that differ from transformers'),
:mod:`~hf_tpu_ext.args.checks` (validation helpers), :mod:`~hf_tpu_ext.args.model_arguments`,
:mod:`~hf_tpu_ext.args.data_arguments`, :mod:`~hf_tpu_ext.args.training_arguments` (the dataclasses) and
:mod:`~hf_tpu_ext.args.parser` (command line and JSON config -> dataclasses). Every name is importable from
``hf_tpu_ext.args`` as before.

Example:
    >>> from hf_tpu_ext.args import parse_args
    >>> model_args, data_args, training_args = parse_args(["--output_dir", "out", "--max_steps", "10"])
    >>> training_args.per_device_train_batch_size
    8
"""

from hf_tpu_ext.args.checks import check_arguments, check_number, check_repo_id, resolve_report_to
from hf_tpu_ext.args.data_arguments import DataTrainingArguments
from hf_tpu_ext.args.defaults import (BACKENDS, BEST_METRICS, DATA_FILE_EXTENSIONS, DEFAULT_CALLBACKS,
                                      DEFAULTS_DIFFERING_FROM_TRANSFORMERS, HUB_STRATEGIES, LR_SCHEDULER_TYPES,
                                      OPTIMIZERS, REPORT_TO, SHORT_USAGE, SIZE_OVERRIDES,
                                      STRATEGIES)
from hf_tpu_ext.args.model_arguments import ModelArguments
from hf_tpu_ext.args.parser import (HelpFormatter, check_config_types, given_field_names, hf_argument_parser_class,
                                    parse_args, positional_argument_error)
from hf_tpu_ext.args.training_arguments import TrainingArguments

__all__ = [
    "ModelArguments", "DataTrainingArguments", "TrainingArguments", "parse_args", "check_arguments",
    "check_config_types", "check_number", "check_repo_id", "given_field_names", "hf_argument_parser_class",
    "HelpFormatter", "positional_argument_error", "resolve_report_to",
    "BACKENDS", "BEST_METRICS", "DATA_FILE_EXTENSIONS", "DEFAULT_CALLBACKS", "DEFAULTS_DIFFERING_FROM_TRANSFORMERS",
    "HUB_STRATEGIES", "LR_SCHEDULER_TYPES", "OPTIMIZERS", "REPORT_TO", "SHORT_USAGE",
    "SIZE_OVERRIDES", "STRATEGIES",
]
