"""Is a model reference a local folder or a Hub repo id, and does it exist? Answered in seconds.

``hf-tpu train --model_name_or_path``/``--tokenizer_name``/``--config_name`` and ``hf-tpu demo MODEL`` call
:func:`check_model_ref` before anything heavy: a name that is neither an existing folder nor a valid repo id
is refused at once, a repo id is looked up with one bounded request (no retry loop), and an endpoint that
cannot be reached is named. Links in cards and Space READMEs use :func:`hub_url`, so a private Hub
(``HF_ENDPOINT``) gets links to itself, not to huggingface.co.
"""

from __future__ import annotations

import os
from typing import Optional

from hf_tpu_ext.errors import ArgumentError, HubAuthError, HubRepoError
from hf_tpu_ext.hub.preflight import endpoint, missing_repo_message, similar_repo_ids  # noqa: F401 (re-exported)

LOOKUP_TIMEOUT = 10.0  # seconds for the one metadata request (huggingface_hub's own etag default)


hub_endpoint = endpoint  # the Hub endpoint in use (:func:`hf_tpu_ext.hub.preflight.endpoint`)


def hub_url(repo_id: str, repo_type: str = "model") -> str:
    """The web page of a Hub repo at :func:`hub_endpoint`: ``{endpoint}/{repo_id}``, with ``datasets/`` or
    ``spaces/`` before the id for those repo types."""
    prefix = {"model": "", "dataset": "datasets/", "space": "spaces/"}[repo_type]
    return f"{hub_endpoint()}/{prefix}{repo_id}"


def looks_like_local_path(value: str) -> bool:
    """True for what can only be a path: ``./x``, ``../x``, ``/x``, ``~/x``, ``a/b/c``, a Windows separator."""
    return (value.startswith((".", "/", "~")) or value.count("/") > 1 or (os.sep != "/" and os.sep in value)
            or (os.altsep is not None and os.altsep != "/" and os.altsep in value))


def is_hub_repo_id(value) -> bool:
    """True when ``value`` is a syntactically valid Hub repo id that is not an existing local path."""
    if not isinstance(value, str) or not value or os.path.exists(value) or looks_like_local_path(value):
        return False
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(value)
    except HFValidationError:
        return False
    return True


def check_model_ref(value: str, option: str = "--model_name_or_path", *, revision: Optional[str] = None,
                    token=None, timeout: float = LOOKUP_TIMEOUT, repo_type: str = "model") -> str:
    """Check that ``value`` names an existing local folder or an existing Hub repo, quickly.

    Args:
        value: what the user passed.
        option: the flag to name in messages (``"--model_name_or_path"``, ``"MODEL"`` for ``hf-tpu demo``).
        revision: branch, tag or commit of a Hub repo.
        token: Hub token (default: ``HF_TOKEN`` or the cached login). Never in a message.
        timeout: seconds for the Hub request.
        repo_type: ``"model"`` (tokenizers and configs live in model repos too).

    Returns:
        ``"local"`` (an existing folder) or ``"hub"`` (the repo exists; with ``HF_HUB_OFFLINE=1``: it is in the
        local cache).

    Raises:
        ArgumentError: a missing local path, a file where a folder is needed, or a name that is neither a
            folder nor a valid repo id.
        HubRepoError: the repo or revision does not exist at the endpoint, or the endpoint cannot be reached
            within ``timeout`` seconds (the message names the endpoint).
        HubAuthError: the repo is gated or private and the token does not give access.
    """
    if os.path.isdir(value):
        return "local"
    if os.path.exists(value):
        raise ArgumentError(f"{option} {value!r} is a file; give a model folder (with config.json) or a Hub repo id.")
    if looks_like_local_path(value):
        raise ArgumentError(f"{option} {value!r}: no such folder. Give an existing model folder or a Hub repo id "
                            "('name' or 'user/name').")
    if not is_hub_repo_id(value):
        raise ArgumentError(f"{option} {value!r} is neither an existing local folder nor a valid Hub repo id "
                            "('name' or 'user/name': letters, digits, '-', '_', '.').")
    from huggingface_hub import HfApi, constants, try_to_load_from_cache
    from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError, RevisionNotFoundError

    endpoint = hub_endpoint()
    if constants.HF_HUB_OFFLINE or os.environ.get("HF_HUB_OFFLINE", "").upper() in ("1", "ON", "YES", "TRUE"):
        if isinstance(try_to_load_from_cache(value, "config.json", revision=revision), str):
            return "hub"
        raise HubRepoError(f"{option} {value!r} is not a local folder and HF_HUB_OFFLINE is set, but the Hub cache "
                           "has no copy of it; unset HF_HUB_OFFLINE or download it first.")
    try:
        HfApi(endpoint=endpoint).repo_info(value, revision=revision, token=token, timeout=timeout, repo_type=repo_type)
    except GatedRepoError:
        raise HubAuthError(f"{option} {value!r}: the repo is gated at {endpoint}; accept its conditions on the Hub "
                           "and log in (HF_TOKEN).") from None
    except RevisionNotFoundError:
        raise HubRepoError(f"{option} {value!r}: revision {revision!r} does not exist at {endpoint}.") from None
    except Exception as err:  # noqa: BLE001 (not found, requests' or httpx' connection errors, HTTP errors)
        names = " ".join(c.__name__ for c in type(err).__mro__)
        status = getattr(getattr(err, "response", None), "status_code", None)
        if isinstance(err, RepositoryNotFoundError) or status in (401, 404):  # the Hub says 401 for a missing repo
            near = similar_repo_ids(value, token, repo_type, timeout)
            raise HubRepoError(
                f"{option} {value!r} is neither an existing local folder nor a {repo_type} repo on {endpoint} (or the "
                "repo is private and no valid token was given). Check the path or repo id, HF_ENDPOINT and HF_TOKEN."
                + (" Did you mean " + " or ".join(repr(r) for r in near) + "?" if near else "")
            ) from None
        if status is None and ("Timeout" in names or "Connect" in names or isinstance(err, OSError)):
            kind = "timed out" if "Timeout" in names else "connection failed"
            raise HubRepoError(
                f"{option} {value!r} is not a local folder, and the Hub at {endpoint} could not be reached to look it "
                f"up ({kind} within {timeout:g} s). Check the network and HF_ENDPOINT, or set HF_HUB_OFFLINE=1 to use "
                "the local cache.") from None
        raise HubRepoError(f"{option} {value!r}: the Hub at {endpoint} answered "
                           f"{'HTTP ' + str(status) if status else type(err).__name__} when looking it up; try again "
                           "later or check HF_ENDPOINT.") from None
    return "hub"

