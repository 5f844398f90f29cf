"""The checks of ``hf-tpu train`` that need no framework, run right after the arguments are parsed.

The model references (``--model_name_or_path``, ``--config_name``, ``--tokenizer_name``) are checked here from
the parsed arguments (one bounded Hub request per repo id), before the terminal set-up imports transformers:
``hf-tpu train`` reads its command line once, with :func:`hf_tpu_ext.args.parse_args`.

A missing ``--train_file`` used to be refused after the backend's imports (transformers, Keras or TensorFlow,
datasets: ~3.4 s); these checks import only the standard library and numpy, so a bad input costs the parse alone.
The same checks run again in :func:`hf_tpu_ext.run.checks.check_run` (a library caller of
:func:`hf_tpu_ext.run.train` gets them there).
"""

from __future__ import annotations


def check_before_imports(model_args, data_args, training_args) -> None:
    """Refuse a model reference that is neither a folder nor an existing Hub repo, and a missing, empty, binary or
    unsupported local ``--train_file`` / ``--validation_file``, before any framework is imported.

    Args:
        model_args, data_args, training_args: what :func:`hf_tpu_ext.args.parse_args` returned.

    Raises:
        ArgumentError, HubRepoError, HubAuthError: a model reference (see
            :func:`hf_tpu_ext.hub.model_ref.check_model_ref`).
        DataFileNotFoundError: a local data file does not exist (one line naming the flag and the path).
        DataError: the file is a folder, empty, compressed/binary, or of an unsupported extension.
        CheckpointError: ``--resume_from_checkpoint`` is neither ``true``, an existing path, nor a repo id.
    """
    from hf_tpu_ext.run.checks import check_data_files, check_model_refs
    from hf_tpu_ext.run.resume import check_resume_source

    check_resume_source(training_args)  # a path that does not exist (no Hub request)
    check_model_refs(model_args)  # a missing model is named before transformers (and torch) are imported
    check_data_files(data_args)
