"""``hf-tpu train`` as a package of its jobs; ``hf_tpu_ext.run.train`` is the library entry point of the command.

* :mod:`~hf_tpu_ext.run.lifecycle` -- :class:`TrainingRun`: one method per phase (check, data, fit, checkpoint,
  export, card, push, space), the order, signals and the kill test hook;
* :mod:`~hf_tpu_ext.run.checks` -- the checks before anything is written;
* :mod:`~hf_tpu_ext.run.data` -- the data phase: the blocks and the plan (split sizes checked);
* :mod:`~hf_tpu_ext.run.resume` -- which checkpoint a resume starts from, and what it imposes and carries over;
* :mod:`~hf_tpu_ext.run.state` -- ``run_state.json`` (phases done, push reports), the trainer state saved with
  each checkpoint, ``training_summary.json``;
* :mod:`~hf_tpu_ext.run.history` -- log history arithmetic (whole-run loss, best metric, final results);
* :mod:`~hf_tpu_ext.run.pushes` -- the run's push adapter on :class:`~hf_tpu_ext.hub.push_session.PushSession`;
* :mod:`~hf_tpu_ext.run.files` -- the output folder's run files and model card.
"""

from hf_tpu_ext.run.checks import (check_backend, check_data_files, check_model_config, check_model_refs,
                                   check_output_dir)
from hf_tpu_ext.run.lifecycle import TrainingRun, setup_logging, train

__all__ = ["TrainingRun", "train", "setup_logging", "check_output_dir", "check_backend", "check_data_files",
           "check_model_config", "check_model_refs"]
