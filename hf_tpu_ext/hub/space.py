"""Deploy the Gradio fill-mask demo (``spaces_demo/``) as a Hub Space for a pushed model.

The Space gets these files in one commit:

* ``app.py``: ``spaces_demo/app.py`` unchanged (the page; PyTorch backend);
* ``hf_tpu_ext/__init__.py``, ``hf_tpu_ext/probes/*.py``, ``hf_tpu_ext/fill_mask/*.py`` and what they import:
  the library the page runs on (``hf_tpu_ext.fill_mask.space_modules()``), unchanged; ``app.py`` imports them
  from its own folder;
* ``requirements.txt``: ``spaces_demo/requirements.txt`` (CPU torch from PyTorch's index, every package pinned
  to the versions tested);
* ``README.md``: ``spaces_demo/README.md`` with ``models: [<model_id>]`` in its metadata, the placeholder
  model id in the body replaced and the model linked at the configured Hub endpoint (``HF_ENDPOINT``);
* ``model_id.txt``: the model id on one line. ``app.py`` shows ``$MODEL_ID`` when that Space variable is
  set, else this file's id, so the model can be changed in the Space settings without a new commit.
"""

from __future__ import annotations

import logging
import os
from typing import Dict, Optional

import hf_tpu_ext
from hf_tpu_ext.errors import HubRepoError
from hf_tpu_ext.fill_mask import space_modules
from hf_tpu_ext.hub.model_ref import hub_url
from hf_tpu_ext.hub.preflight import endpoint, hub_api, hub_call, preflight, resolve_token, whoami

logger = logging.getLogger("hf_tpu_ext.hub")

SPACE_FILES = ("app.py", "requirements.txt")
TEMPLATE_MODEL_ID = "your-username/your-model"
TEMPLATE_SPACE_ID = "your-username/your-space"
SHORT_DESCRIPTION_MAX = 60


def _demo_dir() -> str:
    import spaces_demo

    return os.path.dirname(os.path.abspath(spaces_demo.__file__))


def _validate_id(repo_id: Optional[str], flag: str, need_namespace: bool) -> str:
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    if not repo_id or not str(repo_id).strip():
        raise HubRepoError(f"Missing {flag}: pass it as 'user/name'.")
    repo_id = str(repo_id).strip()
    try:
        validate_repo_id(repo_id)
    except HFValidationError as err:
        raise HubRepoError(f"Invalid {flag} {repo_id!r}: {err} Use the form 'user/name'.") from None
    if need_namespace and "/" not in repo_id:
        raise HubRepoError(f"{flag} {repo_id!r} needs its namespace: use the form 'user/name'.")
    return repo_id


def render_space_readme(model_id: str, space_id: Optional[str] = None, template: Optional[str] = None) -> str:
    """The Space's README.md for ``model_id``.

    Args:
        model_id: the model repo id the Space shows, e.g. ``"alice/tiny-roberta"``.
        space_id: the Space's repo id, written into the body's API example (``None``: left as is).
        template: README text with Space metadata (default: ``spaces_demo/README.md``).

    Returns:
        The README text: metadata ``models: [model_id]``, the template's other metadata unchanged, and
        :data:`TEMPLATE_MODEL_ID` / :data:`TEMPLATE_SPACE_ID` in the body replaced by the ids; the link
        ``https://huggingface.co/<TEMPLATE_MODEL_ID>`` points at the model on the configured endpoint.

    Raises:
        HubRepoError: the template has no ``sdk: gradio`` metadata, or its ``short_description`` is
            longer than 60 characters (the Hub rejects it).
    """
    from huggingface_hub import SpaceCard

    if template is None:
        with open(os.path.join(_demo_dir(), "README.md"), encoding="utf-8") as f:
            template = f.read()
    card = SpaceCard(template)
    if getattr(card.data, "sdk", None) != "gradio":
        raise HubRepoError("The Space README template must declare `sdk: gradio` in its metadata.")
    short = getattr(card.data, "short_description", None) or ""
    if len(short) > SHORT_DESCRIPTION_MAX:
        raise HubRepoError(f"short_description is {len(short)} characters; the Hub allows {SHORT_DESCRIPTION_MAX}.")
    card.data.models = [model_id]
    # the model's link points at the Hub the Space is deployed to (HF_ENDPOINT), not always huggingface.co
    card.text = card.text.replace(f"https://huggingface.co/{TEMPLATE_MODEL_ID}", hub_url(model_id))
    card.text = card.text.replace(TEMPLATE_MODEL_ID, model_id)
    if space_id:
        card.text = card.text.replace(TEMPLATE_SPACE_ID, space_id)
    return str(card)


def space_files(model_id: str, space_id: Optional[str] = None) -> Dict[str, bytes]:
    """The files uploaded to the Space, by path in the repo.

    Args:
        model_id: the model repo id the Space shows.
        space_id: the Space's repo id (for the README's API example).

    Returns:
        ``{"app.py": ..., "requirements.txt": ..., "hf_tpu_ext/__init__.py": ..., "hf_tpu_ext/probes/...": ...,
        "hf_tpu_ext/fill_mask/...": ..., "README.md": ..., "model_id.txt": ...}`` (UTF-8 bytes).
    """
    files = {}
    for name in SPACE_FILES:
        with open(os.path.join(_demo_dir(), name), "rb") as f:
            files[name] = f.read()
    root = os.path.dirname(os.path.dirname(os.path.abspath(hf_tpu_ext.__file__)))
    for path in space_modules():
        with open(os.path.join(root, *path.split("/")), "rb") as f:
            files[path] = f.read()
    files["README.md"] = render_space_readme(model_id, space_id).encode("utf-8")
    files["model_id.txt"] = (model_id + "\n").encode("utf-8")
    return files


def deploy_space(model_id: str, space_id: str, token: Optional[str] = None, private: Optional[bool] = None) -> str:
    """Create (or update) a Gradio Space that runs the fill-mask demo of ``model_id``.

    Ids are checked locally first; then the token is checked (whoami), the model must exist on the Hub
    (readable with the token), the Space is created with ``space_sdk="gradio"`` (``exist_ok``) and the
    files of :func:`space_files` are uploaded in one commit. Talks to ``HF_ENDPOINT`` (read at call time).

    Args:
        model_id: model repo id ``"user/name"`` (already pushed).
        space_id: Space repo id ``"user/name"``, or ``"name"`` for the token owner's namespace.
        token: Hub token with write access to the Space's namespace (default: ``HF_TOKEN`` or the cached
            login). Never logged or put in a message.
        private: create the Space private (``None``: the Hub's default). An existing Space keeps its visibility.

    Returns:
        The Space's URL, e.g. ``"https://huggingface.co/spaces/alice/demo"``.

    Raises:
        HubRepoError: a malformed id, or the model repo does not exist.
        HubAuthError: no token, the Hub rejects it, or it cannot write to the Space's namespace.
        HubError: the Hub cannot be reached or answers another error.
    """
    from huggingface_hub import CommitOperationAdd

    model_id = _validate_id(model_id, "--model_id", need_namespace=True)
    space_id = _validate_id(space_id, "--space_id", need_namespace=False)
    space_files(model_id)  # fail on a broken template before any network call

    token = resolve_token(token)
    whoami(token)  # HubAuthError with what to do when missing or rejected
    api = hub_api(token)
    hub_call(f"find model {model_id} (push it first, e.g. `hf-tpu push`)", api.repo_info, token, model_id,
             repo_type="model")
    space_id = preflight(space_id, token, private=private, repo_type="space")
    files = space_files(model_id, space_id)
    operations = [CommitOperationAdd(path_in_repo=path, path_or_fileobj=data) for path, data in files.items()]
    hub_call(f"upload the demo to Space {space_id}", api.create_commit, token, repo_id=space_id, repo_type="space",
             operations=operations, commit_message=f"Fill-mask demo for {model_id}")
    url = f"{endpoint().rstrip('/')}/spaces/{space_id}"
    logger.info("Space %s runs the fill-mask demo of %s: %s", space_id, model_id, url)
    return url
