"""Framework-free pieces of transformers model folders that every backend shares.

File names transformers' loaders look for, PyTorch-format safetensors read and written as plain numpy
dicts (no torch, TensorFlow or JAX import), and a model reference resolved to a local folder (the folder
itself, or a Hub snapshot with one weight format). ``backends/tensorflow/export.py`` and
``backends/keras/{export,hf_convert}.py`` build on these; nothing here knows a framework's layer names.
"""

from __future__ import annotations

import json
import os
from typing import Dict, List, Optional

import numpy as np

from hf_tpu_ext.errors import ArgumentError, HubAuthError, HubRepoError
from hf_tpu_ext.fileio import atomic_write
from hf_tpu_ext.hub.preflight import endpoint as hub_endpoint

CONFIG_NAME = "config.json"
SAFE_WEIGHTS_NAME = "model.safetensors"
SAFE_WEIGHTS_INDEX_NAME = "model.safetensors.index.json"
TF2_WEIGHTS_NAME = "tf_model.h5"
TF2_WEIGHTS_INDEX_NAME = "tf_model.h5.index.json"
PT_WEIGHTS_NAME = "pytorch_model.bin"
PT_WEIGHTS_INDEX_NAME = "pytorch_model.bin.index.json"

# Config and tokenizer files of a model repo; one weight format is added (see weight_patterns).
BASE_PATTERNS = ["*.json", "*.txt", "*.model"]


def safetensors_problem(path: str) -> Optional[str]:
    """What makes the safetensors file ``path`` unreadable, read from its header alone (no framework, no tensor
    data read), or ``None`` when it is whole: the format is an 8-byte little-endian header length, that many bytes
    of JSON naming each tensor's ``data_offsets`` ``[begin, end]`` after the header, then the data."""
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            return f"it holds {size} bytes, fewer than a safetensors header"
        n = int.from_bytes(head, "little")
        if n > size - 8:
            return f"its header claims {n:,} bytes but the file holds {size:,}"
        try:
            header = json.loads(f.read(n))
            end = max((int(t["data_offsets"][1]) for k, t in header.items() if k != "__metadata__"), default=0)
        except (ValueError, TypeError, KeyError, IndexError, AttributeError):
            return "its header is not safetensors JSON"
    if 8 + n + end > size:
        return f"it is truncated: its tensors need {8 + n + end:,} bytes, the file holds {size:,}"
    return None


def check_weights_folder(folder: str, option: str = "--model_name_or_path") -> None:
    """Refuse a local model folder whose ``model.safetensors`` (or a shard its index names) cannot be read, in one
    line, before any framework loads it.

    Raises:
        ArgumentError: the file named, with what is wrong and what to do.
    """
    names = [SAFE_WEIGHTS_NAME]
    index = os.path.join(folder, SAFE_WEIGHTS_INDEX_NAME)
    if os.path.isfile(index):
        try:
            with open(index, encoding="utf-8") as f:
                names = sorted(set(json.load(f)["weight_map"].values()))
        except (ValueError, KeyError, TypeError, AttributeError):
            raise ArgumentError(f"{option} {folder}: {SAFE_WEIGHTS_INDEX_NAME} is not a safetensors index; copy "
                                "the model folder again.") from None
    for name in names:
        path = os.path.join(folder, name)
        problem = safetensors_problem(path) if os.path.isfile(path) else None
        if problem:
            raise ArgumentError(f"{option} {folder}: {name} cannot be read ({problem}); copy or export the model "
                                "folder again.")


def weight_patterns(repo_files: List[str]) -> List[str]:
    """The one weight format to download, in the loaders' order: safetensors, tf_model.h5, pytorch_model.bin."""
    top = set(repo_files)
    if SAFE_WEIGHTS_NAME in top or SAFE_WEIGHTS_INDEX_NAME in top:
        return ["model*.safetensors"]
    if TF2_WEIGHTS_NAME in top or TF2_WEIGHTS_INDEX_NAME in top:
        return ["tf_model*.h5"]
    return ["pytorch_model*.bin"]


def safetensors_format(path: str) -> Optional[str]:
    """The ``format`` entry of a safetensors file's metadata (``"pt"``, ``"tf"``, ...), or ``None``."""
    from safetensors import safe_open

    with safe_open(path, framework="numpy") as f:
        return (f.metadata() or {}).get("format")


def pt_safetensors_files(folder: str) -> Optional[List[str]]:
    """The paths of ``folder``'s PyTorch-format safetensors weights (``model.safetensors``, or the shards its
    index names), or ``None``: none, or another format (``format: tf``)."""
    single = os.path.join(folder, SAFE_WEIGHTS_NAME)
    index = os.path.join(folder, SAFE_WEIGHTS_INDEX_NAME)
    if os.path.isfile(single):
        files = [single]
    elif os.path.isfile(index):
        with open(index, encoding="utf-8") as f:
            shards = sorted(set(json.load(f).get("weight_map", {}).values()))
        files = [os.path.join(folder, s) for s in shards]
    else:
        return None
    return files if safetensors_format(files[0]) == "pt" else None


def read_pt_safetensors(folder: str) -> Optional[Dict[str, np.ndarray]]:
    """PyTorch-format safetensors weights of ``folder`` as one dict (shards merged); ``None`` if there are none.

    Returns ``None`` too when the file's metadata says another format (``format: tf``: TF variable names).
    bfloat16/float16 arrays are upcast to float32 (numpy has no bfloat16 arithmetic).
    """
    from safetensors.numpy import load_file

    files = pt_safetensors_files(folder)
    if files is None:
        return None
    state: Dict[str, np.ndarray] = {}
    for path in files:
        for name, array in load_file(path).items():
            if str(array.dtype) in ("bfloat16", "float16"):
                array = array.astype(np.float32)
            state[name] = array
    return state


def write_pt_safetensors(folder: str, state: Dict[str, np.ndarray]) -> str:
    """Write ``state`` as ``folder/model.safetensors`` with metadata ``{"format": "pt"}``, atomically.

    Written with ``safetensors.numpy`` (no torch); a stale ``model.safetensors.index.json`` is removed so
    loaders do not pick an old sharded copy over the new file.

    Returns:
        ``"model.safetensors"`` (the name relative to ``folder``).
    """
    from safetensors.numpy import save_file

    os.makedirs(folder, exist_ok=True)
    arrays = {name: np.ascontiguousarray(a) for name, a in state.items()}
    atomic_write(os.path.join(folder, SAFE_WEIGHTS_NAME), lambda tmp: save_file(arrays, tmp, metadata={"format": "pt"}))
    stale = os.path.join(folder, SAFE_WEIGHTS_INDEX_NAME)
    if os.path.isfile(stale):
        os.remove(stale)
    return SAFE_WEIGHTS_NAME


def resolve_model_folder(path_or_repo_id: str, revision: Optional[str], cache_dir: Optional[str], token) -> str:
    """A local folder for ``path_or_repo_id``: the folder itself, or a Hub snapshot download.

    From the Hub only the config/tokenizer files (:data:`BASE_PATTERNS`) and one weight format
    (:func:`weight_patterns`) are downloaded, from ``HF_ENDPOINT`` read at call time (default: the public Hub).

    Raises:
        ArgumentError: a local-looking path that does not exist.
        HubRepoError / HubAuthError: the repo or revision cannot be downloaded (the token is never in the message).
    """
    if os.path.isdir(path_or_repo_id):
        return path_or_repo_id
    looks_local = path_or_repo_id.startswith((".", os.sep, "~")) or path_or_repo_id.count("/") > 1 or (
        os.sep != "/" and os.sep in path_or_repo_id
    )
    if looks_local:
        raise ArgumentError(f"Model folder {path_or_repo_id!r} does not exist; give an existing folder or a Hub repo id 'user/name'.")

    from huggingface_hub import HfApi, snapshot_download
    from huggingface_hub.errors import (
        GatedRepoError,
        HFValidationError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    endpoint = hub_endpoint()  # read at call time: HF_ENDPOINT set after import (a private or test Hub) counts
    try:
        # List first so only one weight format is fetched (repos often hold .bin, .h5 and .safetensors copies).
        repo_files = HfApi(endpoint=endpoint).list_repo_files(path_or_repo_id, revision=revision, token=token)
        return snapshot_download(
            path_or_repo_id,
            revision=revision,
            cache_dir=cache_dir,
            token=token,
            endpoint=endpoint,
            allow_patterns=BASE_PATTERNS + weight_patterns(repo_files),
        )
    except HFValidationError:
        raise HubRepoError(
            f"{path_or_repo_id!r} is neither an existing folder nor a valid Hub repo id ('user/name')."
        ) from None
    except GatedRepoError:
        raise HubAuthError(
            f"The Hub repo {path_or_repo_id} is gated: accept its conditions on the Hub and log in (HF_TOKEN)."
        ) from None
    except RevisionNotFoundError:
        raise HubRepoError(f"Revision {revision!r} of Hub repo {path_or_repo_id} does not exist; check --model_revision.") from None
    except RepositoryNotFoundError:
        raise HubRepoError(
            f"Hub repo {path_or_repo_id} was not found at {endpoint} (or it is private and no valid token was given); "
            "check the repo id, HF_ENDPOINT and HF_TOKEN."
        ) from None
    except LocalEntryNotFoundError:
        raise HubRepoError(
            f"Cannot download {path_or_repo_id} from {endpoint} and it is not in the local cache; check the network/HF_ENDPOINT."
        ) from None
