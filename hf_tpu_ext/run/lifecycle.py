"""``hf-tpu train`` as one backend-neutral, resumable run: checks -> data -> fit -> export -> card -> push -> Space.

:class:`TrainingRun` owns the whole lifecycle once, for every backend (a :class:`hf_tpu_ext.backends.base.Backend`
only builds the model, fits, saves/restores checkpoints and exports), one method per phase; the jobs it calls live
beside it in :mod:`hf_tpu_ext.run`:

1. **checks** (nothing written yet; :meth:`TrainingRun.check`, :mod:`~hf_tpu_ext.run.checks`): arguments
   (finite numbers), output folder (empty or resumable, writable), backend packages, callback names, data files,
   Hub access (:mod:`~hf_tpu_ext.run.pushes`: the pusher's preflight), the checkpoint to resume from
   (:mod:`~hf_tpu_ext.run.resume`: newest readable one; its tokenizer and model shape win over flags left at
   their defaults, a flag that contradicts it is an error), data and split sizes (:meth:`TrainingRun.data`,
   :mod:`~hf_tpu_ext.run.data`);
2. **train** (:meth:`TrainingRun.fit`): the backend's ``fit``; after every checkpoint
   (:meth:`TrainingRun.checkpoint`) the run saves ``trainer_state.json`` with it (log history, best metric and
   step, epoch, tokens seen, wall time so far; :mod:`~hf_tpu_ext.run.state`, :mod:`~hf_tpu_ext.run.history`) and
   hands it to the pusher;
3. **export** (:meth:`TrainingRun.export`, :mod:`~hf_tpu_ext.run.files`): model folder + ``training_args.json``,
   ``trainer_state.json``, ``all_results.json``, ``training_summary.json``, ``loss_curve.png``;
4. **card** (:meth:`TrainingRun.card`): ``README.md``;
5. **push** (:meth:`TrainingRun.push`): the final push, waited for; its report goes into ``training_summary.json``;
6. **space** (:meth:`TrainingRun.space`): the fill-mask demo Space.

Which phases are done is kept in ``output_dir/run_state.json`` (:data:`~hf_tpu_ext.run.state.RUN_STATE_NAME`), so
``--resume_from_checkpoint true`` after a kill finishes what the killed process did not (a missing export, a
final push the Hub lacks) instead of stopping at "nothing to train".

Signals (:mod:`hf_tpu_ext.interrupts` owns them): a first SIGINT (Ctrl-C) or SIGTERM is a save. The backend's
loop stops at the next step boundary and checkpoints that step (with its trainer state; pushed as
``last-checkpoint/`` with ``--hub_strategy checkpoint``), the pushes are waited for within the grace budget
``--save_on_signal_timeout`` (counted from the signal; what did not land is logged and written into
``training_summary.json`` ``interrupted``), and :class:`~hf_tpu_ext.errors.TrainingInterrupted` carries the one
line telling how to resume (:func:`hf_tpu_ext.console.resume_hint`; before the first checkpoint, how to rerun:
:func:`~hf_tpu_ext.console.rerun_hint`) and the signal (exit status 128 + signum: 130,
143). A signal during the final push lets it finish within the same budget. A second signal stops every wait at
once. Any error raised after a signal is reported as the interruption.

Test hook: the environment variable ``HF_TPU_EXT_TEST_KILL_AT`` (:data:`KILL_ENV`) set to a phase name
(``data``: the data are ready, the model is not built; ``train``: after the first checkpoint; ``checkpoint_weights``: a checkpoint's weight files are written, its
trainer state is not; ``checkpoint``: after the last checkpoint, before the export;
``export``: half-way through the export; ``card``: after the card is written; ``push``: while the final
push is in flight) makes the process SIGKILL itself there. Only the tests set it.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import time
from typing import Any, Dict, List, Optional

from hf_tpu_ext import interrupts
from hf_tpu_ext.backends import make_backend
from hf_tpu_ext.backends.base import run_progress
from hf_tpu_ext.callbacks import build_callbacks
from hf_tpu_ext.console import rerun_hint, resume_hint
from hf_tpu_ext.errors import CheckpointError, HubPushError, OutputDirError, TrainingInterrupted
from hf_tpu_ext.hub.checkpoint_layouts import save_failure_message
from hf_tpu_ext.hub.space import deploy_space
from hf_tpu_ext.outputs import read_all_results
from hf_tpu_ext.run import checks, data, files, history, pushes, resume, state
from hf_tpu_ext.run_lock import SPAWNED_CHILD_ENV, lock_output_dir

logger = logging.getLogger("hf_tpu_ext")

KILL_ENV = interrupts.KILL_ENV


def setup_logging(level=logging.INFO):
    """A stream handler on the ``hf_tpu_ext`` logger (once)."""
    if not logging.getLogger("hf_tpu_ext").handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s", "%H:%M:%S"))
        root = logging.getLogger("hf_tpu_ext")
        root.addHandler(handler)
        root.setLevel(level)
        root.propagate = False


class TrainingRun:
    """One ``hf-tpu train`` run (see the module doc for the phases and the order of checks).

    Args:
        model_args, data_args, training_args: the parsed :mod:`hf_tpu_ext.args` dataclasses.
        backend: a :class:`~hf_tpu_ext.backends.base.Backend` (default: from ``--backend``).
        argv: the command line, for the resume hint of an interrupted run (default: ``sys.argv``).
    """

    def __init__(self, model_args, data_args, training_args, backend=None, argv: Optional[List[str]] = None):
        self.model_args, self.data_args, self.args = model_args, data_args, training_args
        self.backend = backend
        self.argv = argv
        self.pusher = None
        self.token = None
        self.log_history: List[Dict[str, Any]] = []
        self.step = 0
        self.prior_runtime = 0.0
        self._tmp_dirs: List[str] = []
        self._resume_download = None  # (temp folder, repo spec) of a Hub resume: messages show the spec
        self.push_report: Optional[Dict[str, Any]] = None
        self.run_state: Dict[str, Any] = {}
        self.plan = None
        self._process_id = f"{os.getpid()}-{time.time():.0f}"  # this process's entry in run_state hub_pushes

    # ------------------------------------------------------------------ checks before any file is written
    def check(self) -> None:
        """The checks before the backend is set up (:mod:`hf_tpu_ext.run.checks`); the output folder is locked
        after the arguments' own checks, before anything reads it."""
        check_args = (self.model_args, self.data_args, self.args)
        checks.check_arguments(*check_args)
        if getattr(self.args, "config_note", None):  # a JSON config's hub fields left unused by --push_to_hub false
            logger.info("%s", self.args.config_note)
        # first: a second run on a busy folder is refused before it reads or writes anything there
        self._lock = lock_output_dir(self.args.output_dir)
        checks.check_run(*check_args)

    @property
    def callback_names(self) -> List[str]:
        return checks.callback_names(self.args)

    def _open_pusher(self) -> None:
        """Token and Hub pusher before any data or compute work (:func:`hf_tpu_ext.run.pushes.open_push_session`);
        the repo is created by the session's preflight after the data checks (:meth:`data`)."""
        self.token, self.pusher = pushes.open_push_session(self.args, self.data_args, self.backend)

    def _resume_checkpoint(self):
        """The :class:`CheckpointInfo` to resume from (``None``: a fresh run) and the folder of its tokenizer
        (:func:`hf_tpu_ext.run.resume.find_resume_checkpoint`)."""
        info, tokenizer_dir, download = resume.find_resume_checkpoint(self.args, self.backend, self.token,
                                                                      self._tmp_dirs)
        if download is not None:
            self._resume_download = download
        return info, tokenizer_dir

    def _shown(self, text: str) -> str:
        """``text`` with the temp folder of a Hub resume replaced by ``hf://<repo id>`` (what the user typed)."""
        return resume.shown_path(text, getattr(self, "_resume_download", None))

    def _apply_checkpoint_shape(self, info) -> None:
        """The checkpoint's model shape and block length win over flags left at their defaults
        (:func:`hf_tpu_ext.run.resume.apply_checkpoint_shape`).

        Raises:
            CheckpointError: a passed flag contradicts the checkpoint, before any data work.
        """
        shape = resume.run_shape(self.backend, info)
        for line in resume.apply_checkpoint_shape(info, self.model_args, self.data_args, self.args, self._shown,
                                                  shape):
            logger.info("%s", line)

    def _resume(self, info) -> int:
        """The run's start: global step (0 for a fresh run), the run state it continues, and (resuming) the log
        history and runtime the checkpoint carries; returns the start step."""
        args = self.args
        start = info.global_step if info is not None else 0
        self.step = self._start_step = start
        self.run_state = state.resumed_run_state(args.output_dir, args.resume_latest, start, self.plan.total_steps)
        if info is not None:
            logger.info("resuming from %s at global step %d", self._shown(info.path), start)
            log_history, runtime = resume.resumed_history(info, args.output_dir, start)
            if log_history is not None:
                self.log_history[:] = log_history
                if runtime is not None:
                    self.prior_runtime = runtime
        return start

    # ------------------------------------------------------------------ data
    def data(self, tokenizer_source):
        """Phase data: the tokenizer, the blocks and their description, the plan (split sizes checked); then the
        Hub repo may be created (the push session's preflight). Returns the blocks (``{"train", "validation"}``).

        Raises:
            DataError, CorpusTooSmallError: unreadable data, or a split too small for one batch.
        """
        self.tokenizer, blocks, self.description = data.load_blocks(self.model_args, self.data_args, self.args,
                                                                    self.backend, tokenizer_source)
        self.plan = data.plan_run(self.args, self.data_args, self.backend, blocks)
        if self.pusher is not None:  # the data checks passed: now the repo may be created (and the card checked)
            self.pusher.preflight()
        return blocks

    # ------------------------------------------------------------------ fit and the state saved with checkpoints
    def fit(self, start: int) -> Dict[str, Any]:
        """Phase train: the backend's ``fit`` from global step ``start`` (signals honoured at step boundaries), the
        final evaluation, the final checkpoint's trainer state; marks ``train`` done. Returns the fit metrics."""
        args, backend, plan = self.args, self.backend, self.plan
        callbacks = build_callbacks(self.callback_names, backend.run_context(), backend.callback_kind)
        self._saves = 0
        self._fit_started = time.perf_counter()
        # a backend whose loop honours signals stops at a step boundary and saves it (backends/base.py),
        # never inside a TensorFlow op or checkpoint write
        with interrupts.deferring(getattr(backend, "checks_interrupts", False)):
            fit_metrics = backend.fit(callbacks, self.checkpoint, start, self.log_history)
            self.step = int(fit_metrics["global_step"])
            if self.step < plan.total_steps:  # stopped early; a signal after the last step: export, card follow
                interrupts.check()
            self.final_evaluation(self.prior_runtime + fit_metrics["train_runtime"])
            # what only the training process measured, for a resume that finishes the export (all_results, card)
            self.run_state["fit_metrics"] = {k: v for k, v in fit_metrics.items()
                                             if isinstance(v, (int, float, str)) and not isinstance(v, bool)}
            self.run_state["compiler"] = backend.model_summary().get("compiler")
            self._mark("train")
        return fit_metrics

    def final_evaluation(self, runtime: float) -> None:
        """The evaluation at the last step reached, unless the log history has one there; then the final
        checkpoint's trainer state again, so it holds that evaluation (a resume reads it from there).

        Also run by a resume from the last step's checkpoint: a kill between the final checkpoint and this
        evaluation leaves a run whose only missing piece it is."""
        backend, plan = self.backend, self.plan
        # with the best model loaded, a final evaluation would repeat the best one (same weights, masks)
        evaluates = plan.has_eval or getattr(backend, "scores_probes", False)
        if evaluates and not getattr(backend, "loaded_best", False) and not any(
                e.get("step") == self.step and ("eval_loss" in e or "probe_mrr" in e)
                for e in self.log_history[-2:]):
            metrics = backend.evaluate()
            if metrics:
                self.log_history.append(dict(metrics, **self._place(self.step), step=self.step))
        if backend.is_chief:  # the final checkpoint's state now holds the final evaluation too
            ckpts = backend.find_checkpoints(self.args.output_dir)
            if ckpts and ckpts[0].endswith(f"-{self.step}"):
                self._trainer_state(self.step, runtime).save(backend.checkpoint_state_file(ckpts[0]))

    def _place(self, step: int, digits: Optional[int] = 4) -> Dict[str, Any]:
        """``epoch`` at ``step``, or a stream's ``stream_passes`` (:func:`hf_tpu_ext.backends.base.run_progress`)."""
        streamed = getattr(self.plan, "streaming", False)
        return run_progress(self.plan, step, self.backend.data_passes(step) if streamed else None, digits)

    def _trainer_state(self, step: int, runtime: float):
        return state.trainer_state(step, runtime, self.plan, self.args, self.data_args, self.log_history,
                                   self.backend.model_config, getattr(self.backend, "best_model_checkpoint", None),
                                   state.backend_flops_per_token(self.backend), self._place(step, None))

    def checkpoint(self, step: int, path: str, files=None) -> None:
        """After every checkpoint (the backend's ``on_save``): its trainer state, ``output_dir/trainer_state.json``,
        then the Hub push of ``files`` (what the save handed up: :data:`~hf_tpu_ext.backends.base.SaveHook`)."""
        if not self.backend.is_chief:
            return
        self.step = step
        runtime = self.prior_runtime + (time.perf_counter() - self._fit_started)
        trainer_state = self._trainer_state(step, runtime)
        trainer_state.save(self.backend.checkpoint_state_file(path))
        trainer_state.save(os.path.join(self.args.output_dir, "trainer_state.json"))
        self._saves += 1
        interrupts.kill_for_test("saved", step)  # tests: kill -9 once checkpoint N and its trainer state are written
        if self._saves == 1:
            interrupts.kill_for_test("train")
        plan = self.pusher.admit(step) if self.pusher is not None and step < self.plan.total_steps else None
        if plan is not None:  # a save the commit budget has no room for is not even exported
            self._push(plan, path, files)
            self._record_pushes(self.pusher.report_dict())

    def _push(self, plan, checkpoint_path: Optional[str], files=None) -> None:
        """Carry out the session's ``plan`` of a save: write the model folder and card (the final push's are
        written by the export and card phases), then the session queues it with the checkpoint's ``files`` (a
        save's own; for a checkpoint found on disk -- the final push, a signal's -- the backend's
        ``checkpoint_files`` of ``checkpoint_path``), hard-linked when queued: it never waits."""
        if plan is None:  # the session is closed (or not this process's)
            return
        out = self.args.output_dir
        if not plan.final:
            self.backend.export(out, self.tokenizer)
            self._write_summary(self._results(plan.step, None))
            self._write_card()
        if files is None and checkpoint_path and plan.checkpoint is not None:
            files = self.backend.checkpoint_files(checkpoint_path)
        self.pusher.save(plan, out, checkpoint_files=files, replaced=self.backend.export_replaces)

    # ------------------------------------------------------------------ results and files
    def _results(self, step: int, fit_metrics: Optional[Dict[str, Any]]) -> Dict[str, Any]:
        runtime = self.prior_runtime + (fit_metrics or {}).get("train_runtime", 0.0)
        if fit_metrics is None and self.run_state.get("phases", {}).get("train") == "done":
            # finishing after a kill: the training process's own figures (its runtime is in prior_runtime); killed
            # before it recorded them, those its last checkpoint kept (Keras: checkpoint.json fit_metrics)
            fit_metrics = (self.run_state.get("fit_metrics")
                           or getattr(self.backend, "restored_fit_metrics", None) or None)
        return history.run_results(self.log_history, step, self.plan, runtime, fit_metrics, self.args,
                                   self._place(step).get("stream_passes"))

    def _summary(self, results: Dict[str, Any]) -> Dict[str, Any]:
        return state.run_summary(self.model_args, self.data_args, self.args, self.backend, self.plan, results,
                                 self.log_history, self.description, self.tokenizer.mask_token, self.run_state,
                                 self.push_report)

    def _write_summary(self, results) -> None:
        files.write_training_summary(self.args.output_dir, self._summary(results))

    def _write_card(self) -> None:
        repo_id = self.pusher.repo_id if self.pusher is not None else self.args.hub_model_id
        files.write_card(self.model_args, self.args, repo_id)

    def export(self, results) -> None:
        """Phase export: the backend's model folder, then the run files (:func:`hf_tpu_ext.run.files.write_run_files`)."""
        out = self.args.output_dir
        self.backend.export(out, self.tokenizer)
        interrupts.kill_for_test("export")
        files.write_run_files(self.model_args, self.data_args, self.args,
                              self._trainer_state(self.step, results["train_runtime"]), results,
                              lambda: self._summary(results), self.log_history)
        self._mark("export")

    def card(self) -> None:
        """Phase card: ``output_dir/README.md``."""
        self._write_card()
        interrupts.kill_for_test("card")
        self._mark("card")

    def _mark(self, phase: str, value: str = "done") -> None:
        if not self.backend.is_chief:
            return
        self.run_state.setdefault("phases", {})[phase] = value
        self.run_state.update(global_step=self.step, max_steps=self.plan.total_steps)
        state.write_run_state(self.args.output_dir, self.run_state)

    def _pending(self, phase: str) -> bool:
        return state.phase_pending(self.run_state, phase, self.pusher is not None, self.args.hub_space_id)

    # ------------------------------------------------------------------ the run
    def run(self) -> Dict[str, Any]:
        """Run every phase not done yet; returns the final metrics (also in ``all_results.json``).

        Raises:
            HfTpuExtError subclasses: bad input, before anything is written into ``output_dir``.
            RunLockedError: another ``hf-tpu train`` holds ``output_dir`` (:mod:`hf_tpu_ext.run_lock`).
            OutputDirError: a write failed (disk full, quota, read-only): one line with the newest intact
                checkpoint and the resume command.
            TrainingInterrupted: SIGINT/SIGTERM; its message is the one line with the resume command.
            HubPushError: the final state could not be pushed (unless ``--hub_allow_push_failure true``).
        """
        setup_logging()
        try:
            return self._run()
        finally:
            for d in self._tmp_dirs:
                shutil.rmtree(d, ignore_errors=True)
            lock = getattr(self, "_lock", None)
            if lock is not None:  # after an error or a signal too; a SIGKILL leaves a stale lock for the next run
                lock.release()

    def _run(self) -> Dict[str, Any]:
        args = self.args
        t_total = time.perf_counter()
        self.check()
        if self.backend is None:
            self.backend = make_backend(args.backend)
        backend = self.backend
        backend.setup(args)
        if getattr(backend, "processes_to_spawn", 0):  # one process per local device, each running this run
            backend.spawn(_spawned_run, (self.model_args, self.data_args, args))

            return read_all_results(args.output_dir) or {}
        self._open_pusher()
        # the report of a signal (push, wait, summary) runs under the run's handler: a second signal there stops
        # the wait, one more does not kill the process by SIGTERM's default before the summary is written
        with interrupts.handling(getattr(args, "save_on_signal_timeout", None)):
            try:
                return self._run_phases(t_total)
            except KeyboardInterrupt:
                stopped = self._interrupted()
            except BaseException as err:
                if interrupts.received() is None:
                    self._failed(err)
                    raise
                stopped = self._interrupted()  # a library failed half-way through the signal: still one line
        raise stopped from None

    def _failed(self, err: BaseException) -> None:
        """A run that failed (no signal): report the pushes not uploaded, close the pusher; a failed write (disk
        full, quota, read-only) becomes :class:`OutputDirError`'s one line naming the intact checkpoint."""
        args = self.args
        if self.pusher is not None:
            report = self.pusher.report()
            if report.pending:
                logger.error("training failed; %d push(es) not uploaded: %s", len(report.pending),
                             ", ".join(report.pending))
            self.pusher.close()

        message = save_failure_message(err, args.output_dir, resume_hint(self.argv, self._secrets()))
        if message:  # disk full, quota, read-only: one line naming the intact checkpoint, not a traceback
            raise OutputDirError(message) from None

    def _secrets(self) -> tuple:
        """The token values a line shown to the user must not hold."""
        return tuple(t for t in (self.token, getattr(self.args, "hub_token", None)) if t)

    def _interrupted(self) -> TrainingInterrupted:
        """After a signal: push the checkpoint of the step reached when no save pushed it (the budget had
        coalesced it, or it is the last step's), wait for the pushes within the grace budget (none after a
        second signal), report what did not land (log and ``training_summary.json`` ``interrupted``), and the
        one-line error to raise (:func:`hf_tpu_ext.run.pushes.settle_on_signal`)."""
        signum = interrupts.received() or signal.SIGINT
        try:
            self.step = max(self.step, int(self.backend.current_step()))
        except Exception:  # not built yet
            pass
        not_pushed: List[str] = []
        try:
            if self.pusher is not None:
                not_pushed = pushes.settle_on_signal(
                    self.pusher,
                    lambda: self.backend.find_checkpoints(self.args.output_dir) if self.plan is not None else [],
                    self.step, getattr(self, "_start_step", self.step),
                    self._push)
                self._record_pushes(self.pusher.report_dict())
                if not_pushed:
                    logger.warning("%s: not on the Hub within the %gs grace budget (--save_on_signal_timeout): %s; "
                                   "the local folder has it.", signal.Signals(signum).name, interrupts.grace(),
                                   "; ".join(not_pushed))
            with interrupts.shielded():  # a double Ctrl+C's second signal lands here: the summary is written first
                self._write_interrupted_summary(signum, not_pushed)
        except KeyboardInterrupt:  # a signal more while reporting: exit now
            pass
        except Exception as err:  # noqa: BLE001 (stopped before the model existed: the resume line still comes)
            logger.debug("no training_summary.json for the interrupted run: %s", err)
        return TrainingInterrupted(f"interrupted at step {self.step}; {self._restart_hint()}", step=self.step,
                                   signum=signum)

    def _restart_hint(self) -> str:
        """How the same command finishes the run: resume from its checkpoint, or rerun when none was saved yet."""
        try:
            saved = self.plan is not None and bool(self.backend.find_checkpoints(self.args.output_dir))
        except Exception:  # noqa: BLE001 (stopped before the backend could look)
            saved = False
        if saved:
            return "resume with: " + resume_hint(self.argv, self._secrets())
        has_files = bool(checks.output_dir_entries(self.args.output_dir))
        return "no checkpoint was saved yet; rerun: " + rerun_hint(self.argv, self._secrets(), has_files)

    def _write_interrupted_summary(self, signum: int, not_pushed: List[str],
                                   results: Optional[Dict[str, Any]] = None) -> None:
        """``training_summary.json`` of the interrupted run: the figures so far (``results``: the final ones) and
        ``interrupted`` (:func:`hf_tpu_ext.run.state.interrupted_fields`); with ``results`` (a signal after the last
        step, every phase finished within the grace budget) also ``"completed": true``."""
        if (self.plan is None or not self.backend.is_chief or getattr(self, "tokenizer", None) is None
                or not os.path.isdir(self.args.output_dir)):
            return  # stopped before the data and the model existed: nothing to summarize
        ckpts = self.backend.find_checkpoints(self.args.output_dir)
        summary = self._summary(results if results is not None else self._results(self.step, None))
        summary["interrupted"] = state.interrupted_fields(signum, self.step, ckpts, self.args.output_dir,
                                                          interrupts.grace(), not_pushed, results is not None)
        files.write_training_summary(self.args.output_dir, summary)

    def _record_pushes(self, report: Optional[Dict[str, Any]]) -> None:
        """Keep this process's push report in ``run_state.json`` (``hub_pushes``: one entry per process of the
        run, merged into ``training_summary.json``), so a resume's report covers the processes before it."""
        if report is None or not self.backend.is_chief:
            return
        self.push_report = state.record_push_report(self.run_state, self._process_id, report)
        if os.path.isdir(self.args.output_dir):
            state.write_run_state(self.args.output_dir, self.run_state)

    def _run_phases(self, t_total: float) -> Dict[str, Any]:
        args, backend = self.args, self.backend
        info, tokenizer_source = self._resume_checkpoint()
        if info is not None:
            self._apply_checkpoint_shape(info)
        blocks = self.data(tokenizer_source)
        interrupts.kill_for_test("data")
        plan = self.plan
        start = self._resume(info)
        resume.check_max_steps(start, plan.total_steps, self.run_state, args, info and self._shown(info.path))
        if start >= plan.total_steps:
            self.run_state.setdefault("phases", {})["train"] = "done"
        todo = [p for p in state.PHASES if self._pending(p)]
        if not todo:
            logger.warning("The checkpoint is at global step %d, the run asks for %d steps, and the export, card and "
                           "pushes are done: nothing to do. Raise --max_steps or --num_train_epochs to train further.",
                           start, plan.total_steps)

            return dict(read_all_results(args.output_dir) or {}, global_step=start)
        if start >= plan.total_steps:
            logger.info("The checkpoint is at the run's last step %d; finishing: %s", start, ", ".join(todo))

        files.clear_earlier_events(args, backend)  # before build opens this run's TensorBoard writer
        backend.build(self.model_args, self.data_args, args, self.tokenizer, blocks, plan)
        if info is not None:
            restored = backend.restore(info.path)
            if restored != start:
                raise CheckpointError(f"Checkpoint {self._shown(info.path)} restored global step {restored}, expected "
                                      f"{start}.")
        # every check passed: from here on output_dir is written
        files.prepare_output_dir(args, backend, self.tokenizer, resumed=info is not None)
        fit_metrics = None
        if "train" in todo:
            fit_metrics = self.fit(start)
            interrupts.kill_for_test("checkpoint")
        elif info is not None and "export" in todo:  # killed after the final checkpoint, maybe before its evaluation
            self.final_evaluation(self.prior_runtime)
        return self._after_training(todo, fit_metrics, t_total)

    def _after_training(self, todo: List[str], fit_metrics: Optional[Dict[str, Any]], t_total: float) -> Dict[str, Any]:
        """The phases after the last step: export, card, final push, Space. A first signal here (or during the
        final evaluation) is deferred: a phase starts while the grace budget lasts, the final push waits within
        it, and a run whose phases all finished ends complete (``interrupted.completed`` in the summary); the
        Space waits for a resume."""
        backend = self.backend
        results = self._results(self.step, fit_metrics)
        if not backend.is_chief:
            return results

        def budget_left() -> None:  # after a signal a phase starts only with some of the grace budget left
            if interrupts.received() is not None and not interrupts.seconds_left():
                interrupts.check()

        with interrupts.deferring(True):
            if "export" in todo or "train" in todo:
                budget_left()
                self.export(results)
            if fit_metrics is not None:
                backend.end_training({k: v for k, v in results.items() if isinstance(v, float)})
            if "card" in todo or "export" in todo or "train" in todo:
                budget_left()
                self.card()
            if self.pusher is not None and self._pending("push"):
                budget_left()
                self.push(results)
            elif self.pusher is None and not self.run_state.get("phases", {}).get("push"):
                self._mark("push", "skipped")
        if self._pending("space"):
            interrupts.check()  # a signal came during the final push: the Space waits for the resume
            self.space()
        elif interrupts.received() is not None:  # a signal after the last step: every phase finished in the budget
            phases = "export, card and final push" if self.pusher is not None else "export and card"
            logger.warning("%s received after the last step: %s finished within the %g s grace budget.",
                           signal.Signals(interrupts.received()).name, phases, interrupts.grace())
            self._write_interrupted_summary(interrupts.received(), [], results)
        _log_done(results, t_total)
        return results

    def push(self, results) -> None:
        """Phase push: the final push, waited for (``push_timeout``; after a signal within the grace budget). A final
        push of an earlier process of this run that was still in flight when it stopped (``run_state.json`` keeps
        its push id) is looked up on the Hub first: landed, it is not pushed again.

        Raises:
            HubPushError: the final push did not land (unless ``--hub_allow_push_failure true``: logged, marked
                ``failed``).
        """
        if pushes.landed_final_push(self.run_state, self._process_id, self.step, self.pusher):
            self._record_pushes(self.pusher.report_dict())
            self._write_summary(results)
            self._mark("push", "pushed")
            return
        ckpts = self.backend.find_checkpoints(self.args.output_dir)
        self._push(self.pusher.admit(self.step, final=True), ckpts[0] if ckpts else None)
        self._record_pushes(self.pusher.report_dict())  # in the report even if this process is killed now
        interrupts.kill_for_test("push")
        # a first signal does not stop the final push: it gets what is left of the grace budget
        interrupts.wait_until(lambda: not self.pusher.report().pending, self.pusher.push_timeout)
        report = self.pusher.finish(timeout=0)
        self._record_pushes(self.pusher.report_dict())
        self._write_summary(results)  # the push outcome, locally (the pushed copy predates it)
        if report.final_pushed:
            self._mark("push", "pushed")
            return
        interrupts.check()  # stopped by a signal: the resume line (a resume pushes again), not a push error
        message = pushes.final_push_failure(self.args, self.step, self.pusher.repo_id)
        if getattr(self.args, "hub_allow_push_failure", False):
            logger.error(message)
            self._mark("push", "failed")
            return
        raise HubPushError(message)

    def space(self) -> None:
        """Phase Space: the fill-mask demo Space of the pushed model (:func:`hf_tpu_ext.hub.space.deploy_space`)."""
        url = deploy_space(self.pusher.repo_id, self.args.hub_space_id, token=self.token,
                           private=self.args.hub_private_repo)
        logger.info("deployed the fill-mask demo to %s", url)
        self._mark("space")


def _log_done(results: Dict[str, Any], t_total: float) -> None:
    """The run's last log line: wall time since ``t_total`` (``time.perf_counter()``) and the float results."""
    # whole-run rates (train_*_per_second) stay in all_results.json: the terminal shows one throughput figure
    step_rate, mfu = results.get("steady_tokens_per_second"), results.get("mfu")
    logger.info("done in %.1fs: %s%s", time.perf_counter() - t_total,
                ", ".join(f"{k}={v:.4g}" for k, v in results.items()
                          if isinstance(v, float) and not k.endswith("_per_second") and not k.startswith("mfu")),
                (f" | steady {step_rate:,.0f} tokens/s (median training step)" if step_rate else "")
                + (f", MFU {mfu:.1%}" if step_rate and mfu is not None else ""))


def _spawned_run(index, model_args, data_args, training_args):
    """The run in a process started by :meth:`Backend.spawn` (``index``: its ordinal)."""
    os.environ[SPAWNED_CHILD_ENV] = "1"
    setup_logging()
    TrainingRun(model_args, data_args, training_args).run()


def train(model_args, data_args, training_args, argv: Optional[List[str]] = None) -> Dict[str, Any]:
    """Run ``hf-tpu train`` end to end (see :class:`TrainingRun`) and return the final metrics.

    Raises:
        HfTpuExtError subclasses for every bad input, before training starts; ``TrainingInterrupted`` on
        SIGINT/SIGTERM; ``HubPushError`` when the final state could not be pushed.
    """
    return TrainingRun(model_args, data_args, training_args, argv=argv).run()
