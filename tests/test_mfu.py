"""One MFU definition: the peak is a property of the hardware (datasheet or CPU formula), the same at any load;
MFU is never above 100% and, when left out, says why once; every rate says which one it is."""

import logging
import subprocess
import sys
import time

import pytest

from hf_tpu_ext import flops
from hf_tpu_ext.flops import Peak, compute_mfu, cpu_peak, device_peak

# /proc/cpuinfo excerpts (the first processor block is what the formula reads)
ZEN3_AVX2 = """processor\t: 0
vendor_id\t: AuthenticAMD
cpu family\t: 25
model\t\t: 1
model name\t: AMD EPYC
cpu MHz\t\t: 2445.406
siblings\t: 2
cpu cores\t: 2
flags\t\t: fpu sse sse2 ht avx fma avx2 hypervisor

processor\t: 1
cpu MHz\t\t: 1200.000
"""
SAPPHIRE_RAPIDS_SMT = """processor\t: 0
vendor_id\t: GenuineIntel
cpu family\t: 6
model name\t: Intel(R) Xeon(R) Platinum 8481C CPU @ 2.70GHz
cpu MHz\t\t: 2700.000
siblings\t: 8
cpu cores\t: 4
flags\t\t: sse2 avx fma avx2 avx512f avx512_bf16 amx_bf16 amx_tile
"""
ZEN4_AVX512_BF16 = """vendor_id\t: AuthenticAMD
cpu family\t: 25
model\t\t: 17
cpu MHz\t\t: 3000.000
siblings\t: 4
cpu cores\t: 4
flags\t\t: sse2 avx fma avx2 avx512f avx512_bf16
"""
COOPER_LAKE = """vendor_id\t: GenuineIntel
cpu family\t: 6
cpu MHz\t\t: 2500.000
flags\t\t: sse2 avx fma avx2 avx512f avx512_bf16
"""
ARM_NO_CLOCK = """processor\t: 0
BogoMIPS\t: 50.00
Features\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm
"""


def test_cpu_peak_is_the_stated_formula():
    # 2 cores x 2.445406 GHz x 32 FLOP/cycle (two 256-bit FMA pipes), the first processor's clock
    assert cpu_peak("float32", ZEN3_AVX2, cores=2) == Peak(
        2 * 2.445406e9 * 32, "CPU formula: 2 cores x 2.45 GHz x 32 FLOP/cycle (AVX2 FMA, float32)")
    # no native bf16: a bf16 run multiplies in float32, so the float32 rate, said so
    assert cpu_peak("bfloat16", ZEN3_AVX2, cores=2) == Peak(
        2 * 2.445406e9 * 32, "CPU formula: 2 cores x 2.45 GHz x 32 FLOP/cycle (AVX2 FMA, float32: no native bf16)")
    # 8 logical CPUs usable = 4 cores with 2 threads each; AMX-BF16 1,024 FLOP/cycle, AVX-512 64 in float32
    assert cpu_peak("bfloat16", SAPPHIRE_RAPIDS_SMT, cores=8).flops == 4 * 2.7e9 * 1024
    assert cpu_peak("float32", SAPPHIRE_RAPIDS_SMT, cores=8).flops == 4 * 2.7e9 * 64
    assert cpu_peak("float32", SAPPHIRE_RAPIDS_SMT, cores=2).flops == 1 * 2.7e9 * 64  # taskset to one core's threads
    # AVX512-BF16 dot products: 128 FLOP/cycle; Zen 4 runs them (and AVX-512 FMAs) on 256-bit pipes: half
    assert cpu_peak("bfloat16", COOPER_LAKE, cores=1).flops == 2.5e9 * 128
    zen4 = cpu_peak("bfloat16", ZEN4_AVX512_BF16, cores=4)
    assert zen4 == Peak(4 * 3e9 * 64, "CPU formula: 4 cores x 3 GHz x 64 FLOP/cycle "
                                      "(AVX512-BF16 dot products on 256-bit pipes, bf16)")
    # a float32 peak names only the float32 units, never the bf16 ones it does not count
    assert cpu_peak("float32", ZEN4_AVX512_BF16, cores=4) == Peak(
        4 * 3e9 * 32, "CPU formula: 4 cores x 3 GHz x 32 FLOP/cycle (AVX-512 FMA on 256-bit pipes, float32)")
    assert cpu_peak("float32", SAPPHIRE_RAPIDS_SMT, cores=8).source.endswith("FLOP/cycle (AVX-512 FMA, float32)")
    # an Arm VM without cpufreq has no clock in /proc/cpuinfo: no peak, and why
    assert cpu_peak("float32", ARM_NO_CLOCK, cores=4) == Peak(
        None, "no CPU peak: the kernel reports no CPU clock (no cpufreq, no 'cpu MHz')")
    assert cpu_peak("float32", ARM_NO_CLOCK, cores=4, clock_hz=3e9).flops == 4 * 3e9 * 16
    assert cpu_peak("float32", "flags\t: fpu mmx\ncpu MHz\t: 1000\n", cores=1).flops is None


def test_tpu_and_gpu_peaks_are_datasheet_values():
    expected = {  # device kind -> (bf16, float32) dense FLOP/s
        "TPU v4": (275e12, 275e12), "TPU v5 lite": (197e12, 197e12), "TPU v5litepod-8": (197e12, 197e12),
        "TPU v5": (459e12, 459e12), "TPU v5p-8": (459e12, 459e12), "TPU v6 lite": (918e12, 918e12),
        "TPU v6e-8": (918e12, 918e12), "NVIDIA A100-SXM4-80GB": (312e12, 156e12),
        "NVIDIA H100 80GB HBM3": (989.5e12, 494.5e12), "NVIDIA H100 PCIe": (756.5e12, 378e12),
        "NVIDIA H100 NVL": (835.5e12, 417.5e12), "NVIDIA H200": (989.5e12, 494.5e12),
        "NVIDIA H200 NVL": (835.5e12, 417.5e12), "NVIDIA L4": (121e12, 60e12), "NVIDIA L40S": (362.05e12, 183e12),
        "NVIDIA A10": (125e12, 62.5e12),
    }
    for kind, (bf16, fp32) in expected.items():
        assert (device_peak(kind, "bfloat16").flops, device_peak(kind, "float32").flops) == (bf16, fp32), kind
    assert device_peak("NVIDIA H200", "bfloat16").source == "datasheet: NVIDIA H100/H200 SXM, bf16 dense"
    assert device_peak("NVIDIA L4", "float32").source == "datasheet: NVIDIA L4, TF32 dense"
    assert device_peak("NVIDIA A10G", "bfloat16") == Peak(
        None, "no peak: no datasheet figure for device 'NVIDIA A10G' in hf_tpu_ext.flops")
    assert device_peak("TPU", "bfloat16").source.startswith("no peak: TensorFlow does not name the TPU generation")
    assert device_peak("CPU", "float32", cpuinfo_text=ZEN3_AVX2, cores=2).flops == 2 * 2.445406e9 * 32


def test_the_cpu_peak_is_the_same_beside_a_busy_loop():
    """The old probe moved 4x with the neighbours' load; the formula reads no clock that load changes."""
    before = device_peak("CPU", "float32")
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(1.0)  # the loop is spinning
        beside = [device_peak("CPU", "float32") for _ in range(3)]
    finally:
        busy.kill()
        busy.wait()
    assert beside == [before] * 3


def test_mfu_is_never_above_one():
    assert compute_mfu(1000.0, 1e6, 2e9) == pytest.approx(0.5)
    assert compute_mfu(2000.0, 1e6, 2e9) == 1.0
    assert compute_mfu(2001.0, 1e6, 2e9) is None  # above the peak: left out, not clamped into a false figure
    assert compute_mfu(1000.0, None, 2e9) is None and compute_mfu(1000.0, 1e6, None) is None


def test_throughput_meter_leaves_mfu_out_once_with_the_reason(caplog):
    """A peak too low for the rate: MFU is dropped from that call on, one warning, the summary says why."""
    from hf_tpu_ext.callbacks.throughput_meter import ThroughputMeter

    meter = ThroughputMeter(global_batch_size=4, seq_length=8, flops_per_token=1e3, peak_flops=1e5, warmup_steps=0,
                            log_every=0)
    meter.peak_source = "a test peak"
    with caplog.at_level(logging.WARNING, logger="hf_tpu_ext"):
        assert meter._rates(1, 1.0)["mfu"] == pytest.approx(0.32)  # 32 tokens/s x 1e3 / 1e5
        assert "mfu" not in meter._rates(10, 1.0) and "mfu" not in meter._rates(1, 1.0)  # 3.2 > 1, then gone
    assert [r.getMessage() for r in caplog.records] == [
        "MFU left out: the model FLOP rate 3.2e+05 FLOP/s is above the peak 1e+05 FLOP/s (a test peak); "
        "the peak is too low for this machine."]
    meter._measured_steps, meter._measured_seconds = 1, 1.0
    meter.on_train_end()
    assert "mfu" not in meter.summary and meter.summary["mfu_note"] == caplog.records[0].getMessage()[:-1]
    assert meter.summary["rate"] == "steady: median step after warm-up, time inside train-batch calls"


def test_throughput_meter_steady_rate_is_the_median_step():
    """The card's and summary's steady rate is tokens per step over the median step (the card's label), not the
    mean: one slow call (a checkpoint inside a batch hook) does not drag it down."""
    from collections import deque

    from hf_tpu_ext.callbacks.throughput_meter import ThroughputMeter

    meter = ThroughputMeter(global_batch_size=4, seq_length=8, warmup_steps=0, log_every=0)
    meter._calls = deque([(0.1, 1), (0.1, 1), (1.0, 1)])  # (seconds per step, steps) of three calls
    meter._measured_steps, meter._measured_seconds = 3, 1.2
    meter._all_steps = 3
    assert meter.card_facts()["steady_tokens_per_second"] == pytest.approx(32 / 0.1)  # the mean would be 80
    meter.on_train_end()
    assert meter.summary["tokens_per_second"] == pytest.approx(320.0)
    assert meter.summary["step_time_ms_median"] == pytest.approx(100.0)
    assert meter.summary["step_time_ms_mean"] == pytest.approx(400.0)
    meter._epoch_calls, meter._epoch_steps, meter._epoch_seconds = deque(meter._calls), 3, 1.2
    logs = {}
    meter.on_epoch_end(0, logs)  # the epoch's figures agree with its median step (a tester saw 642 tokens/s at 12.9 ms)
    assert logs["tokens_per_second"] == pytest.approx(320.0) and logs["step_time_ms_median"] == pytest.approx(100.0)


def test_throughput_meter_takes_the_device_peak_at_train_begin():
    from hf_tpu_ext.callbacks.throughput_meter import ThroughputMeter

    class OnCPU(ThroughputMeter):
        def _device_peak(self):
            return device_peak("CPU", "float32", cpuinfo_text=ZEN3_AVX2, cores=2)

        def _iterations(self):
            return None

    meter = OnCPU(global_batch_size=4, seq_length=8, flops_per_token=1e3, log_every=0)
    meter.on_train_begin()
    assert meter.peak_flops == 2 * 2.445406e9 * 32
    assert meter.peak_source == "CPU formula: 2 cores x 2.45 GHz x 32 FLOP/cycle (AVX2 FMA, float32)"
    unknown = ThroughputMeter(global_batch_size=4, seq_length=8, flops_per_token=1e3, log_every=0)
    unknown._device_peak = lambda: Peak(None, "no peak: a test device")
    unknown._iterations = lambda: None
    unknown.on_train_begin()
    unknown._measured_steps, unknown._measured_seconds = 2, 1.0
    unknown.on_train_end()
    assert "mfu" not in unknown.summary and unknown.summary["mfu_note"] == "MFU left out: no peak: a test device"


def _card(tmp_path, **summary):
    from hf_tpu_ext.hub.model_card import render_model_card

    base = {"model_config": {"model_type": "roberta", "hidden_size": 64, "num_hidden_layers": 2}, "mask_token": "<mask>",
            "train_tokens_per_second": 8241.7, "steady_tokens_per_second": 12371.0}
    return str(render_model_card(str(tmp_path), repo_id="alice/m", summary=dict(base, **summary)))


def test_the_card_labels_both_rates_and_the_peak(tmp_path):
    source = "CPU formula: 2 cores x 2.45 GHz x 32 FLOP/cycle (AVX2 FMA, float32)"
    text = _card(tmp_path, mfu=0.0812, mfu_peak_flops=1.565e11, mfu_peak_source=source)
    assert "| Throughput, whole run (tokens/s: tokens seen / training wall time) | 8241.7 |" in text
    assert ("| Throughput, steady (tokens/s of the median training step; compilation, evaluation and checkpoints "
            "excluded) | 12371 |") in text
    assert f"| MFU (steady rate x FLOPs per token / peak FLOP/s) | 8.1% (peak 1.56e+11 FLOP/s per replica; {source}) |" in text
    absent = _card(tmp_path, mfu_note="MFU left out: no peak: no datasheet figure for device 'NVIDIA A10G' in "
                                      "hf_tpu_ext.flops")
    assert "| MFU | n/a (no peak: no datasheet figure for device 'NVIDIA A10G' in hf_tpu_ext.flops) |" in absent


def test_summary_carries_the_rates_and_mfu_or_why_not():
    import dataclasses

    from hf_tpu_ext.outputs import TrainingSummary, _mfu_fields

    assert {"train_tokens_per_second", "steady_tokens_per_second", "mfu", "mfu_peak_flops", "mfu_peak_source",
            "mfu_note"} <= {f.name for f in dataclasses.fields(TrainingSummary)}
    assert _mfu_fields({"mfu": 0.1, "mfu_peak_flops": 2e11, "mfu_peak_source": "x"}) == {
        "mfu": 0.1, "mfu_peak_flops": 2e11, "mfu_peak_source": "x"}
    assert _mfu_fields({"mfu_note": "MFU left out: why"}) == {"mfu_note": "MFU left out: why"}
    assert _mfu_fields({}) == {"mfu_note": "MFU left out: this backend does not report it"}


def test_no_probe_cache_is_left():
    assert not hasattr(flops, "_peak_cache_path")  # the load-dependent probe no longer divides MFU


def test_simulated_cpu_devices_share_the_cpus_peak(caplog):
    """JAX_NUM_CPU_DEVICES=2: the 2 devices of a process share its CPU, so each has half the CPU's peak (issue 43:
    each simulated device was given the whole CPU's peak, so MFU read 2-3%)."""
    from hf_tpu_ext.mfu import make_mfu_meter

    whole = device_peak("CPU", "float32", cpuinfo_text=ZEN3_AVX2, cores=2)
    shared = device_peak("cpu", "float32", cpuinfo_text=ZEN3_AVX2, cores=2, cpu_devices=2)
    assert shared == Peak(2 * 2.445406e9 * 32 / 2, "CPU formula: 2 cores x 2.45 GHz x 32 FLOP/cycle (AVX2 FMA, "
                                                  "float32), shared by the 2 devices on this CPU")
    assert device_peak("CPU", cpuinfo_text=ZEN3_AVX2, cores=2, cpu_devices=1) == whole
    # an accelerator's datasheet value is its own, whatever the count
    assert device_peak("TPU v4", "bfloat16", cpu_devices=4) == device_peak("TPU v4", "bfloat16")
    # the meter: 1,000 tokens/s on each of 4 devices at 1e6 FLOP/token against half the CPU per device
    caplog.set_level(logging.INFO, logger="hf_tpu_ext")
    meter = make_mfu_meter(1e6, "CPU", False, replicas=4, per="device", cpu_devices=2)
    per_device_peak = flops.cpu_peak("float32").flops / 2
    assert meter.peak.flops == per_device_peak
    assert meter(4000.0) == pytest.approx(1000.0 * 1e6 / per_device_peak)
    assert "shared by the 2 devices on this CPU" in caplog.text
