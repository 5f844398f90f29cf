"""Check, before any training step, that a run will be able to push to the Hub.

:func:`preflight` validates the repo id locally, asks the Hub who the token belongs to, checks that the
token may write to the target namespace, creates the repo (and branch) if needed, and returns the full
repo id; :func:`check_push_access` does the same checks without creating anything. Every error is a typed
:class:`~hf_tpu_ext.errors.HubError` whose message never contains the token; an invalid token is named by its
source (:func:`token_source`: ``HF_TOKEN`` overrides a saved login), an HTTP error by its status and file.

``hf-tpu train`` asks whoami once per run: its early checks (:mod:`hf_tpu_ext.commands.early_checks`, before any
framework is imported) call :func:`check_push_access` with ``remember=True``, and the run's later checks
(:func:`check_push_access`, :func:`preflight`) reuse that answer (:func:`whoami`).
"""

from __future__ import annotations

import copy
import difflib
import hashlib
import logging
import os
import threading
from typing import Dict, List, Optional, Tuple

from hf_tpu_ext.errors import HubAuthError, HubError, HubRepoError

logger = logging.getLogger("hf_tpu_ext.hub")

WRITE_ROLES = ("admin", "write", "contributor")
# fine-grained token permission that allows commits to a repo (whoami's auth.accessToken.fineGrained.scoped)
REPO_WRITE_PERMISSION = "repo.write"
TOKENS_URL = "https://huggingface.co/settings/tokens"
# whoami answers kept by ``remember=True``, keyed by (endpoint, SHA-256 of the token): never the token itself
_REMEMBERED: Dict[Tuple[str, str], dict] = {}


def transport_errors() -> tuple:
    """The exception classes of a connection failure or timeout for the installed HTTP stack.

    huggingface_hub < 1.0 talks through ``requests``, 1.x through ``httpx``, 2.x through ``httpx2``; each is
    covered when present (an unreachable Hub under 2.x was an 88-line ``httpx2.ConnectError`` traceback).
    """
    errors = [ConnectionError, TimeoutError]
    try:
        import requests

        errors += [requests.ConnectionError, requests.Timeout]
    except ImportError:  # huggingface_hub 1.x without requests
        pass
    try:
        import httpx

        errors += [httpx.TransportError]
    except ImportError:
        pass
    try:
        import httpx2

        errors += [httpx2.TransportError]
    except (ImportError, AttributeError):
        pass
    return tuple(errors)


def resolve_token(token: Optional[str] = None) -> Optional[str]:
    """The Hub token to use: ``token`` if given, else huggingface_hub's :func:`~huggingface_hub.get_token`
    (``HF_TOKEN``, then ``HUGGING_FACE_HUB_TOKEN``, then the token saved by ``hf auth login``).

    Args:
        token: an explicit token (``--hub_token``); empty strings count as unset.

    Returns:
        The token string, or ``None`` when there is none.
    """
    if token:
        return token
    from huggingface_hub import get_token

    return get_token() or None


def token_source(token: Optional[str]) -> str:
    """Where ``token`` came from, in words for a message: ``"HF_TOKEN"``, ``"HUGGING_FACE_HUB_TOKEN"``,
    ``"login"`` (the file ``hf auth login`` saved) or ``"given"`` (``--hub_token`` or a Python argument).

    Compared by value, in :func:`huggingface_hub.get_token`'s order, so a token that is both in ``HF_TOKEN``
    and passed explicitly counts as ``HF_TOKEN`` (the variable then holds the bad value too).
    """
    if not token:
        return "given"
    for name in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN"):
        if (os.environ.get(name) or "").strip() == token.strip():
            return name
    from huggingface_hub import constants

    try:
        with open(constants.HF_TOKEN_PATH, encoding="utf-8") as f:
            if f.read().strip() == token.strip():
                return "login"
    except OSError:
        pass
    return "given"


def invalid_token_message(token: Optional[str]) -> str:
    """The message for a token the Hub rejects (401), naming where it came from (never the token itself).

    ``HF_TOKEN`` overrides a saved login (huggingface_hub's :func:`~huggingface_hub.get_token` order), so a
    stale ``HF_TOKEN`` keeps failing after a fresh ``hf auth login``: the message says so.
    """
    source = token_source(token)
    if source in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN"):
        return (f"Hub token invalid: it comes from the {source} environment variable, which takes precedence over "
                f"a `hf auth login` (huggingface_hub's token order). Set {source} to a valid token, or unset "
                f"it (`unset {source}`) to use your login, or pass --hub_token.")
    if source == "login":
        from huggingface_hub import constants

        return (f"Hub token invalid: it is the one saved by `hf auth login` ({constants.HF_TOKEN_PATH}). Log "
                "in again with a valid token, set HF_TOKEN, or pass --hub_token.")
    return ("Hub token invalid: the Hub rejected the token passed as --hub_token (hub_token= in Python). Pass a "
            "valid one, or drop it to use HF_TOKEN or your `hf auth login`.")


def scrub(text: str, token: Optional[str]) -> str:
    """``text`` with every occurrence of ``token`` replaced by ``<redacted>`` (no-op without a token)."""
    text = str(text)
    if token:
        text = text.replace(token, "<redacted>")
    return text


def hub_api(token: Optional[str]):
    from huggingface_hub import HfApi

    return HfApi(endpoint=endpoint(), token=token)


def endpoint() -> str:
    """The Hub endpoint in use, read at call time so a changed ``HF_ENDPOINT`` (a private or test Hub) is honoured:
    ``HF_ENDPOINT``, else ``huggingface_hub.constants.ENDPOINT`` (default ``https://huggingface.co``), without a
    trailing slash. The project's one reader of ``HF_ENDPOINT`` (ARCHITECTURE.md, environment variables)."""
    from huggingface_hub import constants

    return (os.environ.get("HF_ENDPOINT") or constants.ENDPOINT).rstrip("/")


def hub_call(what: str, fn, token: Optional[str], /, *args, **kwargs):
    """Run one huggingface_hub call, turning transport failures into :class:`HubError` without the token.

    Args:
        what: a short description for the message, e.g. ``"create repo alice/m"``.
        fn: the callable (a bound :class:`huggingface_hub.HfApi` method).
        token: the token in use, scrubbed from any message.

    Returns:
        What ``fn`` returns.

    Raises:
        HubError: the endpoint could not be reached (connection error, timeout).
        HubRepoError: the repo or revision does not exist (404); a missing repo is named, with the owner's
            repo of the nearest name when there is one (:func:`missing_repo_message`).
        HubAuthError: 401/403 from the Hub.
        HubError: any other HTTP error, with the Hub's status and message.

    A download's HTTP error that huggingface_hub wraps (``snapshot_download``/``hf_hub_download`` raise
    ``LocalEntryNotFoundError`` "check your connection" for a 403 on a file they could not find in the cache)
    is reported by its status and the file it was for (:func:`http_error`).
    """
    from huggingface_hub.utils import (GatedRepoError, HfHubHTTPError, LocalEntryNotFoundError,
                                       RepositoryNotFoundError, RevisionNotFoundError)

    try:
        return fn(*args, **kwargs)
    except transport_errors() as err:
        raise _unreachable(what, err) from None
    except (RepositoryNotFoundError, RevisionNotFoundError) as err:
        repo_id = _repo_id_argument(args, kwargs)
        if isinstance(err, RepositoryNotFoundError) and not isinstance(err, GatedRepoError) and repo_id:
            # name the repo (and the owner's nearest one) instead of the Hub's "404 Client Error."
            detail = scrub(missing_repo_message(repo_id, token, kwargs.get("repo_type") or "model"), token)
            raise HubRepoError(f"Could not {what}: {detail}{'' if detail.endswith('?') else '.'}") from None
        if isinstance(err, RevisionNotFoundError) and repo_id and kwargs.get("revision"):
            # the Hub's own text can be a bare "404 Client Error.": name the revision and its repo
            raise HubRepoError(f"Could not {what}: {repo_id} has no revision {kwargs['revision']!r} at {endpoint()}; "
                               "check the branch, tag or commit name.") from None
        raise HubRepoError(f"Could not {what}: {scrub(_first_line(err), token)}") from None
    except (HfHubHTTPError, LocalEntryNotFoundError) as err:
        # LocalEntryNotFoundError is an HfHubHTTPError without a response in huggingface_hub < 1.0, a
        # FileNotFoundError in 1.x: either way the answer that failed is its cause
        has_status = getattr(getattr(err, "response", None), "status_code", None) is not None
        cause = err if has_status else _wrapped_cause(err)
        if cause is None:
            if isinstance(err, HfHubHTTPError):
                raise HubError(f"Could not {what}: {scrub(_server_message(err), token)}") from None
            raise
        if isinstance(cause, transport_errors()):
            raise _unreachable(what, cause) from None
        raise http_error(what, cause, token) from None


def _repo_id_argument(args: tuple, kwargs: dict) -> Optional[str]:
    """The repo id a huggingface_hub call was given (``repo_id=`` or its first positional argument)."""
    value = kwargs.get("repo_id", args[0] if args else None)
    return value if isinstance(value, str) and value else None


def _unreachable(what: str, err: BaseException) -> HubError:
    return HubError(f"Could not reach the Hub at {endpoint()} to {what} ({type(err).__name__}). Check the network "
                    "connection or HF_ENDPOINT, then retry.")


def _wrapped_cause(err: BaseException) -> Optional[BaseException]:
    """The HTTP error (an exception with ``response.status_code``) or transport error behind ``err``, following
    ``__cause__``/``__context__`` a few levels; ``None`` when there is none."""
    seen = err.__cause__ or err.__context__
    for _ in range(5):
        if seen is None:
            return None
        if getattr(getattr(seen, "response", None), "status_code", None) is not None:
            return seen
        if isinstance(seen, transport_errors()):
            return seen
        seen = seen.__cause__ or seen.__context__
    return None


def file_in_url(url: str) -> Optional[str]:
    """The repo file a Hub URL is about (``.../resolve/<revision>/<path>`` -> ``<path>``), else ``None``."""
    from urllib.parse import unquote, urlsplit

    path = urlsplit(str(url)).path
    if "/resolve/" not in path:
        return None
    rest = path.split("/resolve/", 1)[1]
    return unquote(rest.split("/", 1)[1]) if "/" in rest else None


def http_error(what: str, err: BaseException, token: Optional[str]) -> HubError:
    """The typed error for an HTTP error answer: its status, the file it was for, the Hub's message, advice.

    Args:
        what: what was being done, e.g. ``"download last-checkpoint/ of alice/m"``.
        err: an exception with ``response`` (``status_code``, ``url``): huggingface_hub's ``HfHubHTTPError``.
        token: scrubbed from the message.

    Returns:
        ``HubAuthError`` (401, 403), ``HubRepoError`` (404) or ``HubError``, e.g. ``Could not download
        last-checkpoint/ of alice/m: the Hub answered HTTP 403 for last-checkpoint/model.weights.h5 (...). ...``
    """
    response = getattr(err, "response", None)
    status = getattr(response, "status_code", None)
    name = file_in_url(getattr(response, "url", "") or "")
    detail = scrub(_server_message(err), token)
    message = f"Could not {what}: the Hub answered HTTP {status}{f' for {name}' if name else ''} ({detail})."
    if status == 401:
        return HubAuthError(f"{message} {invalid_token_message(token)}")
    if status == 403:
        return HubAuthError(f"{message} The token may not read it: for a gated or private repo, request access or use "
                            "a token of an account that has it.")
    if status == 404:
        return HubRepoError(f"{message} Check the repo id, the revision and that the file was pushed.")
    if status == 429 or (isinstance(status, int) and status >= 500):
        return HubError(f"{message} The Hub is busy or failing; retry in a few minutes.")
    return HubError(message)


def _first_line(err) -> str:
    return str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__


def _server_message(err) -> str:
    return getattr(err, "server_message", None) or _first_line(err)


def whoami(token: Optional[str], *, remember: bool = False) -> dict:
    """``HfApi.whoami`` against the configured endpoint; an answer remembered for this endpoint and token is
    returned without asking again.

    Args:
        token: the Hub token.
        remember: keep the answer for the later calls of this process (``hf-tpu train``'s early check: one whoami
            per run); library callers leave it off, so a changed token permission is seen on their next call.

    Returns:
        The whoami answer (a copy: callers may change it).

    Raises:
        HubAuthError: no token, or the Hub rejects it.
        HubError: the endpoint could not be reached (``HF_HUB_OFFLINE`` included) or answered another error.
    """
    if not token:
        raise HubAuthError("No Hub token found: run `hf auth login`, set HF_TOKEN, or pass --hub_token.")
    key = (endpoint(), hashlib.sha256(token.encode("utf-8")).hexdigest())
    if key in _REMEMBERED:
        return copy.deepcopy(_REMEMBERED[key])
    answer = _ask_whoami(token)
    if remember:
        _REMEMBERED[key] = copy.deepcopy(answer)
    return answer


def forget_whoami() -> None:
    """Drop the remembered whoami answers (:func:`whoami` ``remember=True``): the next call asks the Hub."""
    _REMEMBERED.clear()


def _ask_whoami(token: str) -> dict:
    api = hub_api(token)
    try:
        return api.whoami(token=token)
    except transport_errors() as err:
        raise HubError(
            f"Could not reach the Hub at {endpoint()}/api/whoami-v2 ({type(err).__name__}). Check the network "
            "connection or HF_ENDPOINT, then retry."
        ) from None
    except Exception as err:  # requests.HTTPError (huggingface_hub < 1.0) or HfHubHTTPError
        status = getattr(getattr(err, "response", None), "status_code", None)
        if status is None:
            raise
        if status == 401:
            raise HubAuthError(invalid_token_message(token)) from None
        raise HubError(f"The Hub at {endpoint()} answered HTTP {status} to whoami: {scrub(_first_line(err), token)}") from None


def writable_namespaces(user: dict) -> list:
    """The user name and the orgs where the whoami answer grants a write role."""
    names = [user.get("name")]
    for org in user.get("orgs") or []:
        role = org.get("roleInOrg") or org.get("role")
        if role in WRITE_ROLES:
            names.append(org.get("name"))
    return [n for n in names if n]


def token_role(user: dict) -> Optional[str]:
    """The token's role in a whoami answer: ``"read"``, ``"write"``, ``"fineGrained"``, or ``None`` (not said).

    The Hub reports it as ``auth.accessToken.role`` (what :meth:`huggingface_hub.HfApi.get_token_permission`
    reads); OAuth and older answers may leave it out.
    """
    access = ((user.get("auth") or {}).get("accessToken") or {})
    return access.get("role")


def check_write_access(user: dict, repo_id: str, repo_type: str = "model") -> None:
    """Raise unless the whoami answer ``user`` shows a token that may commit to ``repo_id``.

    - role ``"read"``: never;
    - role ``"fineGrained"``: a ``scoped`` entry for the repo itself (entity type ``model``/``dataset``/
      ``space``, name ``repo_id``) or its namespace (entity type ``user``/``org``) must hold ``repo.write``;
    - role ``"write"`` or not given: the namespace check (:func:`writable_namespaces`) decides.

    Raises:
        HubAuthError: what the token lacks and where to make one that has it.
    """
    role = token_role(user)
    name = user.get("name", "?")
    if role == "read":
        raise HubAuthError(
            f"The Hub token of user {name!r} is read-only (role 'read'): it cannot push to {repo_id}. Create a "
            f"token with write access at {TOKENS_URL} and pass it with --hub_token or HF_TOKEN."
        )
    if role != "fineGrained":
        return
    namespace = repo_id.split("/")[0]
    fine = ((user.get("auth") or {}).get("accessToken") or {}).get("fineGrained") or {}
    for scope in fine.get("scoped") or []:
        entity = scope.get("entity") or {}
        kind, entity_name = entity.get("type"), entity.get("name")
        covers = (kind in ("user", "org") and entity_name == namespace) or (kind == repo_type and entity_name == repo_id)
        if covers and REPO_WRITE_PERMISSION in (scope.get("permissions") or []):
            return
    raise HubAuthError(
        f"The fine-grained Hub token of user {name!r} has no {REPO_WRITE_PERMISSION!r} permission for {repo_id} "
        f"or the namespace {namespace!r}. Add write access to repos of {namespace!r} to the token at "
        f"{TOKENS_URL}, or use another token."
    )


def check_push_access(repo_id: Optional[str], token: Optional[str], *, repo_type: str = "model",
                      default_name: Optional[str] = None, remember: bool = False) -> tuple:
    """Every check of :func:`preflight` that creates nothing: the repo id's form, the token (whoami), the
    namespace and the token's write permission. A run calls it before its data checks and :func:`preflight`
    (which creates the repo) only after them, so a run refused for its data leaves no empty repo behind.
    ``remember``: keep the whoami answer for this process's later checks (:func:`whoami`).

    Returns:
        ``(full repo id, user name)``, e.g. ``("alice/my-model", "alice")``.

    Raises:
        HubRepoError, HubAuthError, HubError: as :func:`preflight`.
    """
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    name = repo_id or default_name
    if not name:
        raise HubRepoError("No Hub repo id: pass --hub_model_id user/name.")
    try:
        validate_repo_id(name)
    except HFValidationError as err:
        raise HubRepoError(f"Invalid Hub repo id {name!r}: {err} Use the form 'user/name'.") from None

    user = whoami(token, remember=remember)
    user_name = user.get("name", "?")
    namespace, _, short = name.rpartition("/")
    if not namespace:
        namespace, name = user_name, f"{user_name}/{name}"
    allowed = writable_namespaces(user)
    if namespace not in allowed:
        raise HubAuthError(
            f"User {user_name!r} cannot write to namespace {namespace!r} (writable: {', '.join(allowed)}). "
            f"Push to one of those, or use a token of an account with write access to {namespace!r}."
        )

    check_write_access(user, name, repo_type)  # also for a repo that exists already (create_repo is a no-op)
    return name, user_name


def preflight(
    repo_id: Optional[str],
    token: Optional[str],
    *,
    private: Optional[bool] = None,
    revision: Optional[str] = None,
    repo_type: str = "model",
    default_name: Optional[str] = None,
) -> str:
    """Make sure ``repo_id`` exists and ``token`` can write to it; return the full ``namespace/name``.

    Args:
        repo_id: ``"namespace/name"`` or ``"name"`` (the namespace is then the token's user); ``None`` uses
            ``default_name``.
        token: the Hub token (see :func:`resolve_token`).
        private: create the repo private (``None``: the Hub's default). An existing repo is left as it is.
        revision: a branch to push to; created from ``main`` when missing.
        repo_type: ``"model"`` or ``"space"`` (a Space is created with the gradio SDK).
        default_name: the repo name when ``repo_id`` is ``None`` (e.g. the output folder's name).

    Returns:
        The full repo id, e.g. ``"alice/my-model"``.

    Raises:
        HubRepoError: the repo id is malformed or missing.
        HubAuthError: the token is missing/invalid, read-only, or cannot write to the namespace or repo.
        HubError: the Hub could not be reached.
    """
    name, user_name = check_push_access(repo_id, token, repo_type=repo_type, default_name=default_name)
    api = hub_api(token)
    kwargs = {"space_sdk": "gradio"} if repo_type == "space" else {}
    hub_call(f"create repo {name}", api.create_repo, token, name, private=private, repo_type=repo_type,
             exist_ok=True, **kwargs)
    if revision and revision != "main":
        hub_call(f"create branch {revision!r} of {name}", api.create_branch, token, name, branch=revision,
                 repo_type=repo_type, exist_ok=True)
    logger.info("Hub repo %s is ready (user %s%s).", name, user_name, f", branch {revision}" if revision else "")
    return name


# ---- a repo the Hub does not know: "did you mean" --------------------------------------------------------
LISTING_TIMEOUT = 10.0  # seconds for the owner's listing (huggingface_hub's own etag default)
LISTING_LIMIT = 1000  # repos of one owner compared for a "did you mean" (one or two pages of the listing)


def similar_repo_ids(repo_id: str, token=None, repo_type: str = "model", timeout: float = LISTING_TIMEOUT,
                     ) -> List[str]:
    """Repo ids of ``repo_id``'s owner that are close to it (``difflib``, best first, at most 3).

    Args:
        repo_id: ``"owner/name"`` that was not found (a bare ``"name"`` has no owner to list: ``[]``).
        token: Hub token (lists the owner's private repos too when it may read them). Never in a message.
        repo_type: ``"model"``, ``"dataset"`` or ``"space"``.
        timeout: seconds to wait for the listing (it runs in a daemon thread: huggingface_hub's listing has no
            timeout of its own).

    Returns:
        Up to 3 ``"owner/name"`` ids, closest first; ``[]`` when the owner has none close, or the listing fails
        or takes longer than ``timeout`` (a suggestion is a courtesy: it never changes the error).
    """
    if "/" not in repo_id:
        return []
    owner, name = repo_id.split("/", 1)
    found: List[str] = []

    def listing() -> None:
        from huggingface_hub import HfApi

        api = HfApi(endpoint=endpoint(), token=token)
        lister = {"model": api.list_models, "dataset": api.list_datasets, "space": api.list_spaces}[repo_type]
        found.extend(r.id for r in lister(author=owner, limit=LISTING_LIMIT))

    def guarded() -> None:
        try:
            listing()
        except Exception:  # noqa: BLE001 (no listing route, HTTP or transport error: no suggestion)
            found.clear()

    worker = threading.Thread(target=guarded, name="hf-tpu-ext-similar-repos", daemon=True)
    worker.start()
    worker.join(timeout)
    if worker.is_alive():
        return []
    names = {r.split("/", 1)[1]: r for r in list(found) if "/" in r and r != repo_id}
    return [names[n] for n in difflib.get_close_matches(name, list(names), n=3, cutoff=0.6)]


def missing_repo_message(repo_id: str, token=None, repo_type: str = "model") -> str:
    """What to say about a repo the Hub answered "not found" for (401/404), without the token, e.g.
    ``the model repo 'alice/jargon-tff' does not exist at https://huggingface.co (or it is private and the token
    cannot read it); did you mean 'alice/jargon-tf'?`` when :func:`similar_repo_ids` finds one, else ending
    ``...; check the repo id and HF_TOKEN``."""
    message = (f"the {repo_type} repo {repo_id!r} does not exist at {endpoint()} (or it is private and the token "
               "cannot read it); ")
    near = similar_repo_ids(repo_id, token, repo_type)
    if near:
        return message + "did you mean " + " or ".join(repr(r) for r in near) + "?"
    return message + "check the repo id and HF_TOKEN"
