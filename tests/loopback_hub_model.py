"""The loopback Hub's stored objects and the Hub's rules it answers by (``tests/loopback_hub.py`` serves them):
repos, commits and files; the card metadata checks (what the Hub rejects); ``.gitattributes`` LFS routing."""

from __future__ import annotations

import fnmatch
import hashlib
import json
import re
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

import yaml

KNOWN_LICENSES = {
    "apache-2.0", "mit", "bsd", "bsd-2-clause", "bsd-3-clause", "cc0-1.0", "cc-by-4.0", "cc-by-sa-4.0",
    "cc-by-nc-4.0", "cc-by-nc-sa-4.0", "gpl-2.0", "gpl-3.0", "lgpl-3.0", "agpl-3.0", "mpl-2.0", "unlicense",
    "openrail", "openrail++", "bigscience-openrail-m", "creativeml-openrail-m", "llama2", "llama3", "gemma",
    "odc-by", "pddl", "other", "unknown",
}
PIPELINE_TAGS = {"fill-mask", "text-classification", "token-classification", "text-generation", "feature-extraction"}
TYPE_PREFIX = {"model": "", "dataset": "datasets/", "space": "spaces/"}
INVALID_CREDENTIALS = "Invalid credentials in Authorization header"


def git_blob_sha1(data: bytes) -> str:
    """The git object id of a blob holding ``data`` (what the Hub reports as a regular file's oid/ETag)."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


@dataclass
class StoredFile:
    content: bytes
    lfs_sha256: Optional[str] = None  # set when the file was committed through LFS

    @property
    def blob_id(self) -> str:
        if self.lfs_sha256:  # the git blob of an LFS file is its pointer file
            pointer = f"version https://git-lfs.github.com/spec/v1\noid sha256:{self.lfs_sha256}\nsize {len(self.content)}\n"
            return git_blob_sha1(pointer.encode())
        return git_blob_sha1(self.content)


@dataclass
class Commit:
    sha: str
    message: str
    description: str
    parent: Optional[str]
    files: Dict[str, StoredFile]  # full tree after this commit
    added: List[str]
    deleted: List[str]
    author: str
    timestamp: float

    def as_dict(self) -> dict:
        return {
            "sha": self.sha, "message": self.message, "description": self.description, "parent": self.parent,
            "files": {p: f.content for p, f in self.files.items()}, "lfs_files": sorted(p for p, f in self.files.items() if f.lfs_sha256),
            "added": list(self.added), "deleted": list(self.deleted), "author": self.author, "timestamp": self.timestamp,
        }


@dataclass
class Repo:
    repo_id: str
    repo_type: str
    private: bool
    owner: str
    sdk: Optional[str] = None
    commits: Dict[str, Commit] = field(default_factory=dict)
    branches: Dict[str, str] = field(default_factory=dict)  # branch -> head commit sha


class HubHTTPError(Exception):
    """Raised inside a handler to answer an HTTP error with the Hub's error headers."""

    def __init__(self, status: int, message: str, error_code: Optional[str] = None, extra: Optional[dict] = None,
                 headers: Optional[dict] = None):
        super().__init__(message)
        self.status, self.message, self.error_code, self.extra = status, message, error_code, extra or {}
        self.headers = headers or {}


def validate_card_metadata(metadata) -> List[str]:
    """Check card metadata the way the Hub does for what hf-tpu-ext writes.

    Args:
        metadata: the parsed YAML block of a README.md.

    Returns:
        A list of error strings (empty when the metadata is valid).
    """
    errors: List[str] = []
    if not isinstance(metadata, dict):
        return ["metadata must be a YAML dictionary"]

    def str_or_str_list(key):
        if key not in metadata:
            return
        value = metadata[key]
        if isinstance(value, str) and value:
            return
        if isinstance(value, list) and value and all(isinstance(v, str) and v for v in value):
            return
        errors.append(f'"{key}" must be a string or an array of strings, got {json.dumps(value)}')

    for key in ("datasets", "base_model", "language", "tags", "license"):
        str_or_str_list(key)
    lic = metadata.get("license")
    if isinstance(lic, str) and lic not in KNOWN_LICENSES:
        errors.append(f'"license" must be a known license identifier, got "{lic}"')
    if "pipeline_tag" in metadata and metadata["pipeline_tag"] not in PIPELINE_TAGS:
        errors.append(f'"pipeline_tag" is not a known task: {metadata["pipeline_tag"]!r}')
    if "library_name" in metadata and not isinstance(metadata["library_name"], str):
        errors.append('"library_name" must be a string')

    if "model-index" in metadata:
        errors += _model_index_errors(metadata["model-index"])
    return errors


def _model_index_errors(index) -> List[str]:
    """The Hub's checks of a card's ``model-index``: names, results, tasks, datasets, metrics."""
    if not isinstance(index, list) or not index:
        return ['"model-index" must be a non-empty array']
    errors: List[str] = []
    for i, model in enumerate(index):
        where = f"model-index[{i}]"
        if not isinstance(model, dict) or not isinstance(model.get("name"), str) or not model.get("name"):
            errors.append(f'{where}.name must be a non-empty string')
            continue
        results = model.get("results")
        if not isinstance(results, list):
            errors.append(f"{where}.results must be an array")
            continue
        for j, result in enumerate(results):
            rwhere = f"{where}.results[{j}]"
            if not isinstance(result, dict):
                errors.append(f"{rwhere} must be an object")
                continue
            task = result.get("task")
            if not isinstance(task, dict) or not isinstance(task.get("type"), str):
                errors.append(f"{rwhere}.task.type must be a string")
            elif "name" in task and not isinstance(task["name"], str):
                errors.append(f"{rwhere}.task.name must be a string")
            dataset = result.get("dataset")
            if not isinstance(dataset, dict):
                errors.append(f"{rwhere}.dataset is required")
            else:
                for key in ("name", "type"):
                    if not isinstance(dataset.get(key), str) or not dataset.get(key):
                        errors.append(f"{rwhere}.dataset.{key} must be a non-empty string")
                for key, value in dataset.items():
                    if key == "args":
                        continue
                    if not isinstance(value, str):
                        errors.append(f"{rwhere}.dataset.{key} must be a string, got {json.dumps(value)}")
            metrics = result.get("metrics")
            if not isinstance(metrics, list) or not metrics:
                errors.append(f"{rwhere}.metrics must be a non-empty array")
                continue
            for k, metric in enumerate(metrics):
                mwhere = f"{rwhere}.metrics[{k}]"
                if not isinstance(metric, dict) or not isinstance(metric.get("type"), str):
                    errors.append(f"{mwhere}.type must be a string")
                    continue
                value = metric.get("value")
                if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
                    errors.append(f"{mwhere}.value must be a number, got {json.dumps(value)}")
                if "name" in metric and not isinstance(metric["name"], str):
                    errors.append(f"{mwhere}.name must be a string")
    return errors


def gitattributes_lfs(text: str, path: str) -> bool:
    """Whether a ``.gitattributes`` routes ``path`` through LFS (git: the last line whose pattern matches decides;
    a pattern without ``/`` matches the file name in any folder)."""
    lfs = False
    for line in text.splitlines():
        parts = line.split()
        if not parts or parts[0].startswith("#"):
            continue
        pattern = parts[0].lstrip("/")
        target = path if "/" in pattern else path.rsplit("/", 1)[-1]
        if not fnmatch.fnmatchcase(target, pattern):
            continue
        for attr in parts[1:]:
            if attr == "filter=lfs":
                lfs = True
            elif attr in ("-filter", "!filter") or attr.startswith("filter="):
                lfs = False
    return lfs


def split_card(text: str) -> Tuple[object, str]:
    """Split a README.md into (parsed YAML metadata or None, body). Raises ValueError on bad YAML."""
    match = re.match(r"^---\s*\n(.*?)\n---\s*\n?", text, flags=re.S)
    if not match:
        return None, text
    return yaml.safe_load(match.group(1)), text[match.end():]
