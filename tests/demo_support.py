"""Helpers shared by the demo tests: a tiny fill-mask model folder and an in-process app server.

The folder has the layout ``hf-tpu train`` writes (config.json, RoBERTa byte-level BPE tokenizer files,
PyTorch-format model.safetensors). It is built with tokenizers + torch, so it stands in for the
``trained_model_dir`` fixture until the lead's conftest provides it.
"""

from __future__ import annotations

import contextlib
import os
import socket

# Sentences the tiny model memorizes, so that its predictions are checkable.
CORPUS = [
    "the cat sat on the mat .",
    "the dog sat on the rug .",
    "paris is the capital of france .",
    "berlin is the capital of germany .",
    "i like to drink coffee in the morning .",
    "i like to drink tea in the evening .",
    "the sun is hot and the moon is cold .",
    "birds can fly and fish can swim .",
]
MAX_SEQ_LENGTH = 32


def build_tiny_fill_mask_model(out_dir: str, vocab_size: int = 400, train_steps: int = 60, seed: int = 0,
                               extra_sentences=()) -> str:
    """Write a tiny RoBERTa fill-mask model folder trained a few steps on :data:`CORPUS`.

    Args:
        out_dir: folder to write (created).
        vocab_size: byte-level BPE vocabulary size (>= 300).
        train_steps: AdamW steps of masked-LM training on the corpus (CPU, one thread, ~20 ms each).
        seed: torch seed.
        extra_sentences: trained on too, but not seen by the tokenizer's training, so their rare words stay
            several tokens (multi-token answers).

    Returns:
        ``out_dir``.
    """
    import torch
    from tokenizers import ByteLevelBPETokenizer
    from transformers import RobertaConfig, RobertaForMaskedLM, RobertaTokenizerFast

    os.makedirs(out_dir, exist_ok=True)
    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(CORPUS * 20, vocab_size=vocab_size, min_frequency=1,
                            special_tokens=["<s>", "<pad>", "</s>", "<unk>", "<mask>"])
    bpe.save_model(out_dir)
    tok = RobertaTokenizerFast(os.path.join(out_dir, "vocab.json"), os.path.join(out_dir, "merges.txt"),
                               model_max_length=MAX_SEQ_LENGTH)
    tok.save_pretrained(out_dir)

    torch.manual_seed(seed)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny matrices: threads only add overhead, and the test machine is shared
    config = RobertaConfig(vocab_size=len(tok), hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                           intermediate_size=128, max_position_embeddings=MAX_SEQ_LENGTH + 2, type_vocab_size=1,
                           pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id,
                           eos_token_id=tok.eos_token_id, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    model = RobertaForMaskedLM(config)
    batch = tok(CORPUS + list(extra_sentences), padding=True, return_tensors="pt")
    ids, attn = batch["input_ids"], batch["attention_mask"]
    maskable = attn.bool() & ~torch.isin(ids, torch.tensor(tok.all_special_ids))
    opt = torch.optim.AdamW(model.parameters(), lr=5e-3)
    gen = torch.Generator().manual_seed(seed)
    model.train()
    for _ in range(train_steps):
        chosen = (torch.rand(ids.shape, generator=gen) < 0.3) & maskable
        inputs = ids.masked_fill(chosen, tok.mask_token_id)
        labels = ids.masked_fill(~chosen, -100)
        loss = model(input_ids=inputs, attention_mask=attn, labels=labels).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()
    torch.set_num_threads(threads)
    model.save_pretrained(out_dir, safe_serialization=True)
    return out_dir


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def launched_demo(model_dir: str, **build_kwargs):
    """Launch the demo in this process on 127.0.0.1 and yield its URL; the server is closed on exit."""
    from spaces_demo.app import build_demo

    demo = build_demo(model_dir, **build_kwargs)
    try:
        demo.launch(server_name="127.0.0.1", server_port=free_port(), prevent_thread_lock=True, quiet=True)
        yield demo, demo.local_url
    finally:
        demo.close()


# gradio_client posts with httpx's 5 s default read timeout; in CI two test lanes share 2 cores and the app
# server's thread can wait longer than that for its first answer (stop 37: three ReadTimeouts, none locally).
CLIENT_TIMEOUT_S = 120


def gradio_client(url: str):
    """A ``gradio_client.Client`` on ``url`` with :data:`CLIENT_TIMEOUT_S` for every request."""
    from gradio_client import Client

    return Client(url, verbose=False, httpx_kwargs={"timeout": CLIENT_TIMEOUT_S})
