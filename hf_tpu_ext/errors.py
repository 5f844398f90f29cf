"""Typed errors raised by hf-tpu-ext.

Every error the package raises on purpose derives from :class:`HfTpuExtError`, so a caller can
catch them all at once; the subclasses also derive from the closest built-in (``ValueError``,
``FileNotFoundError``, ...) so existing ``except`` clauses keep working. Messages say what to do.
No message ever contains a Hub token.
"""


class HfTpuExtError(Exception):
    """Base class of every error raised on purpose by hf-tpu-ext."""


class ArgumentError(HfTpuExtError, ValueError):
    """An argument (or a combination of arguments) is invalid."""


class BackendError(ArgumentError):
    """An unknown backend, or a backend whose packages are not installed."""


class DataError(HfTpuExtError, ValueError):
    """The training or validation data cannot be used (missing, unreadable, wrong format)."""


class DataFileNotFoundError(DataError, FileNotFoundError):
    """A data file given on the command line does not exist."""


class CorpusTooSmallError(DataError):
    """The corpus yields fewer blocks than one block or one global batch needs."""


class TokenizerError(HfTpuExtError, ValueError):
    """The tokenizer cannot be used for masked language modeling (e.g. it has no mask token)."""


class OutputDirError(HfTpuExtError, FileExistsError):
    """``output_dir`` holds files and neither ``overwrite_output_dir`` nor a resume was asked for."""


class CheckpointError(HfTpuExtError, ValueError):
    """A checkpoint is missing, unreadable, or was written for a model of another shape."""


class IncompleteCheckpointError(CheckpointError):
    """A checkpoint whose save was stopped half-way (weights without the trainer state that completes it)."""


class HubError(HfTpuExtError):
    """Base class of errors about the Hugging Face Hub."""


class HubAuthError(HubError, PermissionError):
    """The Hub token is missing or invalid, or it cannot write to the target namespace."""


class HubRepoError(HubError, ValueError):
    """A repo id is malformed, or the repo/revision does not exist."""


class ModelCardError(HubError, ValueError):
    """The model card metadata does not pass the Hub's validation."""


class UnknownCallbackError(HfTpuExtError, KeyError):
    """A callback name is not registered. The message lists the registered names."""

    def __str__(self):  # KeyError quotes its message; show it plainly instead
        return str(self.args[0]) if self.args else ""


class RecompilationError(HfTpuExtError, RuntimeError):
    """The train function was compiled again after warm-up (an input shape or dtype changed)."""


class MissingExtraError(BackendError, ImportError):
    """A framework (or other optional package group) is not installed; the message names the pip extra."""


class HubPushError(HubError):
    """The final state of a run could not be pushed to the Hub (the local output folder is complete)."""


class TrainingInterrupted(HfTpuExtError):
    """SIGINT (Ctrl-C) or SIGTERM stopped the run; the message is one line with the command that resumes it.

    Attributes:
        step: the global step reached when the signal came.
        signum: the signal's number (2: SIGINT, 15: SIGTERM); the command exits with ``128 + signum``.
    """

    def __init__(self, message: str, step: int = 0, signum: int = 2):
        super().__init__(message)
        self.step = step
        self.signum = int(signum)


def check_choice(value, choices, name: str):
    """``value`` when it is one of ``choices``, else :class:`ArgumentError` ``"<name> must be one of ..., got ..."``
    (the one check of a flag's choices: ``--hub_strategy`` from args.py, the push config and the pusher alike)."""
    if value not in choices:
        raise ArgumentError(f"{name} must be one of {', '.join(choices)}, got {value!r}.")
    return value
