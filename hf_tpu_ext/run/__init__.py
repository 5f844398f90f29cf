"""``hf_tpu_ext.run.train``: the library entry point of ``hf-tpu train`` (kept for callers of this name).

The run itself lives in :mod:`hf_tpu_ext.training_run` (one backend-neutral lifecycle for every backend).
"""

from hf_tpu_ext.training_run import (TrainingRun, check_backend, check_data_files, check_model_config,  # noqa: F401
                                     check_model_refs, check_output_dir, setup_logging, train)

__all__ = ["TrainingRun", "train", "setup_logging", "check_output_dir", "check_backend", "check_data_files",
           "check_model_config", "check_model_refs"]
