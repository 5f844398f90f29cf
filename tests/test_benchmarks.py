"""Fast checks of the benchmark's bookkeeping (no training): ``pytest benchmarks/test_train_throughput.py``."""

import json

import pytest

from benchmarks import train_throughput as tt


def _part(ms, compilations=1, ppl=None, latency=20.0):
    return {"steps_measured": 10, "ms_per_step": ms, "ms_per_step_mean": ms * 1.1, "first_step_seconds": 5.0,
            "compile_seconds": 5.0 - ms / 1e3, "train_step_compilations": compilations, "final_loss": 7.0,
            "peak_rss_mb": 1500.0, "perplexity": ppl, "first_step_latency_seconds": latency}


@pytest.fixture(scope="module")
def result():
    parts = {"prepare_data": {"tokens_per_second": 3e5, "vocab_size": 8000},
             "probe": {"peak_flops": 2e11, "device_kind": "CPU"}, "pipeline": {"tokens_per_second": 4.096e6},
             "hf_tpu": tt.median_run([_part(500.0, ppl=1000.0), _part(520.0, ppl=1000.0), _part(490.0, ppl=1000.0)]),
             "plain": _part(1000.0, 2, latency=25.0), "plain_xla": {"error": "XLA failed"},
             "hf_tpu_no_xla": _part(600.0), "hf_tpu_bf16": _part(480.0, ppl=1010.0),
             "hf_tpu_bf16_no_xla": _part(400.0, ppl=1015.0), "hf_tpu_bf16_fused": _part(320.0, ppl=1012.0),
             "prepare_data_np1": {"tokens_per_second": 1e5}, "prepare_data_np2": {"tokens_per_second": 1.9e5},
             "callbacks_none": _part(400.0), "callbacks_push": _part(410.0)}
    machine = {"cpu": "Test CPU", "cpu_cores": 2, "memory_gb": 8.0, "load_average_start": [0.5, 0.5, 0.5]}
    return tt.assemble(tt.PRESETS["small"], parts, machine)


def test_summarize_intervals_median_mean_and_compile():
    from benchmarks.step_timer import summarize_intervals

    s = summarize_intervals([10.0, 2.0, 1.0, 1.0, 3.0, 1.0], warmup_steps=2)
    assert s["steps_measured"] == 4
    assert s["ms_per_step"] == pytest.approx(1000.0)
    assert s["ms_per_step_mean"] == pytest.approx(1500.0)
    assert s["compile_seconds"] == pytest.approx(9.0)
    with pytest.raises(ValueError, match="run more steps"):
        summarize_intervals([1.0, 1.0], warmup_steps=2)


def test_assemble_recipes_ratios_and_mfu(result):
    hf = result["recipes"]["hf_tpu"]
    assert hf["tokens_per_second"] == pytest.approx(16 * 128 / 0.5)
    fpt = result["flops"]["flops_per_token"]
    assert hf["mfu"] == pytest.approx(round(4096 * fpt / 2e11, 4))
    assert set(result["recipes"]) >= {"hf_tpu", "plain", "plain_xla"}
    assert result["recipes"]["plain_xla"]["tokens_per_second"] is None
    assert result["recipes"]["plain"]["train_step_compilations"] == 2
    assert result["recipes"]["plain"]["mfu_executed"] > result["recipes"]["plain"]["mfu"]
    assert result["ratios"]["hf_tpu_vs_plain"] == pytest.approx(2.0)
    assert hf["runs_ms_per_step"] == [500.0, 520.0, 490.0] and hf["spread_ms_per_step"] == pytest.approx(0.04)
    assert result["ratios"]["hf_tpu_slowest_round_vs_median"] == pytest.approx(0.04)
    assert result["ratios"]["prepare_data_np_vs_1"] == pytest.approx(1.9)
    assert result["ratios"]["first_step_latency_hf_tpu_vs_plain"] == pytest.approx(20.0 / 25.0)
    assert result["ratios"]["hf_tpu_bf16_vs_plain"] == pytest.approx(1000.0 / 480.0, abs=1e-4)
    assert result["ratios"]["hf_tpu_bf16_no_xla_vs_plain"] == pytest.approx(2.5)
    # the recipe `--bf16 true` maps to on this machine's CPU (TF kernels + fused element-wise ops with native
    # bf16, else XLA)
    from hf_tpu_ext.precision import NATIVE_BF16_CPU_FLAGS, cpu_flags

    default = result["bf16_default_recipe"]
    assert default == ("hf_tpu_bf16_fused" if cpu_flags() & NATIVE_BF16_CPU_FLAGS else "hf_tpu_bf16")
    assert result["ratios"]["bf16_default_perplexity_change"] == pytest.approx(
        {"hf_tpu_bf16": 0.01, "hf_tpu_bf16_fused": 0.012}[default])
    assert result["ratios"]["hf_tpu_bf16_default_vs_hf_tpu"] == pytest.approx(
        {"hf_tpu_bf16": 500.0 / 480.0, "hf_tpu_bf16_fused": 500.0 / 320.0}[default], abs=1e-4)
    assert result["ratios"]["input_pipeline_vs_training"] == pytest.approx(1000.0)
    assert result["callback_overhead"]["overhead_median"] == pytest.approx(0.025)
    json.dumps(result)  # JSON-able


def test_flops_per_token_small_preset(result):
    # 4 layers, d=256, i=1024, V=8000, L=128, P=19: 6*N + 12*n*d*L + 6*(d^2+d*V)*P/L
    n = 4 * (4 * 256 ** 2 + 2 * 256 * 1024)
    expected = 6 * n + 12 * 4 * 256 * 128 + 6 * (256 ** 2 + 256 * 8000) * 19 / 128
    assert result["flops"]["flops_per_token"] == pytest.approx(expected)


def test_results_row_and_table(result, tmp_path):
    path = tmp_path / "RESULTS.md"
    tt.append_results_row(result, path)
    tt.append_results_row(result, path)
    lines = path.read_text().splitlines()
    rows = [ln for ln in lines if ln.startswith(f"| {result['date']}")]
    assert len(rows) == 2 and sum(ln.startswith("## With bf16") for ln in lines) == 1  # the v2 header once
    assert "| 4,096 | 2,048 | 2.00x | +4.0% | 4,267 | 5,120 | " in rows[0]
    assert "| 20.0 / 25.0 | 100,000 / 190,000 (1.90x) |" in rows[0]
    assert "Test CPU, 2 cores" in rows[0]
    table = tt.markdown_table(result)
    assert "| `plain_xla` | failed: XLA failed |" in table
    assert "| `hf_tpu` | n/a | 4,096 | 500.0 | 500, 520, 490 | +4.0% | 20.0 | 1,000.0 | 1 |" in table


def test_median_run_keeps_every_round_and_the_spread():
    runs = [{"ms_per_step": 360.0, "x": 1, "first_step_latency_seconds": 30.0}, {"error": "boom"},
            {"ms_per_step": 320.5, "x": 2, "first_step_latency_seconds": 20.0},
            {"ms_per_step": 340.0, "x": 3, "first_step_latency_seconds": 25.0}]
    med = tt.median_run(runs)
    assert med["x"] == 3 and med["ms_per_step"] == 340.0 and med["runs_ms_per_step"] == [360.0, 320.5, 340.0]
    assert med["fastest_ms_per_step"] == 320.5 and med["spread_ms_per_step"] == pytest.approx(360.0 / 340.0 - 1, abs=1e-4)
    assert med["first_step_latency_seconds"] == 25.0
    two = tt.median_run([{"ms_per_step": 300.0}, {"ms_per_step": 400.0}])
    assert two["ms_per_step"] == 350.0 and two["spread_ms_per_step"] == pytest.approx(400 / 350 - 1, abs=1e-4)
    assert tt.median_run([{"error": "a"}, {"error": "b"}]) == {"error": "b"}
    mean = tt.median_run([{"ms_per_step_mean": 5.0}, {"ms_per_step_mean": 4.0}, {"ms_per_step_mean": 6.0}],
                         "ms_per_step_mean")
    assert mean["runs_ms_per_step_mean"] == [5.0, 4.0, 6.0] and mean["ms_per_step_mean"] == 5.0


def test_rounds_record_their_load_and_only_quiet_results_are_headlines(result, tmp_path):
    # a round is quiet when other processes kept at most 10% of the cores busy (2 cores: 0.2)
    quiet = tt.round_load_fields([0.9, 0.8], [1.1, 0.9], 0.05, cores=2)
    assert quiet == {"loadavg_start": [0.9, 0.8], "loadavg_end": [1.1, 0.9], "foreign_cpu_cores": 0.05, "quiet": True}
    busy = tt.round_load_fields([3.0, 2.5], [3.2, 2.6], 1.3, cores=2)
    assert busy["quiet"] is False and tt.round_load_fields([0, 0], [0, 0], None, cores=2)["quiet"] is False
    med = tt.median_run([_part(500.0) | {"load": quiet}, _part(510.0) | {"load": busy}, _part(490.0) | {"load": quiet}])
    assert (med["rounds"], med["quiet_rounds"]) == (3, 2) and med["runs_load"] == [quiet, busy, quiet]
    machine = {"cpu": "Test CPU", "cpu_cores": 2, "load_average_start": [0.5, 0.5, 0.5]}
    verdict = tt.quietness(machine, {"hf_tpu": med, "plain": _part(1000.0) | {"load": quiet}, "plain_xla": {"error": "x"}})
    assert verdict["headline"] is False and verdict["quiet"]["loaded_rounds"] == {"hf_tpu": "1 of 3"}
    assert verdict["quiet"]["start_load_ok"] is True  # 0.5 <= 0.3 x 2 cores
    assert tt.quietness(machine, {"hf_tpu": _part(500.0) | {"load": quiet}})["headline"] is True
    assert tt.quietness(dict(machine, load_average_start=[0.7, 0.5, 0.5]),
                        {"hf_tpu": _part(500.0) | {"load": quiet}})["headline"] is False
    # the fixture's rounds carry no load: not a headline, and RESULTS.md says so in the row
    assert result["headline"] is False
    path = tmp_path / "RESULTS.md"
    tt.append_results_row(result, path)
    assert "; **not quiet: not a headline** (hf_tpu 3 of 3 rounds loaded" in path.read_text()
    # the round's own load sample: others' CPU time is measured, never negative
    fields = tt.RoundLoad().finish()
    assert fields["foreign_cpu_cores"] is None or fields["foreign_cpu_cores"] >= 0
    assert len(fields["loadavg_start"]) == 2 and len(fields["loadavg_end"]) == 2


def test_tf_step_profile_sums_kernel_time_per_op_type_and_pass(tmp_path):
    """benchmarks.tf_step_profile reads a tf.profiler XSpace: executor-thread op events per op type and pass, per
    step; bookkeeping events and other threads are left out."""
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    from benchmarks.tf_step_profile import op_pass, summarize_xplane

    space = xplane_pb2.XSpace()
    plane = space.planes.add(name="/host:CPU")
    ops = {1: ("model/dense/MatMul:_MklMatMul", "_MklMatMul"),
           2: ("gradient_tape/model/dense/MatMul:_MklMatMul", "_MklMatMul"),
           3: ("AdamWeightDecay/update/ResourceApplyAdam:ResourceApplyAdam", "ResourceApplyAdam"),
           4: ("ThreadpoolListener::Record", ""), 5: ("ExecutorState::Process", "")}
    for mid, (name, display) in ops.items():
        plane.event_metadata[mid].id, plane.event_metadata[mid].name = mid, name
        plane.event_metadata[mid].display_name = display
    compute = plane.lines.add(name="tf_Compute/123")
    for mid, ms in [(1, 2.0), (1, 4.0), (2, 6.0), (3, 1.0), (4, 50.0), (5, 70.0)]:
        compute.events.add(metadata_id=mid, duration_ps=int(ms * 1e9))
    plane.lines.add(name="python").events.add(metadata_id=1, duration_ps=int(100e9))  # not an executor thread
    path = tmp_path / "host.xplane.pb"
    path.write_bytes(space.SerializeToString())
    summary = summarize_xplane(str(path), steps=2)
    assert summary["op_ms"] == pytest.approx({"_MklMatMul": 6.0, "ResourceApplyAdam": 0.5})
    assert list(summary["op_ms"]) == ["_MklMatMul", "ResourceApplyAdam"]  # largest first
    assert summary["op_calls"] == {"_MklMatMul": 1.5, "ResourceApplyAdam": 0.5}
    assert summary["pass_ms"] == pytest.approx({"forward": 3.0, "backward": 3.0, "optimizer": 0.5})
    assert summary["kernel_ms_total"] == pytest.approx(6.5)
    assert [op_pass(n) for n in ("a/gradients/b", "x/Adam/y", "roberta/encoder")] == ["backward", "optimizer", "forward"]
