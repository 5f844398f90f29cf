"""Tokenizers for masked language modeling: train one that fits the architecture, or load an existing one.

Trained per ``--model_type`` by its record's tokenizer kind (:func:`train_tokenizer`, :data:`TRAINERS`):

- ``byte_level_bpe`` (``roberta``): a byte-level BPE with ``roberta-base``'s conventions: special tokens ``<s>``=0, ``<pad>``=1,
  ``</s>``=2, ``<unk>``=3, ``<mask>``=4, each text wrapped as ``<s> ... </s>``, and ``<mask>`` strips the space
  before it (``lstrip=True``), so ``"Hello <mask>!"`` works in the fill-mask widget.
- ``wordpiece`` (``bert``, ``distilbert``): a WordPiece (``##`` continuations) with BERT's ``[PAD]``=0, ``[UNK]``=1, ``[CLS]``=2,
  ``[SEP]``=3, ``[MASK]``=4, BERT's normalizer (lower-cased and accents stripped per ``--do_lower_case``, as
  ``bert-base-uncased``), ``[CLS] ... [SEP]``; a ``BertTokenizerFast`` (``vocab.txt`` + ``tokenizer.json``).
- ``bracket_bpe`` (``modernbert``): what ``answerdotai/ModernBERT-base`` ships: a ``PreTrainedTokenizerFast`` over a byte-level BPE
  (OLMo's kind), cased, with ``[UNK] [CLS] [SEP] [PAD] [MASK]`` (here ids 0..4), ``[CLS] ... [SEP]``, and
  ``[MASK]`` stripping the space before it.
- ``llama_bpe`` (``eurobert``): EuroBERT's kind, Llama 3's: its pre-tokenization split, a cased byte-level BPE,
  ``<|begin_of_text|>``=0, ``<|end_of_text|>``=1, ``<|mask|>``=2 (stripping the space before it), ``<|pad|>``=3,
  ``<|begin_of_text|> ... <|end_of_text|>``.
"""

from __future__ import annotations

import logging
import os
import tempfile
from typing import Iterable, Optional

from hf_tpu_ext.errors import TokenizerError
from hf_tpu_ext.fileio import remote_files
from hf_tpu_ext.model_types import record_for

logger = logging.getLogger("hf_tpu_ext")

SPECIAL_TOKENS = ("<s>", "<pad>", "</s>", "<unk>", "<mask>")  # ids 0..4, as in RoBERTa
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "vocab.json",
    "merges.txt",
    "added_tokens.json",
)


def train_bpe_tokenizer(texts: Iterable[str], vocab_size: int, model_max_length: int):
    """Train a RoBERTa byte-level BPE tokenizer on ``texts``.

    Args:
        texts: the training texts (any iterable of str; a ``datasets`` column works).
        vocab_size: the wanted vocabulary size including the 5 special tokens and the 256 byte symbols
            (>= 300); a small corpus may give fewer tokens (a log line names both sizes).
        model_max_length: tokens a model input may hold (the ``max_seq_length`` of the run).

    Returns:
        transformers.RobertaTokenizerFast: special ids ``<s>``=0, ``<pad>``=1, ``</s>``=2, ``<unk>``=3,
        ``<mask>``=4; saved with ``save_pretrained`` it loads back with ``AutoTokenizer.from_pretrained``.

    Raises:
        TokenizerError: ``vocab_size`` is too small for the byte alphabet and special tokens.
    """
    from tokenizers import ByteLevelBPETokenizer, processors

    if vocab_size < 256 + len(SPECIAL_TOKENS):
        raise TokenizerError(f"vocab_size {vocab_size} cannot hold the 256 byte symbols and 5 special tokens; use >= 300.")
    bpe = ByteLevelBPETokenizer(add_prefix_space=False, trim_offsets=True)
    bpe.train_from_iterator(
        (t for t in texts if t),
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=list(SPECIAL_TOKENS),
        show_progress=False,
    )
    trained = bpe.get_vocab_size()
    if trained < vocab_size:  # BPE merges only pairs seen twice: a small corpus runs out of them
        logger.info("vocab_size %d asks for more tokens than the training text gives: the tokenizer (and the model "
                    "built on it) has %d; more text or a smaller --vocab_size makes them equal.", vocab_size, trained)
    backend = bpe._tokenizer  # the underlying tokenizers.Tokenizer
    backend.post_processor = processors.RobertaProcessing(  # sep, cls by position: tokenizers 0.23 renamed cls
        ("</s>", backend.token_to_id("</s>")),
        ("<s>", backend.token_to_id("<s>")),
        trim_offsets=True,
        add_prefix_space=False,
    )
    return _roberta_fast(backend, model_max_length)


def tokenizer_to_text(tokenizer) -> str:
    """A trained tokenizer's ``save_pretrained`` files as one JSON text (``{file name: content}``): what process 0
    of a multi-process run hands the others (one tokenizer, trained once). Read back by :func:`tokenizer_from_text`."""
    import json

    with tempfile.TemporaryDirectory() as folder:
        names = save_tokenizer_files(tokenizer, folder)
        return json.dumps({n: open(os.path.join(folder, n), encoding="utf-8").read() for n in names})


def tokenizer_from_text(text: str):
    """The tokenizer :func:`tokenizer_to_text` wrote (``AutoTokenizer.from_pretrained`` of its files)."""
    import json

    with tempfile.TemporaryDirectory() as folder:
        for name, content in json.loads(text).items():
            os.makedirs(os.path.dirname(os.path.join(folder, name)), exist_ok=True)
            with open(os.path.join(folder, name), "w", encoding="utf-8") as f:
                f.write(content)
        return load_tokenizer(folder)


def _roberta_fast(backend, model_max_length: int):
    """``RobertaTokenizerFast`` around a trained byte-level BPE ``tokenizers.Tokenizer`` (RoBERTa's special tokens)."""
    from tokenizers import AddedToken
    from transformers import RobertaTokenizerFast

    return RobertaTokenizerFast(
        tokenizer_object=backend,
        model_max_length=int(model_max_length),
        bos_token="<s>",
        eos_token="</s>",
        sep_token="</s>",
        cls_token="<s>",
        unk_token="<unk>",
        pad_token="<pad>",
        mask_token=AddedToken("<mask>", lstrip=True, rstrip=False, special=True, normalized=False),
        add_prefix_space=False,
        trim_offsets=True,
    )


BERT_SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")  # ids 0..4
MODERNBERT_SPECIAL_TOKENS = ("[UNK]", "[CLS]", "[SEP]", "[PAD]", "[MASK]")  # ModernBERT-base's order (its 50280..4)


def train_wordpiece_tokenizer(texts: Iterable[str], vocab_size: int, model_max_length: int, do_lower_case=True):
    """Train a BERT WordPiece tokenizer on ``texts`` (``tokenizers.BertWordPieceTokenizer``: BERT's normalizer and
    pre-tokenizer, ``##`` continuations, ``[CLS] $A [SEP]`` / ``[CLS] $A [SEP] $B [SEP]``).

    Args:
        texts: the training texts (any iterable of str).
        vocab_size: wanted vocabulary size including the 5 special tokens and the alphabet; a small corpus may give
            fewer (a log line names both).
        model_max_length: tokens a model input may hold.
        do_lower_case: lower-case and strip accents (``bert-base-uncased``); False keeps the case (``-cased``).

    Returns:
        transformers.BertTokenizerFast: ``[PAD]``=0, ``[UNK]``=1, ``[CLS]``=2, ``[SEP]``=3, ``[MASK]``=4; saved with
        ``save_pretrained`` (``vocab.txt``, ``tokenizer.json``) it loads back with ``AutoTokenizer`` and
        ``BertTokenizerFast.from_pretrained``.
    """
    from tokenizers import BertWordPieceTokenizer
    from transformers import BertTokenizerFast

    texts = [t for t in texts if t]  # read twice
    options = {"lowercase": bool(do_lower_case), "strip_accents": None if do_lower_case else False}
    # The trainer numbers each continuation symbol ("##e") in hash-map order when it first meets it, and ranks merges
    # of equal count by those numbers: the last merges (~7 of 2,000 tokens) differed between two runs. A first pass
    # (no merges) finds the symbols; the second numbers them first, as special tokens, in sorted order.
    first = _train_wordpiece(texts, 1, options, limit_alphabet=10 ** 9)  # every character: the cut is made below
    alphabet = _kept_alphabet(first, texts)
    continuations = sorted(t for t in first.get_vocab() if t.startswith("##") and t[2:] in alphabet)
    trained = _train_wordpiece(texts, vocab_size, options, continuations, limit_alphabet=len(alphabet),
                               initial_alphabet=sorted(alphabet))
    _log_trained_size(vocab_size, trained.get_vocab_size())
    vocab = trained.get_vocab()
    ordered = list(BERT_SPECIAL_TOKENS) + sorted(t for t in vocab if t not in BERT_SPECIAL_TOKENS)
    # rebuilt from the vocabulary: the continuation symbols are ordinary tokens again (not added ones), ids renumbered
    backend = BertWordPieceTokenizer({t: i for i, t in enumerate(ordered)}, **options)._tokenizer
    return BertTokenizerFast(tokenizer_object=backend, model_max_length=int(model_max_length),
                             do_lower_case=bool(do_lower_case), unk_token="[UNK]", sep_token="[SEP]",
                             pad_token="[PAD]", cls_token="[CLS]", mask_token="[MASK]")


def _train_wordpiece(texts, vocab_size: int, options: dict, first=(), **alphabet):
    """A ``BertWordPieceTokenizer`` trained on ``texts``; ``first``: tokens numbered right after the specials;
    ``alphabet``: ``limit_alphabet`` / ``initial_alphabet`` of the trainer.

    The ids are renumbered by the caller: the special tokens keep 0..4, the other tokens follow in sorted order
    (WordPiece encodes by longest match over the token set, so the numbering changes no tokenization)."""
    from tokenizers import BertWordPieceTokenizer

    wordpiece = BertWordPieceTokenizer(**options)
    wordpiece.train_from_iterator(texts, vocab_size=vocab_size, min_frequency=2, show_progress=False,
                                  special_tokens=[*BERT_SPECIAL_TOKENS, *first], **alphabet)
    return wordpiece


#: characters a trained WordPiece keeps (the trainer's default ``limit_alphabet``); the rarer ones become [UNK]
ALPHABET_LIMIT = 1000


def _kept_alphabet(first, texts) -> set:
    """The characters of the WordPiece alphabet: all that ``first`` (trained without a limit) found, or, past
    :data:`ALPHABET_LIMIT`, the most frequent ones, ties by code point (the trainer cuts ties in hash-map order:
    5 trainings on a text of 1,236 equally frequent characters kept 5 different alphabets)."""
    found = {t for t in first.get_vocab() if len(t) == 1}
    if len(found) <= ALPHABET_LIMIT:
        return found
    from collections import Counter

    counts: Counter = Counter()
    normalize = first._tokenizer.normalizer.normalize_str  # the text as the trainer counts it (case, accents)
    for text in texts:
        counts.update(normalize(text))
    return set(sorted(found, key=lambda c: (-counts[c], c))[:ALPHABET_LIMIT])


#: Llama 3's special tokens as EuroBERT's tokenizer names them, and a padding token of its own (EuroBERT pads with
#: ``<|end_of_text|>``; a separate one keeps every real ``<|end_of_text|>`` inside the attention mask): ids 0..3
LLAMA_SPECIAL_TOKENS = ("<|begin_of_text|>", "<|end_of_text|>", "<|mask|>", "<|pad|>")
#: Llama 3's pre-tokenization split (contractions, letters, 1-3 digits, punctuation, newlines, spaces), before bytes
LLAMA_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
               r"|\s*[\r\n]+|\s+(?!\S)|\s+")


def train_llama_bpe_tokenizer(texts: Iterable[str], vocab_size: int, model_max_length: int):
    """Train a Llama-3-style tokenizer on ``texts`` (EuroBERT's kind): a cased byte-level BPE after Llama 3's
    split, each text wrapped as ``<|begin_of_text|> ... <|end_of_text|>``, in a ``PreTrainedTokenizerFast``.

    Returns:
        transformers.PreTrainedTokenizerFast: ``<|begin_of_text|>``=0 (bos), ``<|end_of_text|>``=1 (eos),
        ``<|mask|>``=2 (strips the space before it), ``<|pad|>``=3; ``model_input_names`` ``input_ids`` /
        ``attention_mask`` (EuroBERT takes no token types).

    Raises:
        TokenizerError: ``vocab_size`` is too small for the byte alphabet and special tokens.
    """
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    if vocab_size < 256 + len(LLAMA_SPECIAL_TOKENS):
        raise TokenizerError(f"vocab_size {vocab_size} cannot hold the 256 byte symbols and 4 special tokens; use >= 300.")
    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA_SPLIT), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2, show_progress=False,
                                  special_tokens=list(LLAMA_SPECIAL_TOKENS),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    backend.train_from_iterator((t for t in texts if t), trainer)
    _log_trained_size(vocab_size, backend.get_vocab_size())
    mask = AddedToken("<|mask|>", lstrip=True, rstrip=False, special=True, normalized=False)
    backend.add_special_tokens([mask])  # the trainer added it without lstrip: "is <|mask|>." keeps no lone space
    bos, eos = LLAMA_SPECIAL_TOKENS[:2]
    backend.post_processor = processors.TemplateProcessing(
        single=f"{bos}:0 $A:0 {eos}:0", pair=f"{bos}:0 $A:0 {eos}:0 $B:0 {eos}:0",
        special_tokens=[(bos, backend.token_to_id(bos)), (eos, backend.token_to_id(eos))])
    return PreTrainedTokenizerFast(
        tokenizer_object=backend, model_max_length=int(model_max_length), clean_up_tokenization_spaces=False,
        model_input_names=["input_ids", "attention_mask"], bos_token=bos, eos_token=eos, pad_token="<|pad|>",
        mask_token=mask)


def train_modernbert_tokenizer(texts: Iterable[str], vocab_size: int, model_max_length: int):
    """Train a ModernBERT tokenizer on ``texts``: a cased byte-level BPE wrapped as ``[CLS] ... [SEP]``, in a
    ``PreTrainedTokenizerFast`` (the class ``answerdotai/ModernBERT-base``'s ``tokenizer_config.json`` names).

    Returns:
        transformers.PreTrainedTokenizerFast: ``[UNK]``=0, ``[CLS]``=1, ``[SEP]``=2, ``[PAD]``=3, ``[MASK]``=4
        (``lstrip``), ``model_input_names`` ``input_ids``/``attention_mask`` (ModernBERT takes no token types).

    Raises:
        TokenizerError: ``vocab_size`` is too small for the byte alphabet and special tokens.
    """
    from tokenizers import AddedToken, ByteLevelBPETokenizer, processors
    from transformers import PreTrainedTokenizerFast

    if vocab_size < 256 + len(MODERNBERT_SPECIAL_TOKENS):
        raise TokenizerError(f"vocab_size {vocab_size} cannot hold the 256 byte symbols and 5 special tokens; use >= 300.")
    bpe = ByteLevelBPETokenizer(add_prefix_space=False, trim_offsets=True)
    bpe.train_from_iterator((t for t in texts if t), vocab_size=vocab_size, min_frequency=2,
                            special_tokens=list(MODERNBERT_SPECIAL_TOKENS), show_progress=False)
    _log_trained_size(vocab_size, bpe.get_vocab_size())
    backend = bpe._tokenizer
    cls_id, sep_id = backend.token_to_id("[CLS]"), backend.token_to_id("[SEP]")
    backend.post_processor = processors.TemplateProcessing(
        single="[CLS]:0 $A:0 [SEP]:0", pair="[CLS]:0 $A:0 [SEP]:0 $B:0 [SEP]:0",
        special_tokens=[("[CLS]", cls_id), ("[SEP]", sep_id)])
    return PreTrainedTokenizerFast(
        tokenizer_object=backend, model_max_length=int(model_max_length), clean_up_tokenization_spaces=True,
        model_input_names=["input_ids", "attention_mask"], unk_token="[UNK]", cls_token="[CLS]", sep_token="[SEP]",
        pad_token="[PAD]", mask_token=AddedToken("[MASK]", lstrip=True, rstrip=False, special=True, normalized=False))


#: tokenizer kind (:data:`hf_tpu_ext.model_types.TOKENIZER_KINDS`, a record's ``tokenizer_kind``) -> its trainer,
#: ``(texts, vocab_size, model_max_length, do_lower_case) -> tokenizer`` (the module doc describes each)
TRAINERS = {
    "byte_level_bpe": lambda texts, vocab_size, length, lower: train_bpe_tokenizer(texts, vocab_size, length),
    "wordpiece": train_wordpiece_tokenizer,
    "bracket_bpe": lambda texts, vocab_size, length, lower: train_modernbert_tokenizer(texts, vocab_size, length),
    "llama_bpe": lambda texts, vocab_size, length, lower: train_llama_bpe_tokenizer(texts, vocab_size, length),
}


def train_tokenizer(model_type: str, texts: Iterable[str], vocab_size: int, model_max_length: int,
                    do_lower_case: bool = True):
    """The tokenizer trained for ``--model_type``: the trainer of its record's ``tokenizer_kind`` (:data:`TRAINERS`;
    the module doc describes each kind).

    Raises:
        ArgumentError: no record holds ``model_type`` (:func:`hf_tpu_ext.model_types.record_for`).
        TokenizerError: ``vocab_size`` too small for the kind.
    """
    return TRAINERS[record_for(model_type).tokenizer_kind](texts, vocab_size, model_max_length, do_lower_case)


def _log_trained_size(wanted: int, trained: int) -> None:
    if trained < wanted:  # merges need pairs seen twice: a small corpus runs out of them
        logger.info("vocab_size %d asks for more tokens than the training text gives: the tokenizer (and the model "
                    "built on it) has %d; more text or a smaller --vocab_size makes them equal.", wanted, trained)


def _copy_remote_folder(url: str) -> str:
    """Copy the tokenizer files of a remote folder into a fresh local temp folder and return it.

    Read through :func:`hf_tpu_ext.fileio.remote_files` (``gs://`` with ``tf.io.gfile`` where TensorFlow is
    installed, else fsspec).
    """
    files = remote_files(url)
    exists, copy = files.exists, files.get
    local = tempfile.mkdtemp(prefix="hf-tpu-tokenizer-")
    found = False
    for name in TOKENIZER_FILES:
        src = url.rstrip("/") + "/" + name
        if exists(src):
            copy(src, os.path.join(local, name))
            found = True
    if not found:
        raise TokenizerError(f"{url} holds no tokenizer files ({', '.join(TOKENIZER_FILES[:3])}, ...).")
    return local


def load_tokenizer(name_or_path: str, revision: Optional[str] = None, cache_dir: Optional[str] = None):
    """Load a (fast) tokenizer with ``AutoTokenizer.from_pretrained``.

    Args:
        name_or_path: a local folder, a ``gs://`` or other fsspec URL (copied to a temp folder first) or a Hub
            repo id.
        revision: branch, tag or commit of a Hub repo.
        cache_dir: where Hub downloads are cached.

    Returns:
        transformers.PreTrainedTokenizerBase: the tokenizer (not yet checked for MLM; see
        :func:`check_mlm_tokenizer`).

    Raises:
        TokenizerError: it cannot be loaded (not found, no tokenizer files, Hub unreachable); the message
            says what to check.
    """
    from transformers import AutoTokenizer

    path = str(name_or_path)
    if path.startswith("file://"):
        path = path[len("file://"):]
    elif "://" in path:
        path = _copy_remote_folder(path)
    try:
        return AutoTokenizer.from_pretrained(path, revision=revision, cache_dir=cache_dir, use_fast=True)
    except Exception as e:  # OSError, ValueError, HTTP errors, ... from transformers/huggingface_hub
        raise TokenizerError(
            f"Could not load a tokenizer from {name_or_path!r} ({type(e).__name__}: {e}). Give a folder holding "
            "tokenizer files or a Hub repo id (reachable, or already in the cache), or omit --tokenizer_name to "
            "train a byte-level BPE tokenizer on the training text."
        ) from e


def check_mlm_tokenizer(tokenizer) -> None:
    """Check that ``tokenizer`` can be used for masked language modeling.

    Args:
        tokenizer: a transformers tokenizer.

    Raises:
        TokenizerError: it has no mask token; or it holds special tokens only (every word would be the unknown
            token): the folder is named with the likely cause.
    """
    vocab = tokenizer.get_vocab() if hasattr(tokenizer, "get_vocab") else None
    if vocab and not set(vocab) - set(getattr(tokenizer, "all_special_tokens", ())):
        name = getattr(tokenizer, "name_or_path", "") or type(tokenizer).__name__
        # transformers 5 builds BertTokenizerFast(vocab_file=...) from the special tokens alone: its save has 5
        raise TokenizerError(
            f"The tokenizer in {name} loads with {len(vocab)} tokens, all special: every word would be "
            f"{tokenizer.unk_token or 'unknown'}. Its vocabulary was likely never read (transformers 5 ignores "
            "vocab_file= in BertTokenizerFast(...)): make it with BertTokenizerFast.from_pretrained(<the folder of "
            "vocab.txt>) and save_pretrained it again.")
    if getattr(tokenizer, "mask_token", None) is None or getattr(tokenizer, "mask_token_id", None) is None:
        name = getattr(tokenizer, "name_or_path", "") or type(tokenizer).__name__
        raise TokenizerError(
            f"The tokenizer {name!r} has no mask token, so it cannot be used for masked language modeling. "
            "Pick a tokenizer with one (e.g. a RoBERTa or BERT tokenizer) or omit --tokenizer_name to train a "
            "byte-level BPE tokenizer with <mask> on the training text."
        )


def prepare_tokenizer(model_args, train_texts: Iterable[str], max_seq_length: int):
    """The tokenizer of a run: ``--tokenizer_name``, else the model's, else one trained on ``train_texts``.

    Args:
        model_args: :class:`hf_tpu_ext.args.ModelArguments` (``tokenizer_name``, ``model_name_or_path``,
            ``model_revision``, ``cache_dir``, ``vocab_size``).
        train_texts: texts to train a new tokenizer on (only read when one is trained).
        max_seq_length: ``model_max_length`` of a trained tokenizer.

    Returns:
        transformers.PreTrainedTokenizerBase: a tokenizer with a mask token.

    Raises:
        TokenizerError: loading fails or the tokenizer has no mask token.
    """
    name = model_args.tokenizer_name or model_args.model_name_or_path
    if name:
        revision = model_args.model_revision if name == model_args.model_name_or_path else None
        tokenizer = load_tokenizer(name, revision=revision, cache_dir=model_args.cache_dir)
    else:
        tokenizer = train_tokenizer(getattr(model_args, "model_type", None), train_texts, model_args.vocab_size,
                                    max_seq_length, getattr(model_args, "do_lower_case", True))
    check_mlm_tokenizer(tokenizer)
    return tokenizer


def save_tokenizer_files(tokenizer, output_dir: str, exclude=()) -> list:
    """``tokenizer.save_pretrained(output_dir)`` and the names of the files it wrote (relative, minus ``exclude``)."""
    names = []
    for path in tokenizer.save_pretrained(output_dir):
        name = os.path.relpath(str(path), output_dir)
        if name not in exclude and name not in names and os.path.isfile(os.path.join(output_dir, name)):
            names.append(name)
    return names
