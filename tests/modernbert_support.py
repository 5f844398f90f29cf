"""Tiny ModernBERT fixtures shared by the transformers 5 tests (tests/current) and the 4.57 test (tests/): a config
of hidden 32, 3 layers (odd: layer 2's type shows whether the global/local rule is read right), 2 heads, vocab 100,
``local_attention`` 4 on 12-token sequences (so the +-2 window cuts most keys), every weight redrawn at random (so a
swapped gamma/beta, a transposed kernel or a bias left out changes the logits), and a right-padded batch."""

import numpy as np

SEQ, VOCAB, WINDOW = 12, 100, 4
#: every bias flag on, the tanh GELU in the head, another layer pattern (G L G) and a local theta of its own
ALL_BIASES = dict(norm_bias=True, attention_bias=True, mlp_bias=True, classifier_bias=True, decoder_bias=True,
                  classifier_activation="gelu_pytorch_tanh", global_attn_every_n_layers=2, local_rope_theta=500.0)


def tiny_config(**overrides):
    """A transformers ``ModernBertConfig`` (the installed version's) of the module doc's sizes, eager attention."""
    from transformers import ModernBertConfig

    kwargs = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=3, num_attention_heads=2,
                  local_attention=WINDOW, max_position_embeddings=64, pad_token_id=0, bos_token_id=1,
                  eos_token_id=2, cls_token_id=1, sep_token_id=2, global_rope_theta=160000.0,
                  local_rope_theta=10000.0, attn_implementation="eager")
    kwargs.update(overrides)
    return ModernBertConfig(**kwargs)


def random_torch_model(config, seed: int = 0):
    """``ModernBertForMaskedLM(config)`` in eval mode, every parameter redrawn (norm gammas around 1)."""
    import torch
    from transformers import ModernBertForMaskedLM

    torch.manual_seed(seed)
    model = ModernBertForMaskedLM(config).eval()
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "norm" in name and name.endswith("weight"):
                parameter.copy_(1.0 + 0.2 * torch.randn_like(parameter))
            else:
                parameter.copy_(0.2 * torch.randn_like(parameter))
    return model


def torch_state(model):
    """``state_dict()`` as float32 numpy arrays."""
    return {name: tensor.detach().numpy().copy() for name, tensor in model.state_dict().items()}


def padded_batch(seed: int = 1):
    """``(input_ids int [3, SEQ], attention_mask int [3, SEQ], mask_positions int [3, 4])``: row 0 full, rows 1-2
    right-padded to 7 and 3 real tokens; the positions are real tokens, both ends and the middle included."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(3, VOCAB, size=(3, SEQ))
    mask = np.ones((3, SEQ), dtype=np.int64)
    for row, real in ((1, 7), (2, 3)):
        ids[row, real:], mask[row, real:] = 0, 0
    positions = np.array([[0, 5, 6, 11], [0, 2, 3, 6], [0, 1, 2, 2]])
    return ids, mask, positions


def torch_logits(model, batch):
    """transformers' logits at ``mask_positions``: ``[3, 4, VOCAB]`` float32."""
    import torch

    ids, mask, positions = batch
    with torch.no_grad():
        logits = model(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask)).logits.numpy()
    return np.take_along_axis(logits, positions[..., None], axis=1)


def keras_logits(model, batch):
    """The Keras masked LM's logits at ``mask_positions`` (float32 numpy)."""
    ids, mask, positions = batch
    inputs = {"token_ids": ids.astype("int32"), "padding_mask": mask.astype("int32"),
              "mask_positions": positions.astype("int32")}
    return np.asarray(model(inputs, training=False), dtype=np.float32)
