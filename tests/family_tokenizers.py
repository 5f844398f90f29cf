"""Tokenizers of the shapes Ettin and mmBERT ship, built offline with ``tokenizers`` on the embedded corpus (no
network): the published vocabulary sizes and special tokens at their published ids, the pieces between them learned
from the corpus and the rest of the rows filled with tokens no text produces (as the published vocabularies' unused
rows).

- :func:`ettin_tokenizer`: ModernBERT's (Ettin uses it): a cased byte-level BPE, 50,368 rows, ``[UNK]`` 50280,
  ``[CLS]`` 50281, ``[SEP]`` 50282, ``[PAD]`` 50283, ``[MASK]`` 50284 (lstrip), ``[CLS] ... [SEP]``.
- :func:`mmbert_tokenizer`: Gemma's (mmBERT uses it): a SentencePiece-style BPE with byte fallback (spaces as
  ``▁``, no prefix space), 256,000 rows, ``<pad>`` 0, ``<eos>`` 1, ``<bos>`` 2, ``<unk>`` 3, ``<mask>`` 4, byte
  pieces ``<0x00>``..``<0xFF>``, ``<bos> ... <eos>``.
"""

ETTIN_VOCAB, MMBERT_VOCAB = 50368, 256000
ETTIN_SPECIALS = {"[UNK]": 50280, "[CLS]": 50281, "[SEP]": 50282, "[PAD]": 50283, "[MASK]": 50284}
MMBERT_SPECIALS = {"<pad>": 0, "<eos>": 1, "<bos>": 2, "<unk>": 3, "<mask>": 4}


def _texts():
    from hf_tpu_ext.data.corpus import default_corpus_texts

    return [t for t in default_corpus_texts() if t]


def _filled(learned, specials, rows: int):
    """``{token: id}``: ``learned`` tokens in order, ``specials`` at their ids, ``<unused_N>`` rows elsewhere."""
    vocab, learned = dict(specials), [t for t in learned if t not in specials]
    free = (i for i in range(rows) if i not in set(specials.values()))
    for token, index in zip(learned, free):
        vocab[token] = index
    taken = set(vocab.values())
    vocab.update({f"<unused_{i}>": i for i in range(rows) if i not in taken})
    return vocab


def ettin_tokenizer(model_max_length: int = 64):
    """A ``PreTrainedTokenizerFast`` of ModernBERT's (Ettin's) shape (module doc)."""
    from tokenizers import AddedToken, ByteLevelBPETokenizer, Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    trained = ByteLevelBPETokenizer(add_prefix_space=False)
    trained.train_from_iterator(_texts(), vocab_size=600, min_frequency=2, show_progress=False)
    learned = sorted(trained.get_vocab(), key=trained.get_vocab().get)
    merges = _merges(trained)
    backend = Tokenizer(models.BPE(_filled(learned, ETTIN_SPECIALS, ETTIN_VOCAB), merges))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens([AddedToken(t, special=True, normalized=False, lstrip=t == "[MASK]")
                                for t in ETTIN_SPECIALS])
    backend.post_processor = processors.TemplateProcessing(
        single="[CLS]:0 $A:0 [SEP]:0", pair="[CLS]:0 $A:0 [SEP]:0 $B:0 [SEP]:0",
        special_tokens=[("[CLS]", ETTIN_SPECIALS["[CLS]"]), ("[SEP]", ETTIN_SPECIALS["[SEP]"])])
    return PreTrainedTokenizerFast(
        tokenizer_object=backend, model_max_length=model_max_length, model_input_names=["input_ids", "attention_mask"],
        unk_token="[UNK]", cls_token="[CLS]", sep_token="[SEP]", pad_token="[PAD]",
        mask_token=AddedToken("[MASK]", lstrip=True, rstrip=False, special=True, normalized=False))


def mmbert_tokenizer(model_max_length: int = 64):
    """A ``GemmaTokenizer`` of Gemma's (mmBERT's) shape (module doc), ``<bos> ... <eos>`` around each text."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers
    from transformers import GemmaTokenizer

    piece = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True))
    piece.normalizer = normalizers.Replace(" ", "▁")
    piece.pre_tokenizer = pre_tokenizers.Split(" ", behavior="merged_with_previous")
    bytes_ = [f"<0x{b:02X}>" for b in range(256)]
    piece.train_from_iterator(_texts(), trainers.BpeTrainer(vocab_size=800, min_frequency=2, show_progress=False,
                                                            special_tokens=list(MMBERT_SPECIALS) + bytes_))
    learned = sorted(piece.get_vocab(), key=piece.get_vocab().get)
    vocab = _filled(learned, MMBERT_SPECIALS, MMBERT_VOCAB)
    return GemmaTokenizer(vocab=vocab, merges=_merges(piece),
                          model_max_length=model_max_length, add_bos_token=True, add_eos_token=True)


def _merges(trained):
    """The trained BPE's merges as ``(left, right)`` pairs (tokenizers writes them as pairs or as "a b")."""
    import json

    merges = json.loads(trained.to_str())["model"]["merges"]
    return [tuple(m) if isinstance(m, list) else tuple(m.split(" ")) for m in merges]
