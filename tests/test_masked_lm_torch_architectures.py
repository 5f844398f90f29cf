"""The torch backends' masked-position loss on each architecture (torch on the CPU): equal to the model's own loss."""

import pytest

CONFIGS = {
    "roberta": dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                    max_position_embeddings=40, pad_token_id=1),
    "bert": dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64),
    "distilbert": dict(dim=32, n_layers=2, n_heads=2, hidden_dim=64),
    # an odd layer count and a window shorter than the sequence: local and global layers both run
    "modernbert": dict(hidden_size=32, num_hidden_layers=3, num_attention_heads=2, intermediate_size=48,
                       local_attention=8, global_attn_every_n_layers=2, pad_token_id=0),
}


@pytest.mark.parametrize("model_type", sorted(CONFIGS))
def test_masked_positions_loss_equals_the_models_own(model_type):
    torch = pytest.importorskip("torch")
    from transformers import AutoConfig, AutoModelForMaskedLM

    from hf_tpu_ext.metrics.masked_lm_torch import _encoder_and_head, masked_lm_sums

    torch.manual_seed(0)
    config = AutoConfig.for_model(model_type, vocab_size=50, **CONFIGS[model_type])
    model = AutoModelForMaskedLM.from_config(config, attn_implementation="eager").eval()
    assert _encoder_and_head(model)[1] is not None  # the head runs at the masked positions only
    ids = torch.randint(5, 50, (2, 24))
    attention_mask = torch.ones_like(ids)
    attention_mask[1, 20:] = 0
    labels = torch.full_like(ids, -100)
    labels[0, [1, 5, 17]] = ids[0, [1, 5, 17]]
    labels[1, [2, 11]] = ids[1, [2, 11]]
    with torch.no_grad():
        loss_sum, correct, count = masked_lm_sums(model, ids, labels, 4, attention_mask=attention_mask)
        own = model(input_ids=ids, attention_mask=attention_mask, labels=labels)
    assert float(count) == 5.0
    assert float(loss_sum) / 5 == pytest.approx(float(own.loss), rel=1e-5)
    predicted = own.logits.argmax(-1)[labels != -100] == labels[labels != -100]
    assert float(correct) == float(predicted.sum())
