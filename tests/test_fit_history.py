"""FitHistory: the log history a drop-in push callback builds from a plain Keras fit (no framework needed)."""

from hf_tpu_ext.callbacks.fit_history import FitHistory


def test_entries_sample_losses_and_read_epoch_logs_late():
    history = FitHistory(points_per_epoch=2)
    epoch_logs = {"loss": 2.0}
    for step in range(1, 5):
        history.on_batch({"loss": 3.0 - step / 10}, step, steps_per_epoch=4)
    history.on_epoch(epoch_logs, 4, 1.0)
    epoch_logs["val_loss"] = 1.5  # a callback after the push callback evaluates: read when the entries are made
    assert history.entries() == [
        {"loss": 2.8, "epoch": 0.5, "step": 2}, {"loss": 2.6, "epoch": 1.0, "step": 4},
        {"eval_loss": 1.5, "perplexity": round(2.718281828459045 ** 1.5, 6), "epoch": 1.0, "step": 4}]


def test_samples_stay_bounded():
    history = FitHistory(points_per_epoch=1, max_points=4)
    for step in range(1, 101):
        history.on_batch({"loss": 1.0}, step, steps_per_epoch=None)
    steps = [e["step"] for e in history.entries()]
    assert len(steps) <= 5 and steps == sorted(steps) and steps[-1] >= 64


def test_trainer_state_holds_only_what_the_fit_knew(tmp_path):
    import json

    from hf_tpu_ext.callbacks.fit_history import session_trainer_state
    from hf_tpu_ext.callbacks.push_cadence import CallbackSession as PushSession, PushConfig

    session = PushSession(PushConfig(str(tmp_path), save_strategy="steps", save_steps=3), is_chief=False)
    history = FitHistory(points_per_epoch=2)
    for step in range(1, 5):
        history.on_batch({"loss": 3.0 - step / 10}, step, steps_per_epoch=4)
    history.on_epoch({"loss": 2.5}, 4, 1.0)
    # no throughput meter, no evaluation, the session never began (no wall time): those fields are left out
    state = session_trainer_state(history, session, {"epochs": 3, "steps": 4}, 0, {}, epoch_numbers=True)
    samples = [{"loss": 2.8, "epoch": 0.5, "step": 2}, {"loss": 2.6, "epoch": 1.0, "step": 4}]
    assert state == {"logging_steps": 2, "save_steps": 3, "num_train_epochs": 3,
                     "log_history": samples + [{"loss": 2.5, "epoch": 1.0, "step": 4}]}
    path = session.write_trainer_state(str(tmp_path), 4, epoch=1.0, max_steps=12, state=state, known_only=True)
    assert json.loads(open(path).read()) == dict(state, global_step=4, epoch=1.0, max_steps=12)
    # a meter's facts fill batch size, tokens and total FLOPs; an epoch save's interval is the epoch's steps
    facts = {"global_batch_size": 8, "tokens_seen": 4 * 8 * 16, "flops_per_token": 100.0}
    epoch_session = PushSession(PushConfig(str(tmp_path), save_strategy="epoch"), is_chief=False)
    full = session_trainer_state(history, epoch_session, {"epochs": 3, "steps": 4}, 0, facts)
    assert {k: v for k, v in full.items() if k != "log_history"} == {
        "logging_steps": 2, "save_steps": 4, "num_train_epochs": 3, "train_batch_size": 8,
        "num_input_tokens_seen": 512, "total_flos": 51200.0}
    assert full["log_history"] == samples  # without epoch_numbers: batch samples and evaluations only
    assert PushSession(PushConfig(str(tmp_path), save_strategy="no"), is_chief=False).save_interval(4) is None
    assert epoch_session.save_interval(None) is None
