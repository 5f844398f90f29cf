"""`hf-tpu train --backend keras --streaming`: a `datasets` IterableDataset, one slice per process, resumable.

Asserted on the token ids each step was fed (recorded by ``stream_recorder.py`` around the run): a run killed
after checkpoint 3 and resumed feeds steps 4-6 exactly what an uninterrupted run feeds them -- no block seen twice,
none skipped, together the tokenized corpus in order; 2 processes read disjoint examples (each its
``split_dataset_by_node`` slice) and both positions are in the checkpoint; the refusals are one line, before any
compute. Local json files and a local dataset folder only (no network).

Runs in the current-releases venv: ``KERAS_BACKEND=jax JAX_PLATFORMS=cpu python -m pytest tests/current``.
"""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("jax")
pytest.importorskip("datasets")

from test_keras_multiprocess import _env, finish, free_port  # noqa: E402

HERE = Path(__file__).resolve().parent
L, STEPS = 32, 6


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """A jsonl file of the embedded corpus's first 400 texts (every 7th empty: skipped, as without streaming) and
    a byte-level BPE of 300 tokens saved beside it."""
    from hf_tpu_ext.data.corpus import default_corpus_texts
    from hf_tpu_ext.data.tokenizer import train_bpe_tokenizer

    root = tmp_path_factory.mktemp("stream")
    texts = [("" if i % 7 == 3 else t) for i, t in enumerate(default_corpus_texts()[:400])]
    (root / "train.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    (root / "valid.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts[:60]))
    train_bpe_tokenizer(texts, vocab_size=300, model_max_length=L).save_pretrained(str(root / "tok"))
    return root, texts


def _expected_stream(root, texts):
    """The ids of the non-empty texts, each tokenized with its special tokens, concatenated (int32 [n])."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(root / "tok"))
    return [np.asarray(tok(t)["input_ids"], np.int32) for t in texts if t]


def _args(root, out, *extra):
    return ["train", "--backend", "keras", "--streaming", "true", "--train_file", str(root / "train.jsonl"),
            "--validation_file", str(root / "valid.jsonl"), "--max_eval_samples", "8",
            "--tokenizer_name", str(root / "tok"), "--output_dir", str(out),
            "--hidden_size", "32", "--num_hidden_layers", "1", "--num_attention_heads", "2",
            "--intermediate_size", "64", "--max_seq_length", str(L), "--per_device_train_batch_size", "2",
            "--per_device_eval_batch_size", "2", "--logging_steps", "1", "--max_steps", str(STEPS),
            "--save_steps", "3", "--seed", "7", "--eval_strategy", "no", "--disable_tqdm", "true",
            "--report_to", "none", *extra]


def _start(args, prefix, **env):
    return subprocess.Popen([sys.executable, str(HERE / "stream_recorder.py"), str(prefix), *map(str, args)],
                            env=_env(**env), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _fed(prefix, process=0):
    """``{step: int32 [R, L]}`` recorded for ``process`` (a later record of a step replaces an earlier one)."""
    lines = Path(f"{prefix}-{process}.jsonl").read_text().splitlines()
    return {r["step"]: np.asarray(r["ids"], np.int32) for r in map(json.loads, lines)}


def test_a_killed_and_resumed_stream_feeds_what_an_uninterrupted_one_does(corpus, tmp_path):
    root, texts = corpus
    whole = _start(_args(root, tmp_path / "whole"), tmp_path / "whole-fed", JAX_NUM_CPU_DEVICES=1)
    cut = _start(_args(root, tmp_path / "cut"), tmp_path / "cut-fed", JAX_NUM_CPU_DEVICES=1,
                 HF_TPU_EXT_TEST_KILL_AT="train")  # SIGKILL right after checkpoint-3's trainer state
    (rc_whole, err_whole), (rc_cut, err_cut) = finish([whole, cut])
    assert rc_whole == 0, err_whole[-3000:]
    assert rc_cut == -9, err_cut[-3000:]
    assert sorted(p.name for p in (tmp_path / "cut").glob("checkpoint-*")) == ["checkpoint-3"]
    state = json.loads((tmp_path / "cut" / "checkpoint-3" / "data_state-0.json").read_text())
    assert (state["global_step"], state["process_count"], state["rows"]) == (3, 1, 2)
    before = _fed(tmp_path / "cut-fed")
    resumed = _start(_args(root, tmp_path / "cut", "--resume_from_checkpoint", "true"), tmp_path / "resumed-fed",
                     JAX_NUM_CPU_DEVICES=1)
    [(rc, err)] = finish([resumed])
    assert rc == 0, err[-3000:]
    assert "resuming from" in err and "checkpoint-3" in err
    ref, after = _fed(tmp_path / "whole-fed"), _fed(tmp_path / "resumed-fed")
    assert sorted(ref) == list(range(STEPS)) and sorted(after) == [3, 4, 5]
    for step in range(3):
        np.testing.assert_array_equal(before[step], ref[step], err_msg=f"step {step + 1}")
    for step in range(3, STEPS):
        np.testing.assert_array_equal(after[step], ref[step], err_msg=f"step {step + 1}")
    # none seen twice, none skipped: the six steps are the tokenized corpus's first 6 x 2 blocks, in order
    trained = np.concatenate([before[s].reshape(-1) for s in range(3)] + [after[s].reshape(-1) for s in range(3, 6)])
    expected = np.concatenate(_expected_stream(root, texts))[: STEPS * 2 * L]
    np.testing.assert_array_equal(trained, expected)
    losses = [e["loss"] for e in json.loads((tmp_path / "cut" / "trainer_state.json").read_text())["log_history"]
              if "loss" in e]
    ref_losses = [e["loss"] for e in json.loads((tmp_path / "whole" / "trainer_state.json").read_text())[
        "log_history"] if "loss" in e]
    np.testing.assert_allclose(losses, ref_losses, atol=1e-5, rtol=0)


def test_two_processes_read_disjoint_examples_of_the_stream(corpus, tmp_path):
    root, texts = corpus
    out, address = tmp_path / "run", f"127.0.0.1:{free_port()}"
    procs = [_start(_args(root, out), tmp_path / "fed", JAX_COORDINATOR_ADDRESS=address, JAX_NUM_PROCESSES=2,
                    JAX_PROCESS_ID=i, JAX_NUM_CPU_DEVICES=1) for i in range(2)]
    results = finish(procs)
    assert [rc for rc, _ in results] == [0, 0], results[0][1][-3000:] + results[1][1][-3000:]
    assert "2 cpu device(s) in 2 process(es)" in results[0][1]
    docs = _expected_stream(root, texts)
    for i in range(2):
        fed = _fed(tmp_path / "fed", i)
        assert sorted(fed) == list(range(STEPS))
        got = np.concatenate([fed[s].reshape(-1) for s in range(STEPS)])
        # process i: the non-empty texts i, i + 2, ... of the file (split_dataset_by_node of one shard)
        mine = [ids for row, ids in _texts_by_row(texts, docs) if row % 2 == i]
        np.testing.assert_array_equal(got, np.concatenate(mine)[: got.size])
    for i in range(2):
        state = json.loads((out / f"checkpoint-{STEPS}" / f"data_state-{i}.json").read_text())
        assert (state["global_step"], state["process_count"], state["rows"]) == (STEPS, 2, 2)  # 4 rows, 2 each


def _texts_by_row(texts, docs):
    """``(row of the file, ids)`` of the non-empty texts (empty rows are read, and skipped, by the process)."""
    rows = [r for r, t in enumerate(texts) if t]
    return list(zip(rows, docs))


def _parse(*extra):
    from hf_tpu_ext.args import parse_args

    return parse_args(["--output_dir", "unused", "--train_file", "t.txt", "--streaming", "true", *extra])


@pytest.mark.parametrize("extra, line", [
    (("--backend", "tensorflow", "--max_steps", "5", "--tokenizer_name", "t"),
     "--streaming is read by --backend keras only (a datasets IterableDataset, one slice per process); --backend "
     "tensorflow reads the whole data: pass --backend keras, or drop --streaming."),
    (("--backend", "keras", "--tokenizer_name", "t"),
     "--streaming needs --max_steps > 0: a streamed dataset has no length, so epochs cannot be counted (as in "
     "transformers' run_mlm)."),
    (("--backend", "keras", "--max_steps", "5"),
     "--streaming needs --tokenizer_name or --model_name_or_path: a new tokenizer is trained on the whole training "
     "split, which a stream never holds."),
    (("--backend", "keras", "--max_steps", "5", "--tokenizer_name", "t", "--max_train_samples", "10"),
     "--max_train_samples does not apply with --streaming: the run reads --max_steps x the global batch blocks "
     "from the stream; drop --max_train_samples."),
])
def test_streaming_without_what_it_needs_is_refused_in_one_line(extra, line):
    from hf_tpu_ext.errors import ArgumentError

    with pytest.raises(ArgumentError) as err:
        _parse(*extra)
    assert str(err.value) == line


def test_a_streamed_resume_reads_the_checkpoints_tokenizer():
    """A resume needs no --tokenizer_name: the tokenizer beside the checkpoint is read (the resume's own rules then
    compare --streaming with the checkpoint's)."""
    _, _, args = _parse("--backend", "keras", "--max_steps", "5", "--resume_from_checkpoint", "true")
    assert args.resume_from_checkpoint == "true"


def test_streaming_the_default_corpus_is_refused():
    from hf_tpu_ext.args import DataTrainingArguments
    from hf_tpu_ext.errors import ArgumentError

    with pytest.raises(ArgumentError) as err:
        DataTrainingArguments(streaming=True)
    assert str(err.value) == ("--streaming reads a --dataset_name or --train_file; the default corpus is held in "
                              "memory already: pass one of them, or drop --streaming.")


def test_a_dataset_without_a_train_split_is_refused_before_anything_is_written(corpus, tmp_path):
    root, _ = corpus
    folder = tmp_path / "only_validation"
    folder.mkdir()
    (folder / "validation.jsonl").write_text((root / "valid.jsonl").read_text())
    (folder / "test.jsonl").write_text((root / "valid.jsonl").read_text())
    out = tmp_path / "out"
    args = [a for a in _args(root, out) if a not in ("--train_file", str(root / "train.jsonl"))]
    proc = subprocess.run([sys.executable, "-m", "hf_tpu_ext", *args, "--dataset_name", str(folder)],
                          env=_env(JAX_NUM_CPU_DEVICES=1), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert proc.stderr.strip().splitlines()[-1] == (
        f"hf-tpu train: error: --streaming: the dataset {str(folder)!r} has no 'train' split (it has: test, "
        "validation); pass a --dataset_config_name or --train_file that has one.")
    from hf_tpu_ext.run_lock import LOCK_NAME

    assert sorted(p.name for p in out.iterdir() if p.name != LOCK_NAME) == [] if out.exists() else True


def test_the_position_restores_exactly_inside_long_documents_and_across_passes(corpus, tmp_path):
    """In-process: documents longer than a step (the ``skip`` path), an example boundary, and the stream's end
    (the next pass starts over): from the state after every step, a new reader continues with the same blocks."""
    from types import SimpleNamespace

    from transformers import AutoTokenizer

    from hf_tpu_ext.data.streaming import StreamedBlocks, StreamSource

    root, texts = corpus
    tok = AutoTokenizer.from_pretrained(str(root / "tok"))
    aligned = next(t for t in texts if t and len(tok(t)["input_ids"]) % L == 0)  # ends exactly on a block
    docs = [aligned, " ".join(texts[:8]), texts[41], " ".join(texts[50:55])]  # long ones span several blocks
    (tmp_path / "d.jsonl").write_text("".join(json.dumps({"body": t}) + "\n" for t in docs))
    args = SimpleNamespace(dataset_name=None, dataset_config_name=None, train_file=str(tmp_path / "d.jsonl"),
                           validation_file=None, text_column_name=None)
    stream = np.concatenate([np.asarray(tok(t)["input_ids"], np.int32) for t in docs])
    reader = StreamedBlocks(StreamSource(args), tok, L)
    steps = stream.size // L + 3  # into the second pass
    states, got = [], []
    for _ in range(steps):
        got.append(reader.next_blocks(1))
        states.append(json.loads(json.dumps(reader.state())))
    whole = np.concatenate([stream, stream])
    np.testing.assert_array_equal(np.concatenate([g.reshape(-1) for g in got]), whole[: steps * L])
    assert states[-1]["pass"] == 1 and {s["skip"] > 0 for s in states} == {True, False}
    for k in range(steps - 1):
        again = StreamedBlocks(StreamSource(args), tok, L)
        again.load_state(states[k])
        np.testing.assert_array_equal(again.next_blocks(1), got[k + 1], err_msg=f"after block {k + 1}")


def test_a_position_of_another_process_count_or_batch_is_refused_in_one_line(corpus, tmp_path):
    from types import SimpleNamespace

    from transformers import AutoTokenizer

    from hf_tpu_ext.data.numpy_batches import NumpyMasker
    from hf_tpu_ext.data.streaming import StreamedBlocks, StreamSource, StreamTrainBatches
    from hf_tpu_ext.errors import DataError

    root, _ = corpus
    args = SimpleNamespace(dataset_name=None, dataset_config_name=None, train_file=str(root / "train.jsonl"),
                           validation_file=None, text_column_name=None)
    tok = AutoTokenizer.from_pretrained(str(root / "tok"))
    masker = NumpyMasker.for_tokenizer(tok, 5)
    first = StreamTrainBatches(StreamedBlocks(StreamSource(args), tok, L), 7, masker, np.arange(2))
    fed = [first(step) for step in range(3)]
    saved = first.state_at(2)  # after steps 0 and 1 (the prefetcher has produced step 2 already)
    other = StreamTrainBatches(StreamedBlocks(StreamSource(args), tok, L), 7, masker, np.arange(4))
    with pytest.raises(DataError) as err:
        other.restore(saved, 2, "checkpoint-2/data_state-0.json")
    assert str(err.value) == ("checkpoint-2/data_state-0.json is the position of step 2 for 1 process(es) of 2 rows, "
                              "but this run resumes step 2 with 1 of 4: resume with the same process count and batch "
                              "size.")
    with pytest.raises(DataError) as err:
        first(5)
    assert str(err.value) == "--streaming reads its steps in order: step 5 asked, step 3 next."
    same = StreamTrainBatches(StreamedBlocks(StreamSource(args), tok, L), 7, masker, np.arange(2))
    same.restore(saved, 2, "checkpoint-2/data_state-0.json")
    for key, value in same(2).items():
        np.testing.assert_array_equal(value, fed[2][key], err_msg=key)
