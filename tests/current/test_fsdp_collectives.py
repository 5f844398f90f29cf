"""The collectives of the compiled ``--fsdp`` train step (issue 50's step overhead), counted in its optimized HLO.

``python -m benchmarks.fsdp_step --preset tiny --hlo-only`` on 4 CPU devices (a subprocess: the device count is
fixed when JAX starts): RoBERTa, 2 layers, vocabulary 509 (as in a run whose tokenizer got fewer tokens than asked:
no device count divides it, so the word embeddings are sharded on the hidden dimension), 4 modules holding sharded
weights (``embeddings``, ``encoder_layer_0``, ``encoder_layer_1``, ``mlm_head``). ``full_shard`` gathers each
sharded weight by one all-gather and reduces the gradients as the replicated step does; no activation is resharded
(no all-to-all, no all-reduce of activations). ``shard_grad_op`` gathers its updated weights by one all-gather per
module. GSPMD's propagation alone (the benchmark's ``full_shard_propagated``) compiled 28 all-gathers, 34
all-reduces and 7 all-to-alls here, resharding activations along the hidden dimension. These counts do not depend
on the machine's load, unlike the step time (the benchmark's figure).
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("keras_hub")
pytest.importorskip("jax")
if os.environ.get("KERAS_BACKEND", "jax") != "jax":
    pytest.skip("--backend keras runs on KERAS_BACKEND=jax", allow_module_level=True)

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def counts(tmp_path_factory):
    out = tmp_path_factory.mktemp("collectives") / "counts.json"
    env = dict(os.environ, KERAS_BACKEND="jax", JAX_PLATFORMS="cpu",
               PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    modes = ["replicated", "full_shard", "shard_grad_op"]
    done = subprocess.run([sys.executable, "-m", "benchmarks.fsdp_step", "--preset", "tiny", "--devices", "4",
                           "--hlo-only", "--modes", *modes, "--json", str(out)],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    report = json.loads(out.read_text())["modes"]
    counts = {mode: {kind: entry["count"] for kind, entry in report[mode]["collectives"].items()} for mode in modes}
    return counts, report["full_shard"]["sharded_weights"]


def test_full_shard_gathers_each_weight_once_and_reduces_as_replicated(counts):
    counts, sharded = counts
    assert sharded == 40  # every trainable weight of the tiny RoBERTa but mlm_head/bias [509] (min_num_params 0)
    # replicated: the masked-token count's and the gradients' (one combined all-reduce each)
    assert counts["replicated"] == {"all-reduce": 2}
    assert counts["full_shard"] == {"all-gather": sharded, "all-reduce": 2}


def test_shard_grad_op_gathers_the_updated_weights_per_module(counts):
    counts, _ = counts
    # the 4 modules' updated weights (one all-gather each) and one of the embedding gradient's layout; the
    # replicated step's 2 all-reduces; a 16 KiB all-to-all of the word embeddings' gradient (vocabulary 509 lets no
    # device count split it, so they are sharded on the hidden dimension)
    assert counts["shard_grad_op"] == {"all-gather": 5, "all-reduce": 2, "all-to-all": 1}
