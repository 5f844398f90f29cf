"""The XLA device seen from PyTorch: availability, kind and count, and compilation counters.

``PJRT_DEVICE`` chooses the runtime (``TPU`` on a TPU VM, ``CPU`` for tests, ``CUDA`` on GPUs); when it is
unset :func:`xla_device_info` sets it to ``TPU`` if ``/dev/accel*`` or ``/dev/vfio`` exist, else ``CPU``.
"""

from __future__ import annotations

import dataclasses
import glob
import importlib.util
import os

from hf_tpu_ext.distributed import process_index  # the one answer (here: torch_xla's global ordinal)
from hf_tpu_ext.errors import BackendError

INSTALL_HINT = ("`pip install 'hf-tpu-ext[torch-xla]'` (torch_xla 2.9 needs exactly torch 2.9.x), "
                "or use the default --backend tensorflow")


def require_torch_xla() -> None:
    """Raise when torch_xla cannot be imported (missing, or installed next to a torch it does not fit).

    Raises:
        BackendError: the message names the install command.
    """
    if importlib.util.find_spec("torch_xla") is None:
        raise BackendError(f"--backend torch_xla needs PyTorch/XLA, which is not installed. Install it with {INSTALL_HINT}.")
    try:
        import torch_xla  # noqa: F401
    except Exception as err:  # e.g. a torch version torch_xla was not built for
        raise BackendError(
            f"torch_xla is installed but cannot be imported ({type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}). "
            f"Install matching versions with {INSTALL_HINT}."
        ) from None
    if importlib.util.find_spec("accelerate") is None:
        raise BackendError("--backend torch_xla runs transformers.Trainer, which needs accelerate: `pip install accelerate`.")


def default_pjrt_device() -> str:
    """``PJRT_DEVICE`` if set, else ``"TPU"`` when TPU device files exist, else ``"CPU"``."""
    if os.environ.get("PJRT_DEVICE"):
        return os.environ["PJRT_DEVICE"]
    return "TPU" if glob.glob("/dev/accel*") or os.path.isdir("/dev/vfio") and glob.glob("/dev/vfio/[0-9]*") else "CPU"


@dataclasses.dataclass
class XLADeviceInfo:
    """Where this process trains.

    Attributes:
        accelerator: ``"TPU"``, ``"GPU"`` or ``"CPU"`` (what the card shows).
        device_kind: the hardware name, e.g. ``"TPU v4"``, ``"CPU"`` (for peak-FLOPs lookup).
        num_devices: XLA devices over all processes (``torch_xla.runtime.global_runtime_device_count``).
        world_size: processes taking part (``torch_xla.runtime.world_size``).
        process_index: this process's ordinal (0 is the chief).
        device: the ``torch.device`` of this process (``xla:0``).
    """

    accelerator: str
    device_kind: str
    num_devices: int
    world_size: int
    process_index: int
    device: object

    @property
    def is_chief(self) -> bool:
        return self.process_index == 0


def tpu_runtime():
    """torch_xla's TPU host helpers, ``torch_xla._internal.tpu``: ``version()`` (the chip generation, an int) and
    ``num_available_devices()`` (this host's chips, read before the runtime starts).

    The one adapter over this private module. The public alternative:
    ``torch_xla.runtime.global_runtime_device_count()`` counts the devices only once the runtime has started (too
    late to choose how many processes to spawn), and ``torch_xla.core.xla_model.xla_device_hw`` names only
    ``"TPU"``, not its generation.
    """
    from torch_xla._internal import tpu

    return tpu


def xla_device_info() -> XLADeviceInfo:
    """Describe the XLA device of this process (sets ``PJRT_DEVICE`` first when unset).

    Raises:
        BackendError: torch_xla is missing or unusable.
    """
    os.environ.setdefault("PJRT_DEVICE", default_pjrt_device())
    require_torch_xla()
    import torch_xla
    import torch_xla.core.xla_model as xm
    import torch_xla.runtime as xr

    device = torch_xla.device()
    hw = str(xm.xla_device_hw(device)).upper()  # "TPU", "CPU", "CUDA", "NEURON"
    accelerator = {"CUDA": "GPU"}.get(hw, hw)
    kind = accelerator
    if accelerator == "TPU":
        try:
            kind = f"TPU v{tpu_runtime().version()}"
        except Exception:  # the generation is only needed for MFU
            kind = "TPU"
    elif accelerator == "GPU":
        try:
            import torch

            kind = torch.cuda.get_device_name(0)
        except Exception:
            kind = "GPU"
    return XLADeviceInfo(accelerator=accelerator, device_kind=kind, num_devices=int(xr.global_runtime_device_count()),
                         world_size=int(xr.world_size()), process_index=process_index(), device=device)
