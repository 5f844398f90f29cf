"""kill -9 of one process of a 2-process Keras run, N times, with the DEFAULT time-outs; prints "k/N".

A try passes when every survivor exits 1 with the lost-process line as its last stderr line, no C++ abort (exit 134,
"Check failure", "Fatal Python error", a stack trace) and no Python traceback before it. Issue 43 item 3.

    KERAS_BACKEND=jax JAX_PLATFORMS=cpu PYTHONPATH=. python tests/scripts/kill_a_process.py --tries 10 [--victim 0]

``--victim 0`` kills process 0, the coordinator (its coordination service lives on in its sidecar process:
hf_tpu_ext/backends/keras/coordination_service.py); the default is process 1.

The victim SIGKILLs itself at a step (``HF_TPU_EXT_TEST_KILL_AT=train_step@S``, S cycling 2..7, so the survivor
is caught at different points of a step), or with ``--outside`` is killed from here a random 0-3 s after its
first step line.
"""

import argparse
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time

LINE = "hf-tpu train: error: process {victim} of 2 was lost ("


def _args(output_dir):
    return ["--backend", "keras", "--output_dir", output_dir, "--hidden_size", "32", "--num_hidden_layers", "2",
            "--num_attention_heads", "2", "--intermediate_size", "64", "--vocab_size", "300",
            "--max_seq_length", "32", "--per_device_train_batch_size", "2", "--max_train_samples", "128",
            "--logging_steps", "1", "--max_steps", "100000", "--save_steps", "3", "--seed", "7",
            "--eval_strategy", "no", "--disable_tqdm", "true"]


def _port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def one_try(index, victim, outside, root):
    """One 2-process run, one process killed; ``(passed, survivor's exit status, seconds after the kill, tail)``."""
    out = os.path.join(root, f"run{index}")
    address = f"127.0.0.1:{_port()}"
    procs = []
    for i in range(2):
        env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_TPU_JAX_", "HF_TPU_EXT_TEST_"))}
        env.update(KERAS_BACKEND="jax", JAX_PLATFORMS="cpu", JAX_NUM_CPU_DEVICES="2", JAX_NUM_PROCESSES="2",
                   JAX_PROCESS_ID=str(i), JAX_COORDINATOR_ADDRESS=address)
        if i == victim and not outside:
            env["HF_TPU_EXT_TEST_KILL_AT"] = f"train_step@{2 + index % 6}"
        procs.append(subprocess.Popen([sys.executable, "-m", "hf_tpu_ext", "train", *_args(out)], env=env,
                                      stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True))
    if outside:
        while not os.path.isdir(os.path.join(out, "checkpoint-3")):
            time.sleep(0.2)
        time.sleep(random.uniform(0.0, 3.0))
        procs[victim].send_signal(signal.SIGKILL)
    procs[victim].wait(timeout=900)
    killed = time.monotonic()
    survivor = procs[1 - victim]
    try:
        _, err = survivor.communicate(timeout=300)
    except subprocess.TimeoutExpired:
        survivor.kill()
        _, err = survivor.communicate()
    seconds = time.monotonic() - killed
    lines = err.strip().splitlines()
    last = lines[-1] if lines else ""
    aborted = any(s in err for s in ("Check failure", "Fatal Python error", "*** SIGABRT", "Traceback"))
    passed = survivor.returncode == 1 and last.startswith(LINE.format(victim=victim)) and not aborted
    why = [l for l in lines if any(s in l for s in ("Terminating", "heartbeat", "Check failure", "F0", "F1"))][:3]
    return passed, survivor.returncode, seconds, "\n".join(why + lines[-3:])


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tries", type=int, default=10)
    parser.add_argument("--victim", type=int, default=1, choices=(0, 1))
    parser.add_argument("--outside", action="store_true", help="kill from outside at a random moment")
    args = parser.parse_args()
    passed = 0
    with tempfile.TemporaryDirectory() as root:
        for index in range(args.tries):
            ok, rc, seconds, tail = one_try(index, args.victim, args.outside, root)
            passed += ok
            print(f"try {index + 1}: {'ok' if ok else 'FAILED'}, exit {rc}, {seconds:.1f} s after the kill", flush=True)
            if not ok:
                print("  " + tail.replace("\n", "\n  "), flush=True)
    print(f"{passed}/{args.tries}")
    return 0 if passed == args.tries else 1


if __name__ == "__main__":
    sys.exit(main())
