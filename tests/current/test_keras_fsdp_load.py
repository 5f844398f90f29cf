"""``--model_name_or_path`` under ``--fsdp full_shard`` (issue 50 item 3): each process reads only its devices'
blocks of ``model.safetensors``, straight onto the placed sharding (backends/keras/sliced_load.py).

A tiny random ``RobertaForMaskedLM`` and ``ModernBertForMaskedLM`` saved by transformers are loaded on 4 CPU
devices: every sharded weight is a ``jax.Array`` of its ``--fsdp`` sharding right after the load (before any
trainer), its values those of the whole (replicated) load, and the reads were blocks: the largest is the largest
sharded tensor / 4 and in all each sharded tensor is read once. Trained, 2 processes x 2 devices with ``--fsdp
full_shard`` log the first-step losses of the replicated load on 1 x 4 devices (to 1e-6), each process having read
half of the sharded bytes. Runs in the current-releases venv (``tests/current``).
"""

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("jax")
if os.environ.get("KERAS_BACKEND", "jax") != "jax":
    pytest.skip("--backend keras runs on KERAS_BACKEND=jax", allow_module_level=True)

from test_keras_multiprocess import _env, _losses, _start, finish, free_port  # noqa: E402

STEPS = 2
#: loads ``sys.argv[1]`` replicated and under --fsdp full_shard on every device; prints what the test checks
LOAD = textwrap.dedent("""
    import json, logging, sys
    import numpy as np
    import jax
    from hf_tpu_ext.backends.keras import sliced_load
    from hf_tpu_ext.backends.keras.model import load_pretrained
    from hf_tpu_ext.backends.keras.placement import Placement

    logging.basicConfig(level=logging.INFO)
    counts = []
    class Count(sliced_load.ReadCount):
        def __init__(self):
            super().__init__()
            counts.append(self)
    sliced_load.ReadCount = Count
    whole, _ = load_pretrained(sys.argv[1], "float32")
    placement = Placement(fsdp="full_shard")
    model, config = load_pretrained(sys.argv[1], "float32", placement=placement)
    shard_for = sliced_load.fsdp_shardings(model, placement, config)
    out = {"sharded": 0, "sharded_bytes": 0, "largest": 0, "equal": True, "read_whole": []}
    for ours, ref in zip(model.trainable_variables, whole.trainable_variables):
        value, sharding = ours.value, shard_for(ours)
        out["equal"] &= bool(np.array_equal(np.asarray(value), np.asarray(ref.value)))
        if sharding is None:
            continue
        if not (value.sharding.is_equivalent_to(sharding, value.ndim) and len(value.sharding.device_set) == 4):
            out["read_whole"].append(ours.path)  # the trainer's put_state shards it
            continue
        out["sharded"] += 1
        out["sharded_bytes"] += int(value.nbytes)
        out["largest"] = max(out["largest"], int(value.nbytes))
    out.update(weights=counts[-1].weights, read=counts[-1].bytes, block=counts[-1].largest_block,
               variables=len(model.trainable_variables))
    print("RESULT" + json.dumps(out), flush=True)
""")


def _save_roberta(folder):
    from hf_tpu_ext.data.corpus import default_corpus_texts
    from hf_tpu_ext.data.tokenizer import train_bpe_tokenizer

    tokenizer = train_bpe_tokenizer(default_corpus_texts()[:200], vocab_size=300, model_max_length=32)
    config = transformers.RobertaConfig(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=2,
                                        num_attention_heads=2, intermediate_size=64, max_position_embeddings=34,
                                        pad_token_id=tokenizer.pad_token_id, type_vocab_size=1,
                                        layer_norm_eps=1e-5)
    transformers.RobertaForMaskedLM(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)


def _save_modernbert(folder):
    config = transformers.ModernBertConfig(vocab_size=304, hidden_size=32, num_hidden_layers=2,
                                           num_attention_heads=2, intermediate_size=64, max_position_embeddings=64,
                                           pad_token_id=1, bos_token_id=0, eos_token_id=2, sep_token_id=2,
                                           cls_token_id=0)
    transformers.ModernBertForMaskedLM(config).save_pretrained(folder)


def _load(folder):
    proc = subprocess.run([sys.executable, "-c", LOAD, str(folder)], env=_env(JAX_NUM_CPU_DEVICES=4),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.split("RESULT", 1)[1]), proc.stderr


def _train_args(start, out):
    return ["--backend", "keras", "--model_name_or_path", start, "--output_dir", out, "--max_seq_length", "32",
            "--per_device_train_batch_size", "2", "--max_train_samples", "64", "--max_steps", str(STEPS),
            "--logging_steps", "1", "--save_steps", "100", "--eval_strategy", "no", "--seed", "7",
            "--disable_tqdm", "true"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The saved models, the loads' results, the replicated 1 x 4 run and the --fsdp 2 x 2 one (side by side)."""
    root = tmp_path_factory.mktemp("fsdp_load")
    torch.manual_seed(0)
    _save_roberta(root / "roberta")
    _save_modernbert(root / "modernbert")
    port = free_port()
    procs = {"replicated": [_start(_train_args(root / "roberta", root / "replicated"), JAX_NUM_CPU_DEVICES=4)],
             "pair": [_start(_train_args(root / "roberta", root / "pair") + ["--fsdp", "full_shard"],
                             JAX_COORDINATOR_ADDRESS=f"127.0.0.1:{port}", JAX_NUM_PROCESSES=2, JAX_PROCESS_ID=i,
                             JAX_NUM_CPU_DEVICES=2) for i in range(2)]}
    loads = {kind: _load(root / kind) for kind in ("roberta", "modernbert")}
    ends = {name: finish(group) for name, group in procs.items()}
    for name, group in ends.items():
        for rc, err in group:
            assert rc == 0, f"{name}: {err[-3000:]}"
    return root, loads, ends


@pytest.mark.parametrize("kind", ["roberta", "modernbert"])
def test_the_load_reads_each_device_s_block_onto_the_fsdp_sharding(runs, kind):
    _, loads, _ = runs
    result, err = loads[kind]
    assert result["equal"] is True
    # RoBERTa's position rows are cut from the table and the token-type row added in: read whole (small)
    assert result["read_whole"] == (["embeddings/position_embeddings"] if kind == "roberta" else [])
    # min_num_params 0: every weight of this config has a dimension 4 divides
    assert result["sharded"] == result["weights"] == result["variables"] - len(result["read_whole"])
    assert result["block"] == result["largest"] // 4  # the largest tensor's quarter, never a whole tensor
    assert result["read"] == result["sharded_bytes"]  # each device's block once: each tensor once in all
    assert (f"{result['weights']} sharded weights, {result['read'] / 2**20:.2f} MiB read by this process, the "
            f"largest block {result['block'] / 2**20:.2f} MiB.") in err


def test_two_processes_load_their_halves_and_train_as_the_replicated_load(runs):
    root, loads, ends = runs
    ours, ref = _losses(root / "pair"), _losses(root / "replicated")
    assert [s for s, _ in ours] == list(range(1, STEPS + 1)) == [s for s, _ in ref]
    np.testing.assert_allclose([l for _, l in ours], [l for _, l in ref], atol=1e-6, rtol=1e-9)
    result, _ = loads["roberta"]
    # process 0 (the one that logs) read its two devices' blocks: half of the sharded bytes
    line = next(l for l in ends["pair"][0][1].splitlines() if "read by slices onto --fsdp full_shard" in l)
    assert f"{result['weights']} sharded weights, {result['sharded_bytes'] / 2 / 2**20:.2f} MiB read" in line


def test_two_tensors_are_compared_a_block_of_rows_at_a_time():
    """RoBERTa's untied-decoder check under a sliced load: never two vocabulary-sized tensors whole at once."""
    from hf_tpu_ext.backends.keras.architectures.layouts import same_values

    a = np.arange(24, dtype=np.float32).reshape(6, 4)
    reads = []

    class Rows:  # a tensor read by slices (SlicedTensor's shape and [index])
        shape = a.shape

        def __getitem__(self, index):
            reads.append(index)
            return a[index]

    assert same_values(Rows(), a.copy(), rows=4) is True
    assert reads == [slice(0, 4), slice(4, 8)]
    b = a.copy()
    b[5, 3] += 1
    assert same_values(a, b, rows=4) is False and same_values(a, a[:5]) is False
