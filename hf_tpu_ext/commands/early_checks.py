"""The checks of ``hf-tpu train`` that need no framework, run right after the arguments are parsed.

The model references (``--model_name_or_path``, ``--config_name``, ``--tokenizer_name``) are checked here from
the parsed arguments (one bounded Hub request per repo id), before the terminal set-up imports transformers:
``hf-tpu train`` reads its command line once, with :func:`hf_tpu_ext.args.parse_args`. With ``--push_to_hub
true`` the token is checked here too (one whoami): an invalid ``HF_TOKEN`` used to be found by the push preflight
after the backend's start-up (58 s on a loaded machine).

A missing ``--train_file`` used to be refused after the backend's imports (transformers, Keras or TensorFlow,
datasets: ~3.4 s); these checks import only the standard library, numpy and huggingface_hub, so a bad input costs
the parse alone. The run reuses what they found: :func:`hf_tpu_ext.run.checks.check_run` does not check the same
model references again, and the run's push checks reuse the whoami answer
(:func:`hf_tpu_ext.hub.preflight.whoami`). A library caller of :func:`hf_tpu_ext.run.train` gets every check there.
"""

from __future__ import annotations

import copy
import os

from hf_tpu_ext.backends.keras import refuse_keras_backend
from hf_tpu_ext.backends.keras.processes import jax_distributed_arguments, shape_before_start
from hf_tpu_ext.console import default_backend
from hf_tpu_ext.distributed import jax_process_id_pending, process_index
from hf_tpu_ext.errors import BackendError, CheckpointError
from hf_tpu_ext.hub.preflight import check_push_access, resolve_token


def check_before_imports(model_args, data_args, training_args) -> None:
    """Refuse a model reference that is neither a folder nor an existing Hub repo, a missing, empty, binary or
    unsupported local ``--train_file`` / ``--validation_file``, and with ``--push_to_hub true`` a token that cannot
    push, before any framework is imported, in the order the run checks them.

    Args:
        model_args, data_args, training_args: what :func:`hf_tpu_ext.args.parse_args` returned.

    Raises:
        ArgumentError, HubRepoError, HubAuthError: a model reference (see
            :func:`hf_tpu_ext.hub.model_ref.check_model_ref`).
        DataFileNotFoundError: a local data file does not exist (one line naming the flag and the path).
        DataError: the file is a folder, empty, compressed/binary, or of an unsupported extension.
        CheckpointError: ``--resume_from_checkpoint`` is neither ``true``, an existing path, nor a repo id.
        ArgumentError: a ``model_type`` the backend does not train (:func:`hf_tpu_ext.run.checks.check_model_type`),
            ``pytorch_model.bin`` weights only without torch (:func:`hf_tpu_ext.run.checks.check_weight_files`).
        HubAuthError, HubRepoError, HubError: see :func:`check_push_token`.
        BackendError: see :func:`check_keras_backend` and :func:`check_process_environment`.
        CheckpointError: see :func:`check_resume_shape`.
    """
    # the run's modules load numpy (+0.2 s): imported here, out of hf-tpu train --help
    from hf_tpu_ext.run.checks import check_data_files, check_model_refs, check_model_type, check_weight_files
    from hf_tpu_ext.run.resume import check_resume_repo, check_resume_source

    check_keras_backend(training_args)  # KERAS_BACKEND=tensorflow: --backend keras trains on JAX only
    check_process_environment(training_args)  # before any request: a slice's host missing a variable
    check_resume_source(training_args)  # a path that does not exist (no Hub request)
    check_model_refs(model_args, remember=True)  # a missing model is named before transformers (and torch) load
    check_resume_repo(training_args)  # a Hub repo or revision that does not exist
    check_data_files(data_args)
    check_model_type(model_args, training_args)  # config.json read as JSON: deberta-v2 on keras, modernbert on TF
    check_weight_files(model_args, training_args)  # pytorch_model.bin only, and no torch to read it
    check_resume_shape(model_args, data_args, training_args)  # a flag that contradicts a local checkpoint
    check_push_token(training_args)  # last: the run checks the data before the Hub access too


def check_push_token(training_args) -> None:
    """With ``--push_to_hub true`` on the chief: the checks of the run's push session that create nothing
    (:func:`hf_tpu_ext.hub.preflight.check_push_access`: repo id, token, write access; one whoami, remembered for
    the run's own checks). Other processes push nothing and skip it, as the run does; so does a JAX process that
    learns whether it is the chief only from ``jax.distributed.initialize``.

    Raises:
        HubAuthError: no token (``No Hub token found: ...``), an invalid one (named by its source, never shown), a
            read-only one, or none with write access to the repo.
        HubRepoError: an invalid ``--hub_model_id``.
        HubError: the Hub could not be reached (``HF_HUB_OFFLINE`` included: the push needs it).
    """
    if not training_args.push_to_hub:
        return
    if process_index() != 0 or jax_process_id_pending():
        return
    from hf_tpu_ext.run.pushes import push_repo  # the run's modules load numpy: out of hf-tpu train --help

    check_push_access(push_repo(training_args), resolve_token(training_args.hub_token), remember=True)


def _trains_keras(training_args) -> bool:
    return (getattr(training_args, "backend", None) or default_backend()) == "keras"


def check_keras_backend(training_args) -> None:
    """With ``--backend keras`` (or the default backend being it): a ``KERAS_BACKEND`` other than ``jax``, refused
    before any framework loads (:func:`hf_tpu_ext.backends.keras.refuse_keras_backend`; the backend's set-up
    refuses what Keras was imported with too, for a library caller). Unset or empty: JAX (the run sets it).

    Raises:
        BackendError: one line naming the value and what to do (``--backend tensorflow`` for TensorFlow).
    """
    value = os.environ.get("KERAS_BACKEND")
    if value and _trains_keras(training_args):
        refuse_keras_backend(value)


def check_process_environment(training_args) -> None:
    """With ``--backend keras`` (or the default backend): bad or half ``JAX_*`` multi-process variables
    (:func:`hf_tpu_ext.backends.keras.processes.jax_distributed_arguments`; no JAX imported), refused before
    anything starts: a host of a slice that misses ``JAX_COORDINATOR_ADDRESS`` would otherwise train a model of
    its own.

    Raises:
        BackendError: one line naming the variables and what to set.
    """
    if getattr(training_args, "backend", None) not in (None, "keras"):
        return
    try:
        jax_distributed_arguments()
    except ValueError as err:
        raise BackendError(str(err)) from None


def check_resume_shape(model_args, data_args, training_args) -> None:
    """With ``--backend keras`` resuming a local checkpoint (``--resume_from_checkpoint true`` or a folder): a dry
    run of the run's own rules (:func:`hf_tpu_ext.run.resume.apply_checkpoint_shape`) on copies of the arguments,
    so a flag that contradicts the checkpoint is refused with the run's line before JAX starts. The checkpoint is
    the newest whose ``checkpoint.json`` and trainer state read (tensors are read by the run). The global-batch
    rule needs the device count: where the environment does not fix it
    (:func:`hf_tpu_ext.backends.keras.processes.shape_before_start`), the run checks it after its set-up; an
    unreadable checkpoint is left to the run, which names it.

    Raises:
        CheckpointError: the run's refusal (one line naming both values); a ``--max_steps`` that ends before the
            checkpoint's step of an unfinished run (:func:`hf_tpu_ext.run.resume.check_max_steps`).
    """
    args = training_args
    if not args.resume_from_checkpoint or not _trains_keras(args):
        return
    # numpy (the checkpoint and the run's modules) stays out of hf-tpu train --help
    from hf_tpu_ext.backends.keras.checkpoint import find_checkpoints, read_checkpoint_info
    from hf_tpu_ext.run.resume import apply_checkpoint_shape, checkpoint_run_shape

    folder = args.output_dir if args.resume_latest else args.resume_from_checkpoint
    if not os.path.isdir(folder):  # a Hub repo id, a TensorFlow prefix: the run reads it
        return
    info = None
    for path in find_checkpoints(folder)[:None if args.resume_latest else 1]:
        try:
            info = read_checkpoint_info(path, tensors=False)
            break
        except CheckpointError:
            continue  # the run skips it (or names it)
    if info is None:
        return
    devices, processes = shape_before_start()
    shape = checkpoint_run_shape(info.path, devices, processes, keras=True)
    apply_checkpoint_shape(info, *copy.deepcopy((model_args, data_args, training_args)), str, shape)
    if int(args.max_steps or 0) > 0:  # an explicit length below the checkpoint's step (epochs: the run counts them)
        from hf_tpu_ext.run.resume import check_max_steps
        from hf_tpu_ext.run.state import resumed_run_state

        run_state = resumed_run_state(args.output_dir, args.resume_latest, info.global_step, int(args.max_steps))
        check_max_steps(info.global_step, int(args.max_steps), run_state, args, info.path)
