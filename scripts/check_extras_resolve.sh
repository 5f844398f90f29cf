#!/usr/bin/env bash
# Fresh-venv resolution of each extra (issue 30): `pip install --dry-run --ignore-installed ".[X]"` in a new venv,
# with pip's configured index (network or a mirror; nothing is installed). Per extra: the resolution succeeds,
# the pinned stack it picks (transformers, huggingface_hub, the framework), and every distribution pip fetched
# more than one version of (backtracking: each extra wheel is a download, e.g. transformers 5.x before 4.57).
# Minutes per extra, so not part of scripts/test.sh: CI checks the installed environments instead
# (tests/extras_resolution.py, in .venv, .venv-current and .venv-xla). Run it after changing pyproject.toml's
# dependencies.
# Usage: bash scripts/check_extras_resolve.sh [extra ...]    (default: every extra but test and beam;
#        "tensorflow-demo,test" is scripts/test.sh's set)
set -uo pipefail
cd "$(dirname "$0")/.."
PYTHON=$(command -v python3.11 || command -v python3)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$PYTHON" -m venv "$work/venv" || exit 1
"$work/venv/bin/python" -m pip install -q --upgrade pip || exit 1
extras=("$@")
[ "${#extras[@]}" -gt 0 ] || extras=(tensorflow keras jax torch torch-xla demo tensorflow-demo "tensorflow-demo,test")
failed=0
for extra in "${extras[@]}"; do
  start=$(date +%s)
  "$work/venv/bin/python" -m pip install --dry-run --ignore-installed --report "$work/report.json" ".[$extra]" \
    >"$work/log.txt" 2>&1
  rc=$?
  seconds=$(( $(date +%s) - start ))
  "$work/venv/bin/python" - "$extra" "$rc" "$seconds" "$work/log.txt" "$work/report.json" <<'PY' || failed=1
import json, re, sys
from collections import defaultdict
extra, rc, seconds, log_path, report_path = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
log = open(log_path, encoding="utf-8", errors="replace").read()
if rc != 0:
    print(f"[{extra}] FAILED to resolve ({seconds} s):\n" + "\n".join(log.splitlines()[-15:]))
    sys.exit(1)
# wheels and sdists pip read: "Downloading name-1.2-...", "Processing /path/name-1.2-...", "Using cached name-1.2-..."
seen = defaultdict(set)
for m in re.finditer(r"(?:Downloading|Processing|Using cached) (?:\S*/)?([A-Za-z0-9_.]+?)-(\d[^-\s]*?)(?:-py|-cp|\.tar|\.zip|-\d)", log):
    seen[re.sub(r"[-_.]+", "-", m.group(1)).lower()].add(m.group(2))
installs = {i["metadata"]["name"].lower(): i["metadata"]["version"] for i in json.load(open(report_path))["install"]}
stack = ", ".join(f"{d} {installs[d]}" for d in ("transformers", "huggingface-hub", "tensorflow", "keras", "jax",
                                                 "torch", "torch-xla", "gradio") if d in installs)
backtracked = {d: sorted(v) for d, v in seen.items() if len(v) > 1}
print(f"[{extra}] resolves in {seconds} s: {len(installs)} distributions ({stack}); "
      + (f"read more than one version of: {backtracked}" if backtracked else "no distribution read twice"))
PY
done
exit $failed
