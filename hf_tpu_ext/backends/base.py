"""The contract between the training run (:mod:`hf_tpu_ext.run`) and a backend.

A backend builds the model, fits it, saves/restores its checkpoints and exports the model folder. Everything
else of ``hf-tpu train`` -- checks, output folder, resume, data, trainer state, outputs, card, pushes, Space,
signals -- belongs to the training run, once for every backend. Backends never import the training run, the
callbacks or the Hub pusher: the run hands them the callbacks to drive and a ``on_save`` hook.

Order of calls made by the training run::

    backend.setup(training_args)               # devices/strategy: num_replicas, is_chief (no files written)
    backend.spawn(fn, args)                    # only when backend.processes_to_spawn > 0: the run goes on in them
    backend.find_checkpoint(...) / checkpoint_info(...)   # resume checks, before any data work
    backend.build(tokenizer, blocks, plan)     # model, optimizer, datasets (no files written)
    backend.restore(path) -> global step       # resume only
    backend.remove_incomplete_checkpoints(output_dir)  # what a killed save left (chief, once checks passed)
    backend.fit(callbacks, on_save) -> metrics # on_save(step, checkpoint_path, files) after every checkpoint
    backend.export(folder, tokenizer)          # config.json, model.safetensors (PyTorch names), tokenizer

Every member the training run reads is declared on :class:`Backend`; :class:`BackendDefaults` gives the optional
ones their "not supported" value, so a new backend is a folder with one class (``class MyBackend(BackendDefaults)``)
and one entry in :data:`hf_tpu_ext.backends.BACKEND_REGISTRY`.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Dict, List, Mapping, Optional, Protocol, Tuple, Union, runtime_checkable

#: what a push takes of one checkpoint: ``{name in the pushed folder: local file, or a small file's bytes}``
CheckpointFiles = Mapping[str, Union[str, bytes]]

#: ``on_save(global_step, checkpoint_path, files)``: called by :meth:`Backend.fit` after each checkpoint is
#: written; ``files`` is what a push of it takes (:meth:`Backend.checkpoint_files` with ``with_state=True``, handed
#: over by the save itself, so a pushed save asks the backend nothing more), ``None`` where the save cannot list
#: them yet (the run then asks :meth:`Backend.checkpoint_files` once the trainer state is written).
SaveHook = Callable[[int, str, Optional[CheckpointFiles]], None]


@dataclasses.dataclass
class RunPlan:
    """Sizes of a run, fixed before the model is built.

    Attributes:
        global_batch_size: sequences per optimizer step (per-device batch x replicas).
        eval_batch_size: sequences per evaluation step (all replicas).
        seq_length: tokens per sequence (``max_seq_length``).
        steps_per_epoch: optimizer steps per pass over the training blocks (``num_train_blocks // global``).
        total_steps: optimizer steps of the whole run (``max_steps`` or epochs x steps_per_epoch).
        num_train_blocks: training sequences available.
        has_eval: whether there is a validation split to evaluate on.
        streaming: the train split is a ``--streaming`` stream: no length, so ``steps_per_epoch`` is the run's
            ``--max_steps`` and the passes over the data are counted by the stream (:meth:`Backend.data_passes`).
        num_eval_blocks: validation sequences each evaluation reads (0 without evaluation).
        phase_start_step, tokens_before_phase: a resume at another ``--max_seq_length`` (a phase of a context
            extension, :func:`hf_tpu_ext.run.resume.checkpoint_phases`): the step the run's blocks of this length
            start at and the training tokens before it (0, 0: one length from step 0). The data position is counted
            in tokens: step ``s`` reads the blocks of :func:`data_step` ``(plan, s)``.
    """

    global_batch_size: int
    eval_batch_size: int
    seq_length: int
    steps_per_epoch: int
    total_steps: int
    num_train_blocks: int
    has_eval: bool
    streaming: bool = False
    num_eval_blocks: int = 0
    phase_start_step: int = 0
    tokens_before_phase: int = 0


def data_step(plan, step: int) -> int:
    """The step of ``plan``'s blocks that global step ``step`` reads: ``step`` itself, or after a change of length
    (a context-extension phase) ``tokens_before_phase // (global batch x seq_length) + step - phase_start_step``:
    the data goes on at the token the earlier phases reached, in blocks of the new length (epochs stay passes over
    the data's tokens)."""
    start, before = int(getattr(plan, "phase_start_step", 0) or 0), int(getattr(plan, "tokens_before_phase", 0) or 0)
    if not before:
        return int(step)
    return before // (int(plan.global_batch_size) * int(plan.seq_length)) + int(step) - start


def tokens_seen(plan, step: int) -> int:
    """Training tokens of steps 0..``step`` of ``plan``: the earlier phases' (``tokens_before_phase``) and the
    current length's steps (``(step - phase_start_step) x global batch x seq_length``)."""
    start, before = int(getattr(plan, "phase_start_step", 0) or 0), int(getattr(plan, "tokens_before_phase", 0) or 0)
    return before + (int(step) - start) * int(plan.global_batch_size) * int(plan.seq_length)


def run_progress(plan, step: int, passes: Optional[int] = None, digits: Optional[int] = 4) -> Dict[str, Any]:
    """Where global step ``step`` of ``plan`` (a :class:`RunPlan`, or anything with its ``steps_per_epoch`` and
    ``streaming``) is in the data, for log entries, ``trainer_state.json`` and the results: ``{"epoch": step /
    steps_per_epoch}`` (the :func:`data_step` after a change of length) (rounded to ``digits`` places; ``None``: not rounded); a ``--streaming`` run's
    ``{"stream_passes": passes}``, the passes over the stream completed (:meth:`Backend.data_passes`, the summary's
    figure), ``{}`` when not counted: a stream has no length, so ``step / max_steps`` is no epoch."""
    if getattr(plan, "streaming", False):
        return {} if passes is None else {"stream_passes": int(passes)}
    epoch = data_step(plan, step) / plan.steps_per_epoch
    return {"epoch": epoch if digits is None else round(epoch, digits)}


@dataclasses.dataclass
class CheckpointInfo:
    """What a checkpoint says about the run that wrote it (read without building a model).

    Attributes:
        path: what :meth:`Backend.restore` accepts (TF: a ``ckpt-N`` prefix; torch: a ``checkpoint-N/`` folder).
        global_step: optimizer steps done when it was written.
        model_config: shape fields (``hidden_size``, ``num_hidden_layers``, ``num_attention_heads``,
            ``intermediate_size``, ``vocab_size``, ``max_position_embeddings``) when recorded, else ``{}``.
        trainer_state: the ``trainer_state.json`` saved with it (a dict), or ``None`` for older checkpoints.
    """

    path: str
    global_step: int
    model_config: Dict[str, Any]
    trainer_state: Optional[Dict[str, Any]] = None


@runtime_checkable
class Backend(Protocol):
    """A training backend (TensorFlow, torch_xla). See the module doc for the order of calls.

    Attributes:
        name: ``"tensorflow"`` or ``"torch_xla"`` (written into ``training_summary.json``).
        callback_kind: the callback framework the backend drives (``"tf_keras"`` or ``"torch"``).
        supports_tfrecord: whether ``--train_file`` may be ``hf-tpu prepare-data`` TFRecord shards.
        needs_remote_data: the accelerator reads data from Cloud Storage only (a TPU Node).
        num_replicas: data-parallel replicas (after :meth:`setup`).
        is_chief: whether this process writes files and talks to the Hub (after :meth:`setup`).
        processes_to_spawn: > 0 when :meth:`setup` decided that the run goes on in that many new processes
            (:meth:`spawn`); 0 to train in this one.
        checks_interrupts: :meth:`fit` honours a signal as a save (the training run then runs it inside
            :func:`hf_tpu_ext.interrupts.deferring`): at each step boundary it looks at
            :func:`hf_tpu_ext.interrupts.received`; once set, it finishes that step's logging, evaluation and
            checkpoint as scheduled, writes a checkpoint of that step if none was (calling ``on_save``, which
            writes the run's trainer state and pushes it), and raises ``KeyboardInterrupt`` via
            :func:`hf_tpu_ext.interrupts.check` -- never inside a step or a checkpoint write. TensorFlow: the loop
            breaks; transformers ``Trainer``: a ``TrainerCallback`` sets ``control.should_save`` and
            ``should_training_stop`` in ``on_step_end``; Keras 3 ``model.fit``: a callback sets
            ``model.stop_training`` in ``on_train_batch_end``, then the backend saves. False: a first signal
            raises ``KeyboardInterrupt`` wherever the backend is (the steps since the last save are lost).
        scores_probes: each evaluation also scores ``--probe_file`` (the run then evaluates at the end).
        loaded_best: :meth:`fit` put the best evaluation's weights into the model (``load_best_model_at_end``).
        best_model_checkpoint: where the best evaluation's weights are kept, or None (``trainer_state.json``).
        restored_fit_metrics: the ``fit`` metrics the restored checkpoint recorded (a resume that only finishes
            the export reports them), or None.
        export_replaces: patterns (fnmatch, ``/`` separators) of the model-folder files :meth:`export` replaces (a
            new file renamed into place, never rewritten in place): a push hard-links them into its snapshot instead
            of copying them (the weights written once more per pushed save, not twice); ``()``: copied.
        reads_block_shards: ``--train_file`` may be ``hf-tpu prepare-data --shard_format arrow`` block shards
            (read row by row, :mod:`hf_tpu_ext.data.block_shards`).
    """

    name: str
    callback_kind: str
    supports_tfrecord: bool
    needs_remote_data: bool
    num_replicas: int
    is_chief: bool
    processes_to_spawn: int
    checks_interrupts: bool
    scores_probes: bool
    loaded_best: bool
    best_model_checkpoint: Optional[str]
    restored_fit_metrics: Optional[Dict[str, Any]]
    export_replaces: Tuple[str, ...]
    reads_block_shards: bool

    def setup(self, training_args) -> None:
        """Pick devices/strategy; nothing is written. Raises ``BackendError``/``ArgumentError``."""

    def spawn(self, fn: Callable[..., None], args: tuple) -> None:
        """Run ``fn(index, *args)`` in :attr:`processes_to_spawn` new processes and wait for them."""

    def device_summary(self) -> Dict[str, Any]:
        """``accelerator``, ``num_devices``, ``strategy``, ``num_replicas``, ``num_workers`` for the summary."""

    def find_checkpoints(self, folder: str) -> List[str]:
        """Checkpoints of a run folder (or a checkpoint folder), newest first; ``[]`` when none."""

    def checkpoint_info(self, path: str) -> CheckpointInfo:
        """Read and verify one checkpoint (every file readable, not truncated).

        Raises:
            CheckpointError: it cannot be read; the message names the file.
        """

    def is_checkpoint_folder(self, folder: str) -> bool:
        """Whether a downloaded Hub ``last-checkpoint/`` folder holds a checkpoint of this backend."""

    def build(self, model_args, data_args, training_args, tokenizer, blocks, plan: RunPlan) -> None:
        """Build the model, optimizer and datasets (no files written)."""

    def restore(self, path: str) -> int:
        """Restore weights and optimizer state; returns the global step. Raises ``CheckpointError``."""

    def run_context(self) -> Any:
        """The object a callback's ``from_run(run)`` reads (model, tokenizer, sizes, ...)."""

    def fit(self, callbacks: list, on_save: SaveHook, start_step: int,
            log_history: List[Dict[str, Any]]) -> Dict[str, Any]:
        """Train from ``start_step`` to ``plan.total_steps``; the final step is always checkpointed.

        Args:
            callbacks: built callback instances of :attr:`callback_kind`.
            on_save: called after every checkpoint (the final one included) with the step, the checkpoint's path
                and the files a push of it takes (:data:`SaveHook`).
            start_step: the restored global step (0 for a fresh run).
            log_history: the run's log history so far; the backend appends its log entries to this list.

        Returns:
            Metrics of this process's training segment: ``train_runtime`` (s), ``train_tokens_per_second``,
            ``train_steps_per_second``, ``train_samples_per_second``, ``global_step`` (and backend extras).
        """

    def current_step(self) -> int:
        """Optimizer steps done so far (read when a signal stops the run)."""

    def end_training(self, logs: Dict[str, Any]) -> None:
        """Fire the callbacks' ``on_train_end`` if the backend's loop did not (after the outputs are written)."""

    def evaluate(self) -> Dict[str, float]:
        """``eval_loss``, ``perplexity``, ``eval_accuracy`` on the whole validation split ({} without one)."""

    def export(self, folder: str, tokenizer) -> List[str]:
        """Write ``config.json``, ``model.safetensors`` (PyTorch names) and the tokenizer into ``folder``."""

    def checkpoint_state_file(self, path: str) -> str:
        """Where the run's ``trainer_state.json`` of checkpoint ``path`` is kept (the run writes it there).

        A checkpoint is one unit (weights, optimizer, data position, this state): until the state is written the
        checkpoint must not count as a resume point -- :meth:`checkpoint_info` raises ``CheckpointError`` for it
        and :meth:`remove_incomplete_checkpoints` deletes it.
        """

    def remove_incomplete_checkpoints(self, output_dir: str) -> List[str]:
        """Delete the leftovers of a save or export that was killed (incomplete checkpoints, temp folders and
        files) in a run's ``output_dir``; complete checkpoints stay. Returns the paths removed (relative)."""

    def checkpoint_files(self, path: str, with_state: bool = False) -> Dict[str, Union[str, bytes]]:
        """The files a push uploads of checkpoint ``path`` (Hub ``last-checkpoint/`` or ``checkpoint-<step>/``), so
        that folder restores on its own: ``{name in the pushed folder: local file}``, names with ``/`` separators;
        a ``bytes`` value is a small file's content (TensorFlow's ``checkpoint`` state file naming this checkpoint
        alone). Nothing is written: the push queue hard-links the files when the save is queued (the checkpoint
        is pushed as written). ``with_state``: the run's trainer state (:meth:`checkpoint_state_file`) is listed
        even before it is written -- what a save hands to ``on_save``, which writes it before any push takes the
        files. Called by the run for a checkpoint found on disk (the final push, a signal's); a save hands its own
        to ``on_save``. Raises ``CheckpointError`` when ``path`` is not a checkpoint."""

    def model_config(self) -> Any:
        """The built model's ``PretrainedConfig`` (for the FLOPs count)."""

    def model_summary(self) -> Dict[str, Any]:
        """``num_parameters``, ``model_type``, ``model_config``, ``optimizer`` (text), ``jit_compile``,
        ``steps_per_execution``, ``compiler`` (the compiler path in words) and optionally ``precision`` (the run's
        ``PrecisionPlan.precision``; without it the summary reads ``--bf16``) for ``training_summary.json``."""

    def data_passes(self, step: int) -> Optional[int]:
        """With ``--streaming``: the passes over this process's slice of the stream completed after ``step`` steps
        (the stream's own count; a stream has no epochs of known length); ``None`` when not streaming or unknown."""


class BackendDefaults:
    """The optional members of :class:`Backend` with their "not supported" values, for a backend to inherit.

    No spawning, no deferred signals, no probe scoring, no best model; :meth:`current_step` 0 and
    :meth:`end_training` nothing until the subclass says otherwise.
    """

    processes_to_spawn = 0
    checks_interrupts = False
    export_replaces: Tuple[str, ...] = ()

    def remove_incomplete_checkpoints(self, output_dir: str) -> List[str]:
        return []
    scores_probes = False
    loaded_best = False
    best_model_checkpoint: Optional[str] = None
    restored_fit_metrics: Optional[Dict[str, Any]] = None
    reads_block_shards = False

    def spawn(self, fn, args) -> None:
        raise NotImplementedError(f"{type(self).__name__} trains in the calling process (processes_to_spawn is 0).")

    def current_step(self) -> int:
        return 0

    def end_training(self, logs: Dict[str, Any]) -> None:
        return None

    def data_passes(self, step: int) -> Optional[int]:
        return None
