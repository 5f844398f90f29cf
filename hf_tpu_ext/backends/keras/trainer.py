"""The Keras backend's one trainer, on JAX (:class:`JaxTrainer`), behind :class:`hf_tpu_ext.backends.loop.StepBackend`.

The loop itself (cadence, logging window, best model, signal save, final checkpoint) is the one of
:mod:`hf_tpu_ext.backends.loop`. Here: the train state and where it lives, the compiled steps, and the state's
saves. One device call runs ``N = --steps_per_execution`` optimizer steps
(:func:`hf_tpu_ext.backends.keras.step.make_multi_step`: a ``lax.fori_loop`` over ``N`` stacked global batches
inside the one jitted program); its batches are built and put on the devices by a background thread two calls
ahead (:class:`hf_tpu_ext.data.numpy_batches.Prefetcher`); several processes agree on a signal at each call
boundary.

One direction: the backend builds the trainer with everything it reads (model, optimizer, placement, batch source,
schedule, evaluation, writers, checkpoint target) and calls its methods; the trainer never reads the backend. The
state is put on the devices at one call site (:meth:`JaxTrainer._place_state`:
:mod:`~hf_tpu_ext.backends.keras.placement`) and written at one (:meth:`JaxTrainer.save`:
:func:`hf_tpu_ext.backends.keras.checkpoint.write_checkpoint`).
"""

from __future__ import annotations

import contextlib
import logging
import signal
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any, Callable, Dict, Iterable, Iterator, List, Optional, Tuple

import numpy as np

from hf_tpu_ext import interrupts
from hf_tpu_ext.backends.base import SaveHook
from hf_tpu_ext.backends.keras import checkpoint as ckpt
from hf_tpu_ext.backends.keras.architectures.name_table import renamed_paths
from hf_tpu_ext.backends.keras.best import save_best_weights
from hf_tpu_ext.backends.keras.step import (CompileCounter, jit_eval_step, jit_train_step, make_eval_step,
                                            make_multi_step, make_train_step, split_micro_batches)
from hf_tpu_ext.backends.keras.stream_state import data_state_files
from hf_tpu_ext.backends.keras.tensor_files import (bound_to_checkpoint, bound_variables, drain, gathered_in_turn,
                                                    variables_from_arrays)
from hf_tpu_ext.data.numpy_batches import Prefetcher
from hf_tpu_ext.distributed import OWN_LINE
from hf_tpu_ext.errors import CheckpointError

logger = logging.getLogger("hf_tpu_ext")

#: checkpoint keys of the model's non-trainable variables (by position)
NON_TRAINABLE_PREFIX = "non_trainable/"


def stack_batches(batches: List[Dict[str, np.ndarray]], steps: int) -> Dict[str, np.ndarray]:
    """``steps`` batches ``[A, B/A, ...]`` as one ``[steps, A, B/A, ...]`` batch; missing ones (a short call) are
    zeros, never trained on (the call's step count stops the loop before them)."""
    out = {}
    for key in batches[0]:
        values = [b[key] for b in batches]
        values += [np.zeros_like(values[0])] * (steps - len(values))
        out[key] = np.stack(values)
    return out


@dataclass(frozen=True)
class CheckpointTarget:
    """Where and with what the trainer writes ``checkpoint-<step>/`` and the best weights.

    Attributes:
        output_dir: the run folder (``checkpoint-<step>/``, ``checkpoints/best/``).
        keep: ``--save_total_limit`` (None: every checkpoint stays).
        writes: whether this process writes files (process 0; every process takes part in the device reads).
        facts: ``facts(step) -> dict``: the run's fields of ``checkpoint.json`` at a step (epoch, model config,
            data position, versions, ``--optim``).
    """

    output_dir: str
    keep: Optional[int]
    writes: bool
    facts: Callable[[int], Dict[str, Any]]


class JaxTrainer:
    """The train state ``(trainable, non_trainable, optimizer variables)`` (placed by ``placement``), the global
    step reached, the compiled train/eval steps (built here, once) and their saves; the step loop's side
    (:class:`~hf_tpu_ext.backends.loop.StepBackend`).

    Args:
        model: the built Keras model (``stateless_call``; its variables are written back by
            :meth:`write_variables`); ``model.train_function`` is set to the compiled step (the recompile guard).
        optimizer: the built Keras optimizer (``stateless_apply``).
        placement: the :class:`~hf_tpu_ext.backends.keras.placement.Placement` of the state and the batches.
        batches: ``batches(step) -> {key: [B_local, ...]}``: this process's rows of global step ``step``'s batch.
        schedule: the learning-rate schedule (``value(step) -> float``).
        evaluate: ``evaluate() -> metrics`` of the step loop's evaluations (the backend's, probes included).
        summary_writer: the TensorBoard writer (``scalars(entry)``), or None.
        checkpoints: where the saves go (:class:`CheckpointTarget`).
        bf16_dots: the run's :class:`~hf_tpu_ext.precision.PrecisionPlan` ``bf16_dots`` (XLA:CPU dot routing).
        seed: the run's seed (dropout keys); accumulation: micro-batches ``A`` per step (>= 1).
        steps_per_execution: ``N``, optimizer steps per device call (>= 1); the step loop and the stacked batches
            use this one value.
        config: the model's transformers config (names each weight's dimensions for ``--fsdp``'s rules table,
            :mod:`hf_tpu_ext.backends.keras.sharding`).
        gradient_checkpointing: ``--gradient_checkpointing`` (each encoder layer rematerialized in the backward
            pass: :mod:`hf_tpu_ext.backends.keras.architectures.remat`).
    """

    def __init__(self, model, optimizer, placement, *, batches: Callable[[int], Dict[str, np.ndarray]], schedule,
                 evaluate: Callable[[], Dict[str, float]], summary_writer, checkpoints: CheckpointTarget,
                 bf16_dots: bool, seed: int, accumulation: int, steps_per_execution: int,
                 gradient_checkpointing: bool = False, config=None):
        self.model, self.optimizer, self.placement = model, optimizer, placement
        self._batches, self._schedule, self._evaluate = batches, schedule, evaluate
        self._summary_writer, self._checkpoints = summary_writer, checkpoints
        self._config, self._written_state = config, None
        self._saved: Optional[tuple] = None  # (state, checkpoint folder, model keys) of the last save or restore
        self.accumulation = int(accumulation)
        self.steps_per_execution = int(steps_per_execution)  # StepLoop reads it: one value for loop and batches
        self._step = 0
        self._on_save: Optional[SaveHook] = None
        self._compiles = CompileCounter("train_step")
        step = make_train_step(model, optimizer, int(seed), self.accumulation, bf16_dots=bf16_dots,
                               gradient_checkpointing=gradient_checkpointing, grad_sharding=placement.grad_sharding,
                               weight_use=placement.gather_for_use, weight_update=placement.gather_updated)
        n = self.steps_per_execution
        self._train_step = jit_train_step(make_multi_step(step, n) if n > 1 else step, placement)
        self._eval_step = jit_eval_step(make_eval_step(model, bf16_dots=bf16_dots))
        model.train_function = self._train_step  # the recompile guard watches this function
        self._state = self._place_state()

    # ------------------------------------------------------------------ state <-> Keras variables
    def _variables(self):
        return self.model.trainable_variables, self.model.non_trainable_variables, self.optimizer.variables

    def _place_state(self) -> tuple:
        """The train state from the Keras variables, on the devices (the one placement of the state). Under
        ``--fsdp`` the variables are then bound to the placed arrays (:meth:`_bind_variables`)."""
        state = self.placement.put_state(*self._variables(), config=self._config)  # --fsdp: sharded
        if self.placement.strategy is not None:
            self._bind_variables(state)
        return state

    def _bind_variables(self, state: tuple) -> None:
        """The Keras variables hold ``state``'s arrays themselves (``--fsdp``): the whole copy each process built
        the model with, on its default device, is freed, so a device holds its shards only. Nothing reads the
        variables while the loop trains (donation deletes those arrays at the next step); :meth:`write_variables`
        binds them again to the state reached."""
        self._assign_variables(state, state)

    def _assign_variables(self, values: tuple, state: tuple) -> None:
        """``values`` (``(trainable, non_trainable, optimizer)``, arrays or NumPy) into the Keras variables, which
        then hold ``state``."""
        for variables, part in zip(self._variables(), values):
            for var, value in zip(variables, part):
                var.assign(value)
        self._written_state = state

    def write_variables(self) -> None:
        """Write the train state back into the Keras variables (fit's end, callbacks reading weights), one array on
        the host at a time; once per state. Under ``--fsdp`` (one process or several) the variables are bound to
        the state's arrays: no host copy (an export reads them through :meth:`bound_weights`)."""
        if self._state is self._written_state:
            return
        if self.placement.strategy is not None:  # no host copy: the variables read the sharded arrays
            self._bind_variables(self._state)
            return
        for variables, values in zip(self._variables(), self._state):
            variables_from_arrays(variables, values)
        self._written_state = self._state

    def _sharded_over_processes(self) -> bool:
        return any(not (a.is_fully_addressable or a.is_fully_replicated) for part in self._state for a in part)

    @contextlib.contextmanager
    def bound_weights(self) -> Iterator[None]:
        """Inside the block the model's variables read the train state (the export): its arrays themselves, each
        copied to the host only when its tensor is written (:func:`~.tensor_files.bound_variables`). A state
        sharded over processes (process 0 exports alone): each weight read from the blocks all processes wrote at
        its checkpoint (:func:`~.tensor_files.bound_to_checkpoint`; fit ends with one).

        Raises:
            CheckpointError: a state sharded over processes that no checkpoint holds (saved after the last step)."""
        if self._sharded_over_processes():
            state, path, keys = self._saved if self._saved is not None else (None, None, None)
            if state is not self._state or path is None:
                raise CheckpointError("An export of a state sharded over processes reads it from its checkpoint; "
                                      "this state was not saved: save a checkpoint first (every process).")
            with bound_to_checkpoint([*self.model.trainable_variables, *self.model.non_trainable_variables],
                                     [*state[0], *state[1]], path, keys, ckpt.MODEL_STEM):
                yield
            return
        with bound_variables([*self.model.trainable_variables, *self.model.non_trainable_variables],
                             [*self._state[0], *self._state[1]]):
            yield

    def _named_state(self) -> Tuple[Dict[str, Any], Dict[str, Any]]:
        """``(model variables, optimizer variables)`` by checkpoint name: the state's arrays as they are (any
        sharding; each process writes the blocks it holds; none is gathered)."""
        trainable, non_trainable, opt = self._state
        # trainable variables by path (keras-hub names every layer); non-trainable ones (dropout seed states,
        # auto-numbered "seed_generator_N" per process) and the optimizer's by position
        model_vars = {var.path: value for var, value in zip(self.model.trainable_variables, trainable)}
        model_vars.update({f"{NON_TRAINABLE_PREFIX}{i:05d}": value for i, value in enumerate(non_trainable)})
        opt_vars = {f"{i:05d}/{var.path}": value for i, (var, value) in enumerate(zip(self.optimizer.variables, opt))}
        return model_vars, opt_vars

    def restore(self, path: str, optim: str) -> Dict[str, Any]:
        """Read a checkpoint's weights and optimizer state onto the train state's shardings (whatever device count
        or mesh it was saved from: :func:`~hf_tpu_ext.backends.keras.checkpoint.restore_state`); returns its
        ``checkpoint.json`` (``global_step``: the step reached now). The Keras variables follow at
        :meth:`write_variables`.

        Args:
            path: the ``checkpoint-<step>/`` folder. optim: this run's ``--optim`` (named when it does not fit).

        Raises:
            CheckpointError: a file is unreadable, or a variable is missing or of another shape (named).
        """
        meta = ckpt.read_meta(path)
        variables = self._variables()
        targets = [[SimpleNamespace(shape=tuple(a.shape), dtype=a.dtype, sharding=a.sharding) for a in part]
                   for part in self._state]
        # an older checkpoint's variable paths renamed to the model's (e.g. RoBERTa before the shared encoder)
        saved = renamed_paths({k: (k, s) for k, s in ckpt.state_shapes(path, ckpt.MODEL_STEM).items()},
                              getattr(self.model, "legacy_paths", ()))
        names = [var.path for var in variables[0]] + [f"{NON_TRAINABLE_PREFIX}{i:05d}" for i in range(len(variables[1]))]
        model_targets = {}
        for key, var, target in zip(names, [*variables[0], *variables[1]], [*targets[0], *targets[1]]):
            old, shape = saved.get(key, (None, None))
            if old is None or tuple(shape) != tuple(var.shape):
                raise CheckpointError(
                    f"Checkpoint {path} does not fit the model: variable {var.path} "
                    f"{'is missing' if old is None else f'has shape {tuple(shape)}, the model {tuple(var.shape)}'}.")
            model_targets[old] = target
        opt_saved = ckpt.state_shapes(path, ckpt.OPTIMIZER_STEM)
        ordered = sorted(opt_saved)  # by position
        if len(ordered) != len(variables[2]) or any(
                tuple(opt_saved[k]) != tuple(v.shape) for k, v in zip(ordered, variables[2])):
            trained = (f"trained with --optim {meta['optim']}" if meta.get("optim") not in (None, optim)
                       else f"its optimizer state has {len(ordered)} variables, --optim {optim} {len(variables[2])}")
            raise CheckpointError(f"--optim {optim} contradicts the checkpoint {path} ({trained}): drop "
                                  "--optim or start a new run in another --output_dir.")
        values = list(ckpt.restore_state(path, model_targets, ckpt.MODEL_STEM).values())
        values += list(ckpt.restore_state(path, dict(zip(ordered, targets[2])), ckpt.OPTIMIZER_STEM).values())
        split = (len(variables[0]), len(variables[0]) + len(variables[1]))
        self._state = (values[: split[0]], values[split[0]: split[1]], values[split[1]:])
        if self.placement.strategy is not None:  # the arrays placed at construction freed
            self._bind_variables(self._state)
        self._saved = (self._state, path, list(model_targets))  # an export before any step reads it from there
        self._step = int(meta["global_step"])
        return meta

    # ------------------------------------------------------------------ the backend's calls
    def start(self, step: int, on_save: SaveHook) -> None:
        """A training segment from global ``step``; ``on_save(step, path, files)`` after each checkpoint written."""
        self._step, self._on_save = int(step), on_save

    def sharding_fields(self) -> Dict[str, Any]:
        """``training_summary.json``'s ``fsdp``, ``mesh``, state bytes per device and the compiled step's memory
        (:meth:`~hf_tpu_ext.backends.keras.placement.Placement.summary_fields` of this state)."""
        return self.placement.summary_fields(self._state)

    def current_step(self) -> int:
        """The global step the state has reached."""
        return self._step

    @contextlib.contextmanager
    def counting_compiles(self) -> Iterator[None]:
        """Count XLA's compilations of the train step while inside (JAX's events): :meth:`compile_figures`."""
        self._compiles = CompileCounter("train_step")  # this segment's
        with self._compiles:
            yield

    def compile_figures(self) -> Dict[str, Any]:
        """The train step's XLA compilations in this segment (``xla_step_compilations``: 1 = compiled once) and
        their seconds (``xla_step_compile_seconds``)."""
        return {"xla_step_compilations": int(self._compiles.count),
                "xla_step_compile_seconds": round(float(self._compiles.seconds), 3)}

    def eval_sums(self, batch: Dict[str, np.ndarray]) -> Tuple[float, float, float]:
        """``(loss sum, correct, count)`` of one host evaluation batch ``[B, ...]`` (this process's rows)."""
        out = self._eval_step(self._state[0], self._state[1], self.placement.put_batch(batch, axis=0))
        return tuple(float(x) for x in out)

    def on_weights(self, function: Callable, arrays: List[np.ndarray]):
        """``function(trainable, non_trainable, *arrays)`` on the current weights, ``arrays`` replicated on the
        devices (``--probe_file``'s jitted forward pass); its result as ``function`` returns it."""
        return function(self._state[0], self._state[1], *self.placement.put_replicated(arrays))

    def lower_train_step(self, batch: Dict[str, np.ndarray]):
        """The compiled train step lowered (``jax.stages.Lowered``) on the state and one host batch
        ``[A, B/A, ...]`` (``N`` = 1): the program a run compiles, for the HLO guard (benchmarks/step_hlo.py)."""
        return self._train_step.lower(self._state, self.placement.put_batch(batch, axis=1), np.int32(0))

    # ------------------------------------------------------------------ the step loop's side (StepBackend)
    def open_batches(self, calls: Iterable[Tuple[int, int]]):
        return Prefetcher(self.produce, calls, depth=2)

    def produce(self, item: Tuple[int, int]):
        """The device batch of one call (runs in the prefetch thread)."""
        start, k = item
        micro = [split_micro_batches(self._batches(s), self.accumulation) for s in range(start, start + k)]
        if self.steps_per_execution == 1:
            return self.placement.put_batch(micro[0], axis=1)
        return self.placement.put_batch(stack_batches(micro, self.steps_per_execution), axis=2)

    def run_steps(self, batch, start: int, k: int) -> np.ndarray:
        """Run ``k`` optimizer steps from global step ``start``; their mean losses (float64 ``[k]``), once done."""
        if self.steps_per_execution == 1:
            self._state, loss_sum, count = self._train_step(self._state, batch, np.int32(start))
            sums, counts = [float(loss_sum)], [float(count)]
        else:
            self._state, loss_sums, cnts = self._train_step(self._state, batch, np.int32(start), np.int32(k))
            sums, counts = np.asarray(loss_sums, np.float64)[:k], np.asarray(cnts, np.float64)[:k]
        self._step = start + k
        return np.asarray(sums, np.float64) / np.maximum(np.asarray(counts, np.float64), 1.0)

    def learning_rate(self, step: int) -> float:
        return self._schedule.value(step)

    def evaluate(self) -> Dict[str, float]:
        return self._evaluate()

    def write_scalars(self, entry: Dict[str, Any]) -> None:
        if self._summary_writer is not None:
            self._summary_writer.scalars(entry)

    def save(self, step: int, fields: Dict[str, Any]) -> None:
        """``checkpoint-<step>/`` (every process writes the blocks of the state it holds; process 0 the rest, and
        the ``--streaming`` positions every process gathers) with the run's facts and the loop's ``fields``
        (:meth:`~hf_tpu_ext.backends.loop.StepLoop.checkpoint_fields`: ``loss_window``, ``fit_metrics``, to which
        the compile figures are added), then ``on_save`` with the files a push of it takes (the run's trainer
        state completes it)."""
        model_vars, opt_vars = self._named_state()
        data_states = data_state_files(self._batches, self.placement, step)  # --streaming: a collective
        target = self._checkpoints
        meta = {**target.facts(step), **(fields or {})}  # the loop's: the logging window, what was measured
        if "fit_metrics" in meta:
            meta["fit_metrics"] = {**meta["fit_metrics"], **self.compile_figures()}
        # every process writes the blocks it holds (a collective); the folder's path on process 0, None elsewhere
        saved = ckpt.write_checkpoint(target.output_dir, step, model_vars, opt_vars, meta, keep=target.keep,
                                      extra_files=data_states)
        path, files = saved if saved is not None else (None, None)  # files: what a push of it takes, handed up
        self._saved = (self._state, path, list(model_vars))  # process 0's export of this state reads its blocks
        if path is None:
            return
        interrupts.kill_for_test("checkpoint_weights", step)  # weights written, trainer state not yet
        self._on_save(step, path, files)
        logger.info("saved checkpoint %s", path)  # complete only now: its trainer state is written

    def keep_best(self, step: int, key: str, value: float) -> None:
        """The new best evaluation's trainable weights into ``checkpoints/best/`` (process 0 writes)."""
        # one weight on the host at a time; one sharded over processes gathered by a collective every process
        # takes part in, in the writer's order
        weights = gathered_in_turn({var.path: w for var, w in zip(self.model.trainable_variables, self._state[0])})
        if self._checkpoints.writes:
            save_best_weights(self._checkpoints.output_dir, step, key, value, weights)
        elif self._sharded_over_processes():
            drain(weights)

    def signalled(self) -> bool:
        """Whether a SIGINT/SIGTERM was seen (:func:`hf_tpu_ext.interrupts.received`) by any process.

        Several processes agree (:meth:`~hf_tpu_ext.backends.keras.placement.Placement.any_process`, called by all
        at the same call boundary): a signal seen by one stops all at this step; a process that saw none records a
        SIGTERM, so every process saves the one checkpoint and exits 143."""
        seen = self.placement.any_process(interrupts.received() is not None)
        if seen and interrupts.received() is None:
            logger.info("another process received a signal: stopping at step %d with it", self._step,
                        extra=OWN_LINE)  # only this process knows: tagged [process i] on the others
            interrupts.record(signal.SIGTERM)
        return seen
