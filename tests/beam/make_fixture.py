"""Write the fixture the Beam test compares against: ``python tests/beam/make_fixture.py`` (main environment).

``data/train.txt`` (300 texts of the embedded corpus, some ``\\r\\n`` line ends and blank lines), its BPE tokenizer
(``data/tokenizer``, 500 tokens) and what the local ``hf-tpu prepare-data`` writes for it (``data/expected``:
manifest and shards). ``tests/test_prepare_data.py`` checks the local command still writes exactly these bytes;
``tests/beam/test_beam_prepare.py`` checks the Beam pipeline does.
"""

import shutil
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
DATA = HERE / "data"
#: the prepare-data flags of the fixture (the Beam test passes the same)
FLAGS = ["--max_seq_length", "32", "--num_shards", "3", "--seed", "7", "--validation_split_percentage", "10"]


def write_text(path: Path) -> None:
    from hf_tpu_ext.data.corpus import default_corpus_texts

    lines = []
    for i, text in enumerate(default_corpus_texts()[:300]):
        lines.append(text + ("\r\n" if i % 7 == 3 else "\n"))
        if i % 11 == 5:
            lines.append("   \n")  # whitespace-only: dropped by both writers
    path.write_bytes("".join(lines).encode("utf-8"))


def local_prepare(train_file: Path, out: Path, tokenizer: Path = None) -> None:
    from hf_tpu_ext.commands.prepare_data import main

    argv = ["--train_file", str(train_file), "--output_path", str(out), *FLAGS]
    argv += ["--tokenizer_name", str(tokenizer)] if tokenizer else ["--vocab_size", "500"]
    with tempfile.TemporaryDirectory() as cache:
        assert main(argv + ["--cache_dir", cache]) == 0


def main() -> int:
    shutil.rmtree(DATA, ignore_errors=True)
    DATA.mkdir(parents=True)
    write_text(DATA / "train.txt")
    with tempfile.TemporaryDirectory() as tmp:
        local_prepare(DATA / "train.txt", Path(tmp) / "first")
        shutil.copytree(Path(tmp) / "first" / "tokenizer", DATA / "tokenizer")
    local_prepare(DATA / "train.txt", DATA / "expected", DATA / "tokenizer")
    shutil.rmtree(DATA / "expected" / "tokenizer")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(HERE.parents[1]))
    sys.exit(main())
