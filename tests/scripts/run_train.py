"""`hf-tpu train` in its own process, for tests that need fresh TF devices or a hard kill.

Extra options (consumed here, before TensorFlow starts):
  --split_cpu N      split the CPU into N logical devices (MirroredStrategy with N replicas)
  --kill_at_step S   SIGKILL this process right after global step S (its checkpoint, if any, is written)
  --cpu_flags F,G    the CPU flags hf_tpu_ext.precision sees (a native-bf16 CPU's precision plan on any host)
"""

import os
import signal
import sys


def _pop(argv, flag):
    if flag in argv:
        i = argv.index(flag)
        value = argv[i + 1]
        del argv[i:i + 2]
        return value
    return None


def main():
    argv = sys.argv[1:]
    split = _pop(argv, "--split_cpu")
    kill_at = _pop(argv, "--kill_at_step")
    flags = _pop(argv, "--cpu_flags")
    if flags:
        from hf_tpu_ext import precision

        precision.cpu_flags = lambda cpuinfo_text=None: frozenset(flags.split(","))
    if split:
        from hf_tpu_ext.backends.tensorflow.strategy import split_cpu

        split_cpu(int(split))
    if kill_at:
        import tf_keras

        from hf_tpu_ext.callbacks import register_callback

        @register_callback("test_kill_at_step", "Test only: SIGKILL after a global step.")
        class KillAtStep(tf_keras.callbacks.Callback):
            def on_train_batch_end(self, batch, logs=None):
                if int(self.model.optimizer.iterations.numpy()) >= int(kill_at):
                    os.kill(os.getpid(), signal.SIGKILL)

        i = argv.index("--callbacks") if "--callbacks" in argv else None
        if i is None:
            argv += ["--callbacks", "test_kill_at_step"]
        else:
            argv[i + 1] = ",".join(filter(None, [argv[i + 1], "test_kill_at_step"]))
    from hf_tpu_ext.cli import main as cli_main

    return cli_main(["train", *argv])


if __name__ == "__main__":
    sys.exit(main())
