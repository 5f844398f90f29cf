"""Where ``--resume_from_checkpoint`` is decided: which checkpoint (newest readable local one, a named folder, or a
Hub repo's ``last-checkpoint/``), the tokenizer beside it, the model shape and block length it imposes on flags
left at their defaults, and the log history and runtime it carries over.

No file is written here (a Hub resume downloads into a temp folder the run removes at its end).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import tempfile
from types import SimpleNamespace
from typing import Any, Callable, Dict, List, Optional, Tuple

from hf_tpu_ext.console import default_backend
from hf_tpu_ext.errors import CheckpointError, IncompleteCheckpointError
from hf_tpu_ext.hub.checkpoint_layouts import check_checkpoint_backend
from hf_tpu_ext.hub.model_ref import check_model_ref
from hf_tpu_ext.hub.resume import download_last_checkpoint, looks_like_repo_spec, parse_repo_spec
from hf_tpu_ext.model_config import ROPE_THETA_FIELDS, parse_config_overrides
from hf_tpu_ext.model_types import DEFAULT_MODEL_TYPE, find_record, flag_fields, max_sequence_length, record_for
from hf_tpu_ext.outputs import TrainerState

logger = logging.getLogger("hf_tpu_ext")

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")
#: model-shape flags that a resumed checkpoint decides (a flag left unset takes the checkpoint's value)
SHAPE_FLAGS = ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size")


def checkpoint_seq_length(trainer_state: Optional[Dict[str, Any]]) -> Optional[int]:
    """The block length a checkpoint was trained at, from the trainer state saved with it: its last phase's
    ``max_seq_length``, else tokens seen per sequence (``num_input_tokens_seen / (global_step *
    train_batch_size)``); ``None`` when it does not say."""
    state = trainer_state or {}
    phases = state.get("phases") or []
    if phases and isinstance(phases[-1], dict) and phases[-1].get("max_seq_length"):
        return int(phases[-1]["max_seq_length"])
    try:
        tokens, step, batch = (int(state.get(k) or 0) for k in ("num_input_tokens_seen", "global_step",
                                                                 "train_batch_size"))
    except (TypeError, ValueError):
        return None
    if tokens <= 0 or step <= 0 or batch <= 0 or tokens % (step * batch):
        return None
    return tokens // (step * batch)


def shown_path(text: str, download: Optional[Tuple[str, str]]) -> str:
    """``text`` with the temp folder of a Hub resume (``download``: ``(temp folder, repo spec)``) replaced by
    ``hf://<repo id>`` (what the user typed)."""
    if download:
        local, spec = download
        text = str(text).replace(local + os.sep, f"hf://{spec}/").replace(local, f"hf://{spec}")
    return str(text)


def passed(training_args, name: str, owner) -> bool:
    """Whether the user set ``name`` of the dataclass ``owner`` (command line or JSON config:
    ``training_args.passed_flags`` from :func:`hf_tpu_ext.args.parse_args`); without that record, whether it
    differs from the field's default."""
    given = getattr(training_args, "passed_flags", None)
    if given is not None:
        return name in given
    default = next((f.default for f in dataclasses.fields(owner) if f.name == name), None)
    return getattr(owner, name, None) != default


def not_a_resume_source(spec: str) -> CheckpointError:
    """The error for a ``--resume_from_checkpoint`` that names nothing a resume can read."""
    return CheckpointError(f"--resume_from_checkpoint {spec!r} is neither a local checkpoint/folder, 'true', nor a "
                           "Hub repo id 'user/name[@revision]'.")


def check_resume_source(args) -> None:
    """Raise :func:`not_a_resume_source` for a spec that is not ``true``, an existing path (or TF checkpoint
    prefix), nor of the form of a Hub repo id: no framework or network needed, so ``hf-tpu train`` runs it
    right after parsing."""
    spec = args.resume_from_checkpoint
    if not spec or args.resume_latest or os.path.exists(spec) or os.path.exists(spec + ".index"):
        return
    if not looks_like_repo_spec(spec):
        raise not_a_resume_source(spec)


def check_resume_repo(args) -> None:
    """A ``--resume_from_checkpoint user/name[@revision]`` names a repo and revision that exist (one bounded Hub
    request, no framework: ``hf-tpu train`` runs it right after parsing, with the other model references).

    Raises:
        HubRepoError, HubAuthError: see :func:`hf_tpu_ext.hub.model_ref.check_model_ref` (the repo and revision
            named, with the endpoint).
    """
    spec = args.resume_from_checkpoint
    if not spec or args.resume_latest or os.path.exists(spec) or os.path.exists(spec + ".index"):
        return
    from huggingface_hub import constants

    if looks_like_repo_spec(spec) and not constants.HF_HUB_OFFLINE:  # offline: the download reads the cache
        repo_id, revision = parse_repo_spec(spec)
        check_model_ref(repo_id, "--resume_from_checkpoint", revision=revision,
                        token=getattr(args, "hub_token", None) or None)


def find_resume_checkpoint(args, backend, token: Optional[str], tmp_dirs: List[str]):
    """The checkpoint ``--resume_from_checkpoint`` names: ``(CheckpointInfo or None, tokenizer folder or None,
    download)``; ``(None, None, download)`` is a fresh run. ``download`` is ``(temp folder, repo spec)`` of a Hub
    resume (messages show the spec; the folder is appended to ``tmp_dirs`` for the run to remove), else ``None``.

    A newest local checkpoint that cannot be read is skipped with a warning (the next older one is used);
    an explicitly named one raises ``CheckpointError`` naming the file.

    Raises:
        CheckpointError: no checkpoint found, an unreadable named one, or a spec that is neither a folder,
            ``true`` nor a Hub repo id.
    """
    spec, download = args.resume_from_checkpoint, None
    if not spec:
        return None, None, None
    if args.resume_latest:
        candidates = backend.find_checkpoints(args.output_dir) if os.path.isdir(args.output_dir) else []
        if not candidates:
            check_checkpoint_backend(args.output_dir, backend.name)
            raise CheckpointError(
                f"--resume_from_checkpoint true found no checkpoint in {args.output_dir!r}. Train without "
                "--resume_from_checkpoint, or give a checkpoint folder or Hub repo id.")
        tokenizer_dir = args.output_dir
    elif os.path.exists(spec) or os.path.exists(spec + ".index"):
        candidates = backend.find_checkpoints(spec)[:1]
        if not candidates:
            check_checkpoint_backend(spec, backend.name)
            raise CheckpointError(f"No checkpoint of --backend {backend.name} found at {spec!r}.")
        tokenizer_dir = None
    elif looks_like_repo_spec(spec):
        local = tempfile.mkdtemp(prefix="hf-tpu-resume-")
        tmp_dirs.append(local)
        download = (local, spec)  # messages name the repo, not this temp folder
        try:
            folder = download_last_checkpoint(spec, token, local, is_checkpoint=backend.is_checkpoint_folder,
                                              also=TOKENIZER_FILES + ("special_tokens_map.json",))
        except CheckpointError:
            check_checkpoint_backend(local, backend.name, shown=f"the Hub repo {spec}")  # it has one, of another
            raise
        candidates = backend.find_checkpoints(folder)[:1]
        tokenizer_dir = local
    else:
        raise not_a_resume_source(spec)
    info = _first_readable(candidates, args, backend, lambda text: shown_path(text, download))
    if info is None:
        return None, None, download
    return info, _tokenizer_folder(info, tokenizer_dir), download


def _first_readable(candidates: List[str], args, backend, shown: Callable[[str], str]):
    """The :class:`CheckpointInfo` of the first readable candidate (newest first); ``None`` when every one is
    incomplete (the first save of the run was stopped: the run starts at step 0).

    Raises:
        CheckpointError: a named checkpoint cannot be read, or no candidate is readable.
    """
    info, errors = None, []
    for i, path in enumerate(candidates):
        try:
            info = backend.checkpoint_info(path)
            break
        except CheckpointError as err:
            if not args.resume_latest:  # named explicitly: nothing to fall back to
                raise CheckpointError(f"{shown(str(err))} Name an older checkpoint, or start a new "
                                      "run.") from None
            errors.append(err)
            if i + 1 < len(candidates):  # the last one's failure is said once, by the error below
                logger.warning("%s Resuming from the next older checkpoint instead.", err)
    if info is None:
        if errors and all(isinstance(e, IncompleteCheckpointError) for e in errors):
            # the first save of the run was stopped: nothing was saved, so the run starts at step 0
            logger.warning("No complete checkpoint in %s: training starts at step 0.", args.output_dir)
            return None
        raise CheckpointError("No readable checkpoint to resume from: " + " | ".join(map(str, errors)))
    return info


def _tokenizer_folder(info, tokenizer_dir: Optional[str]) -> Optional[str]:
    """The folder holding the checkpoint's tokenizer files (:data:`TOKENIZER_FILES`): ``tokenizer_dir`` when given
    and complete, else the checkpoint's folder or one of the two above it; ``None`` when none holds them."""
    if tokenizer_dir is None:
        here = os.path.abspath(info.path if os.path.isdir(info.path) else os.path.dirname(info.path))
        for folder in (here, os.path.dirname(here), os.path.dirname(os.path.dirname(here))):
            if all(os.path.isfile(os.path.join(folder, f)) for f in TOKENIZER_FILES):
                return folder
        return None
    if not all(os.path.isfile(os.path.join(tokenizer_dir, f)) for f in TOKENIZER_FILES):
        return None
    return tokenizer_dir


@dataclasses.dataclass
class RunShape:
    """The data-parallel shape a resumed run trains at (see the README's resume table).

    Attributes:
        replicas: data-parallel devices of every process (``Backend.num_replicas``); ``None`` where not known yet
            (the argument checks before JAX starts, without a device count in the environment): the global-batch
            rule is then left to the run's own check after the backend's set-up.
        processes: processes of the run (JAX processes / TF workers); ``None`` where not known yet (a TPU slice,
            Slurm or Open MPI before JAX starts): the stream's process-count rule is then left to the run.
        streaming: whether the checkpoint holds stream positions (``data_state-<i>.json``): ``None`` when the
            backend's checkpoints do not say (only Keras checkpoints can be streamed).
        stream_processes: how many processes' positions the checkpoint holds.
    """

    replicas: Optional[int] = 1
    processes: Optional[int] = 1
    streaming: Optional[bool] = None
    stream_processes: int = 0


def checkpoint_stream_processes(path: str) -> Optional[int]:
    """How many ``data_state-<i>.json`` a checkpoint folder holds (0: not streamed); ``None`` for a checkpoint that
    is not a folder (a TensorFlow ``ckpt-N`` prefix: never streamed)."""
    if not os.path.isdir(path):
        return None
    return sum(1 for n in os.listdir(path) if n.startswith("data_state-") and n.endswith(".json"))


def run_shape(backend, info) -> RunShape:
    """The :class:`RunShape` of a set-up ``backend`` (``None``: one device, one process) resuming ``info``."""
    if backend is None:
        return RunShape()
    try:
        workers = int(backend.device_summary().get("num_workers") or 1)
    except Exception:  # noqa: BLE001 (a backend that cannot say before its build: one process)
        workers = 1
    return checkpoint_run_shape(info.path, int(backend.num_replicas), workers, backend.name == "keras")


def checkpoint_run_shape(path: str, replicas: Optional[int], processes: Optional[int], keras: bool) -> RunShape:
    """The :class:`RunShape` of a run of ``replicas`` devices over ``processes`` processes (``None``: not known
    yet) resuming the checkpoint at ``path``; ``keras``: whether it is a Keras-backend checkpoint (only those can
    be streamed)."""
    streamed = checkpoint_stream_processes(path) if keras else None
    return RunShape(replicas=replicas, processes=processes, streaming=None if streamed is None else streamed > 0,
                    stream_processes=streamed or 0)


def apply_checkpoint_shape(info, model_args, data_args, training_args, shown: Callable[[str], str],
                           shape: Optional[RunShape] = None) -> List[str]:
    """The checkpoint's model shape, block length, global batch and data source win over flags left at their
    defaults (``model_args``, ``data_args`` and ``training_args`` are updated in place); a passed flag that
    changes them is refused, except a new split of the same global batch over devices, processes and
    accumulation (the batch of a step depends only on the step: data position, epoch, schedule unchanged).

    The shape flags (:data:`SHAPE_FLAGS`) left unset take the checkpoint's values; so does
    ``--max_seq_length`` when it was not passed (the checkpoint's length: ``num_input_tokens_seen / (global_step
    * train_batch_size)`` of its trainer state, else its position embeddings less RoBERTa's 2 reserved ones),
    with ``max_predictions_per_seq`` re-derived unless passed; ``--per_device_train_batch_size`` left at its
    default becomes the checkpoint's ``train_batch_size`` (global, sequences) / (``shape.replicas`` x
    ``--gradient_accumulation_steps``); ``--streaming`` left at its default follows the checkpoint; a passed other
    ``--mlm_probability`` starts a new phase, one left unset continues the checkpoint's (:func:`checkpoint_phases`);
    so does a longer ``--max_seq_length`` within the model's positions (a context extension: the data goes on in
    tokens, :func:`_apply_phase_position`).

    Returns:
        The lines that say what the resume takes from the checkpoint or changes (the caller logs them).

    Raises:
        CheckpointError: a passed flag contradicts the checkpoint, each conflict named with both values (the
            checkpoint by the path or Hub repo id given to --resume_from_checkpoint: ``shown``), before any data work.
    """
    shape = shape or RunShape()
    conflicts: List[str] = []
    notes: List[str] = []
    _apply_model_type(info, model_args, training_args, conflicts, notes)
    _apply_model_shape(info, model_args, conflicts)
    _apply_seq_length(info, model_args, data_args, training_args, conflicts, notes)
    _apply_rope_theta(info, model_args, notes)
    _apply_global_batch(info, training_args, shape, conflicts, notes)
    _apply_streaming(info, data_args, training_args, shape, conflicts, notes)
    _apply_mlm_probability(info, data_args, training_args, notes)
    _apply_phase_position(info, data_args)
    _announce_max_steps(info, training_args, notes)
    if conflicts:
        where = shown(info.path)
        raise CheckpointError(
            f"These flags contradict the checkpoint {where} being resumed: {'; '.join(conflicts)}. Drop them "
            "(the checkpoint's values are used) or start a new run in another --output_dir.")
    return notes


def _apply_model_type(info, model_args, training_args, conflicts: List[str], notes: List[str]) -> None:
    """``--model_type`` (from scratch: no ``--model_name_or_path``/``--config_name``, whose config says it) left
    at its default takes the checkpoint's architecture (``xlm-roberta``/``camembert``: ``roberta``, the same one
    here); a passed other one is refused. A checkpoint of a model continued from ``--model_name_or_path`` (its
    config's ``_name_or_path``) needs it again. Checkpoints saved before these were recorded: no rule."""
    saved, m = (info.model_config or {}).get("model_type"), model_args
    source = (info.model_config or {}).get("_name_or_path")
    if source and not (m.model_name_or_path or m.config_name):  # its config is the model's, not a preset's
        conflicts.append(f"no --model_name_or_path or --config_name (the checkpoint's model was built from "
                         f"{source!r}: pass it again as the run that made it did; the weights are the checkpoint's)")
        return
    if not saved or m.model_name_or_path or m.config_name:
        return
    record = find_record(saved)  # xlm-roberta, camembert: RoBERTa's record
    architecture = record.name if record else DEFAULT_MODEL_TYPE
    if passed(training_args, "model_type", m):
        if m.model_type != architecture:
            conflicts.append(f"--model_type {m.model_type} (the checkpoint is a {saved!r} model)")
    elif m.model_type != architecture:
        notes.append(f"--model_type not given: resuming the checkpoint's {architecture!r} model.")
        m.model_type = architecture


def _apply_model_shape(info, model_args, conflicts: List[str]) -> None:
    saved, m = info.model_config or {}, model_args
    overrides = parse_config_overrides(getattr(m, "config_overrides", None))
    for name in SHAPE_FLAGS:
        if saved.get(name) is None:
            continue
        given = getattr(m, name, None)
        if given is not None and int(given) != int(saved[name]):
            conflicts.append(f"--{name} {given} (the checkpoint has {saved[name]})")
        elif given is None and not m.model_name_or_path and not m.config_name:
            setattr(m, name, int(saved[name]))
        for key in flag_fields(saved.get("model_type") or record_for(m.model_type).name, name):
            if key in overrides and overrides[key] != str(saved[name]):
                conflicts.append(f"--config_overrides {key}={overrides[key]} (the checkpoint has {saved[name]})")


def _apply_seq_length(info, model_args, data_args, training_args, conflicts: List[str], notes: List[str]) -> None:
    """``--max_seq_length``: the checkpoint's when not passed; a passed longer one within the model's positions is
    a new phase (a context extension, :func:`_extend_context`); a shorter one, or one past the positions (the
    limit named: BERT's 512), is refused."""
    saved, m = info.model_config or {}, model_args
    positions = saved.get("max_position_embeddings")
    # the record's rule: RoBERTa reserves pad_token_id + 1 rows of its table, BERT/DistilBERT/ModernBERT none
    model_type = saved.get("model_type") or DEFAULT_MODEL_TYPE
    limit = max_sequence_length(SimpleNamespace(model_type=model_type, pad_token_id=saved.get("pad_token_id", 1),
                                                max_position_embeddings=positions)) if positions else None
    length = data_args.max_seq_length
    trained = checkpoint_seq_length(info.trainer_state)
    if passed(training_args, "max_seq_length", data_args):
        longer = bool(trained) and length > trained and _backend(training_args) == "keras"  # data goes on in tokens
        if longer and not (limit and length > limit):
            _extend_context(info, data_args, trained, notes)
        elif trained and length != trained and not longer:
            conflicts.append(f"--max_seq_length {length} (the checkpoint trained at {trained}; a new length is a new "
                             "run: --model_name_or_path on its exported model)")
        elif limit and length > limit:
            conflicts.append(f"--max_seq_length {length} (the checkpoint's model holds {limit} tokens)")
            return
        if limit and length < limit and not m.model_name_or_path and not m.config_name:
            # the default config gets length + 2 positions: keep the checkpoint's, which hold the shorter length
            m.checkpoint_max_position_embeddings = int(positions)
        return
    target = trained if trained and (not limit or trained <= limit) else (min(length, limit) if limit else None)
    if target and target != length:
        data_args.max_seq_length = target
        if not passed(training_args, "max_predictions_per_seq", data_args):
            data_args.max_predictions_per_seq = max(1, int(round(target * data_args.mlm_probability)))
        notes.append(f"--max_seq_length not given: resuming with the checkpoint's {target} (the default is "
                     f"{length}).")


def _checkpoint_thetas(saved: Dict[str, Any]) -> Dict[str, float]:
    """``{config field: theta}`` (:data:`~hf_tpu_ext.model_config.ROPE_THETA_FIELDS`) a checkpoint's
    ``model_config`` recorded (transformers 5's ``rope_parameters`` or 4.57's fields); ``{}`` for none."""
    params, found = saved.get("rope_parameters") or {}, {}
    for key, kind in ROPE_THETA_FIELDS.items():
        value = (params.get(kind) or {}).get("rope_theta") if isinstance(params, dict) else None
        value = saved.get(key) if value is None else value
        if value is not None:
            found[key] = float(value)
    return found


def _apply_rope_theta(info, model_args, notes: List[str]) -> None:
    """ModernBERT's RoPE thetas on resume of a model from scratch: a passed other one (``--config_overrides
    global_rope_theta=...``, a context extension's new theta) is accepted with one line; one left out takes the
    checkpoint's (appended to ``model_args.config_overrides``), so a phase's theta survives its own resumes."""
    saved, m = _checkpoint_thetas(info.model_config or {}), model_args
    if not saved or m.model_name_or_path:
        return
    overrides = parse_config_overrides(getattr(m, "config_overrides", None))
    for key, theta in saved.items():
        if key not in overrides:
            m.config_overrides = ",".join(p for p in (m.config_overrides or "", f"{key}={theta:g}") if p)
        elif _number(overrides[key]) not in (None, theta):  # not a number: the config's own check names it
            notes.append(f"--config_overrides {key}={overrides[key]} (the checkpoint's {theta:g}): RoPE's theta "
                         f"changes from step {info.global_step}, as a context extension's phase does.")


def _number(text: str) -> Optional[float]:
    try:
        return float(text)
    except ValueError:
        return None


def _backend(training_args) -> str:
    return getattr(training_args, "backend", None) or default_backend()


def _extend_context(info, data_args, trained: int, notes: List[str]) -> None:
    """A longer ``--max_seq_length`` than the checkpoint's (BERT's 128 -> 512, ModernBERT's 1,024 -> 8,192): a new
    phase from the checkpoint's step, said in one line. The step, the optimizer state and the data position go on:
    the data is re-blocked at the new length and read on from the token the checkpoint reached
    (:func:`_apply_phase_position`)."""
    step, length = int(info.global_step), int(data_args.max_seq_length)
    tokens = _tokens_of(checkpoint_phases(info), info)
    batch = int((info.trainer_state or {}).get("train_batch_size") or 0)
    where = f", block {tokens // (batch * length) * batch:,} of the {length}-token blocks" if batch else ""
    notes.append(f"--max_seq_length {length} (the checkpoint trained at {trained}): a new phase from step {step}; "
                 f"the step, the optimizer state and the data position go on (the data re-blocked at {length} tokens, "
                 f"read on from token {tokens:,}{where}), recorded in training_summary.json (phases) and the model "
                 "card.")


def _apply_phase_position(info, data_args) -> None:
    """Where the run's blocks of ``--max_seq_length`` start (``data_args.phase_start_step``,
    ``tokens_before_phase``: the :class:`~hf_tpu_ext.backends.base.RunPlan` fields of
    :func:`hf_tpu_ext.backends.base.data_step`): after the checkpoint's last phase of another length, the tokens up
    to its end; ``0, 0`` when every phase had this length (or an older checkpoint did not record them)."""
    phases, length = checkpoint_phases(info), int(data_args.max_seq_length)
    other = [i for i, p in enumerate(phases) if p.get("max_seq_length") not in (None, length)]
    data_args.phase_start_step, data_args.tokens_before_phase = 0, 0
    if other:
        done = phases[:other[-1] + 1]
        data_args.phase_start_step, data_args.tokens_before_phase = int(done[-1]["end_step"]), _tokens_of(done, None)


def _tokens_of(phases: List[Dict[str, Any]], info) -> int:
    """Training tokens of a checkpoint's ``phases`` (where a phase did not record them: the trainer state's
    ``num_input_tokens_seen`` of ``info``, 0 without it)."""
    counted = [p.get("tokens") for p in phases]
    if counted and all(isinstance(t, int) for t in counted):
        return int(sum(counted))
    return int(((info.trainer_state if info is not None else None) or {}).get("num_input_tokens_seen") or 0)


def _apply_global_batch(info, training_args, shape: RunShape, conflicts: List[str], notes: List[str]) -> None:
    """The global batch (per-device batch x replicas x accumulation) stays the checkpoint's ``train_batch_size``:
    the learning-rate schedule, the epoch and the data position are counted in its steps."""
    args = training_args
    try:
        saved = int((info.trainer_state or {}).get("train_batch_size") or 0)
    except (TypeError, ValueError):
        saved = 0
    if saved <= 0 or shape.replicas is None:  # no device count yet: the run checks it after its set-up
        return
    accumulation = int(getattr(args, "gradient_accumulation_steps", 1) or 1)
    per_device = int(args.per_device_train_batch_size)
    split = f"{shape.replicas} device(s) over {shape.processes} process(es) x {accumulation} accumulation step(s)"
    if per_device * shape.replicas * accumulation == saved:
        notes.append(f"from step {info.global_step}: global batch {saved} = {per_device} per device x {split} "
                     "(the checkpoint's).")
        return
    derivable = not passed(args, "per_device_train_batch_size", args) and saved % (shape.replicas * accumulation) == 0
    if derivable:
        args.per_device_train_batch_size = saved // (shape.replicas * accumulation)
        notes.append(f"--per_device_train_batch_size not given: resuming with the checkpoint's global batch {saved} "
                     f"= {args.per_device_train_batch_size} per device x {split}.")
        return
    conflicts.append(f"global batch {per_device * shape.replicas * accumulation} (--per_device_train_batch_size "
                     f"{per_device} x {split}; the checkpoint trained with global batch {saved}: pass a per-device "
                     "batch and accumulation that multiply to it)")


def _apply_streaming(info, data_args, training_args, shape: RunShape, conflicts: List[str], notes: List[str]) -> None:
    """``--streaming`` follows the checkpoint (its stream positions are per process: the same process count)."""
    if shape.streaming is None:
        return
    given = bool(getattr(data_args, "streaming", False))
    source = data_args.dataset_name or data_args.train_file
    if (shape.streaming and not given and not passed(training_args, "streaming", data_args) and source
            and int(getattr(training_args, "max_steps", 0) or 0) > 0):
        data_args.streaming = given = True
        notes.append("--streaming not given: resuming the checkpoint's stream (--streaming true).")
    if given != shape.streaming:
        conflicts.append(f"--streaming {str(given).lower()} (the checkpoint was trained with --streaming "
                         f"{str(shape.streaming).lower()})")
    elif given and shape.processes is not None and shape.stream_processes != shape.processes:
        conflicts.append(f"{shape.processes} process(es) (the checkpoint's stream positions are of "
                         f"{shape.stream_processes}: a stream resumes with the same process count)")


def checkpoint_phases(info) -> List[Dict[str, Any]]:
    """The ``phases`` a checkpoint's trainer state recorded (:func:`hf_tpu_ext.run.state.run_phases`), those that
    start before its step; a checkpoint saved before phases were recorded: one phase from step 0 whose
    ``mlm_probability`` is unknown (``None``)."""
    state, step = info.trainer_state or {}, int(info.global_step)
    phases = [dict(p) for p in state.get("phases") or () if int(p.get("start_step") or 0) < step]
    if not phases and step > 0:
        tokens = int(state.get("num_input_tokens_seen") or 0) or None
        phases = [{"start_step": 0, "end_step": step, "max_seq_length": checkpoint_seq_length(state),
                   "mlm_probability": None, "tokens": tokens}]
    return phases


def _apply_mlm_probability(info, data_args, training_args, notes: List[str]) -> None:
    """``--mlm_probability`` may change on resume (a phase of a masking schedule, as mmBERT's 30 -> 15 -> 5 %):
    accepted with one line, the new rate recorded as a new phase; left unset, the checkpoint's last rate goes on
    (``max_predictions_per_seq`` re-derived unless passed). The checkpoint's phases are kept on
    ``data_args.resumed_phases``, which the run's ``phases`` continue (:func:`hf_tpu_ext.run.state.run_phases`)."""
    phases = data_args.resumed_phases = checkpoint_phases(info)
    saved, asked = (phases[-1].get("mlm_probability") if phases else None), data_args.mlm_probability
    if saved is None or float(saved) == float(asked):
        return
    if passed(training_args, "mlm_probability", data_args):
        notes.append(f"--mlm_probability {asked:g} (the checkpoint's phase masked {saved:g}): a new phase from step "
                     f"{info.global_step}, recorded in training_summary.json (phases) and the model card.")
        return
    data_args.mlm_probability = float(saved)
    if not passed(training_args, "max_predictions_per_seq", data_args):
        data_args.max_predictions_per_seq = max(1, int(round(data_args.max_seq_length * float(saved))))
    notes.append(f"--mlm_probability not given: resuming with the checkpoint's {saved:g} (the default is {asked:g}).")


def _announce_max_steps(info, training_args, notes: List[str]) -> None:
    """A passed ``--max_steps`` other than the checkpoint run's (its trainer state's ``max_steps``) past the
    checkpoint's step: accepted with one line; the learning-rate schedule is that of the new length from the
    resumed step on, as transformers' Trainer does (a rate that was decaying to 0 at the old end jumps)."""
    try:
        saved = int((info.trainer_state or {}).get("max_steps") or 0)
    except (TypeError, ValueError):
        return
    asked = int(getattr(training_args, "max_steps", 0) or 0)
    if saved > 0 and asked > info.global_step and asked != saved:
        notes.append(f"--max_steps {asked} (the checkpoint's run had {saved}): from step {info.global_step} the "
                     f"learning-rate schedule is that of a {asked}-step run, as in transformers' Trainer.")


def check_max_steps(start: int, total_steps: int, run_state: Dict[str, Any], training_args,
                    shown: Optional[str]) -> None:
    """A run resumed at global step ``start`` whose training is not done must end at or after it.

    Raises:
        CheckpointError: ``total_steps`` (``--max_steps``, or the epochs' steps) is below ``start`` while the
            checkpoint's run had more steps to train (a finished run's rerun is said by the run: nothing to do).
    """
    if shown is None or start <= total_steps or (run_state.get("phases") or {}).get("train") == "done":
        return
    args = training_args
    asked = (f"--max_steps {args.max_steps}" if int(getattr(args, "max_steps", -1) or -1) > 0
             else f"--num_train_epochs {args.num_train_epochs} ({total_steps} steps)")
    raise CheckpointError(f"{asked} ends before the checkpoint {shown} (global step {start}): pass --max_steps {start} "
                          "or more to finish that run, or resume an earlier checkpoint.")


def resumed_history(info, output_dir: str, start: int) -> Tuple[Optional[List[Dict[str, Any]]], Optional[float]]:
    """What a resumed run carries over from the checkpoint's trainer state (else ``output_dir/trainer_state.json``):
    ``(log history up to step start, train_runtime so far in seconds)``; the runtime is ``None`` when the state is
    of another step, both are ``None`` without a state."""
    state = info.trainer_state
    if state is None and os.path.isfile(os.path.join(output_dir, "trainer_state.json")):
        state = dataclasses.asdict(TrainerState.load(os.path.join(output_dir, "trainer_state.json")))
    if not state:
        return None, None
    history = [e for e in state.get("log_history", []) if e.get("step", 0) <= start]
    runtime = float(state.get("train_runtime") or 0.0) if int(state.get("global_step", -1)) == start else None
    return history, runtime
