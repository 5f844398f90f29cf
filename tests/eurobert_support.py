"""Tiny EuroBERT fixtures for the transformers 5 tests (tests/current): hidden 32, 3 layers, 4 query heads over 2
key/value heads (grouped-query attention), SwiGLU width 48, vocab 100, every weight redrawn at random (so a
transposed kernel, a swapped projection or a left-out bias changes the logits); the padded batch is ModernBERT's
(tests/modernbert_support.py)."""

VOCAB = 100
#: the other shape: one key/value head per query head, every bias on, the head tied to the embedding
TIED_WITH_BIASES = dict(num_key_value_heads=4, attention_bias=True, mlp_bias=True, tie_word_embeddings=True)


def tiny_config(**overrides):
    """A transformers 5 ``EuroBertConfig`` of the module doc's sizes, eager attention."""
    from transformers import EuroBertConfig

    kwargs = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=3, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=64, pad_token_id=0, bos_token_id=1, eos_token_id=2,
                  mask_token_id=3, rope_theta=500.0, attn_implementation="eager")
    kwargs.update(overrides)
    return EuroBertConfig(**kwargs)


def random_torch_model(config, seed: int = 0):
    """``EuroBertForMaskedLM(config)`` in eval mode, every parameter redrawn (RMSNorm weights around 1)."""
    import torch
    from transformers import EuroBertForMaskedLM

    torch.manual_seed(seed)
    model = EuroBertForMaskedLM(config).eval()
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "norm" in name:
                parameter.copy_(1.0 + 0.2 * torch.randn_like(parameter))
            else:
                parameter.copy_(0.2 * torch.randn_like(parameter))
    return model


def saved_state(model):
    """What ``save_pretrained`` writes: ``state_dict()`` as float32 numpy arrays, a tied ``lm_head.weight`` left
    out."""
    state = {name: tensor.detach().numpy().copy() for name, tensor in model.state_dict().items()}
    if model.config.tie_word_embeddings:
        state.pop("lm_head.weight")
    return state
