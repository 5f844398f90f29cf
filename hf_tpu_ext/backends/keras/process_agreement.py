"""What the processes of a multi-process JAX run agree on through the coordinator's key-value store.

:class:`KeyValueAgreement` is the object :func:`hf_tpu_ext.distributed.set_process_agreement` installs once JAX has
joined the processes (:func:`hf_tpu_ext.backends.keras.processes.initialize_jax_distributed`): a value made once
on process 0 and read by the others (the tokenizer the run trains), and the run's exit status (process 0's, in
every process). A lost process 0 is named by the lost-process watch while the others wait here.
"""

from __future__ import annotations

import sys
import time
from typing import Callable

#: key-value store prefix of the shared values (``<prefix><key>/n`` the chunk count, ``<prefix><key>/<i>`` a chunk)
SHARE_PREFIX = "hf_tpu_ext/share/"
#: key of process 0's exit status
EXIT_STATUS_KEY = "hf_tpu_ext/exit_status"
#: characters per key-value entry: a value stays well below gRPC's 4 MiB message limit
CHUNK = 1 << 20
#: what process 0 writes instead of a value when making it failed
FAILED = "\x00failed: "


class KeyValueAgreement:
    """Values and the exit status carried between the processes of one run.

    Args:
        client: ``jax._src.distributed.global_state.client`` (``key_value_set(key, value, allow_overwrite)``,
            ``key_value_try_get(key)``; a fake in tests).
        process_id, num_processes: this process and the count.
        wait_seconds: how long a process waits for process 0's value or status (the shutdown time-out,
            ``HF_TPU_JAX_SHUTDOWN_TIMEOUT``: process 0's export and final push may take that long).
        poll: seconds between two reads (a sleep: the lost-process watch's thread keeps the GIL meanwhile).
        clock, sleep: monotonic seconds and ``time.sleep`` (tests pass fakes).
        ended_key: the key process 0 sets to ``exited`` when it ends (the lost-process watch's heartbeat key):
            a value it did not publish by then never comes.
    """

    def __init__(self, client, process_id: int, num_processes: int, wait_seconds: float, poll: float = 0.2,
                 clock=time.monotonic, sleep=time.sleep, ended_key: str = ""):
        self.client, self.process_id, self.num_processes = client, int(process_id), int(num_processes)
        self.ended_key = ended_key
        self.wait_seconds, self.poll, self.clock, self.sleep = float(wait_seconds), float(poll), clock, sleep

    def _get(self, key: str, what: str) -> str:
        """Process 0's value of ``key``, waited for up to ``wait_seconds``.

        Raises:
            RuntimeError: it did not come within the time (one line naming ``what`` and the variable).
        """
        deadline = self.clock() + self.wait_seconds
        while True:
            try:
                return self.client.key_value_try_get(key)
            except Exception as err:  # noqa: BLE001 (NOT_FOUND: not written yet; the store gone: the watch says so)
                if "not_found" not in str(err).lower() and "not found" not in str(err).lower():
                    raise
            if self.clock() >= deadline:
                raise RuntimeError(f"process 0 did not publish {what} within {self.wait_seconds:g} s "
                                   "(HF_TPU_JAX_SHUTDOWN_TIMEOUT): its own lines say why.")
            if self._ended() and not self._has(key):
                raise RuntimeError(f"process 0 ended without publishing {what}: its own lines say why.")
            self.sleep(self.poll)

    def _has(self, key: str) -> bool:
        try:
            self.client.key_value_try_get(key)
            return True
        except Exception:  # noqa: BLE001 (not there)
            return False

    def _ended(self) -> bool:
        try:
            return bool(self.ended_key) and self.client.key_value_try_get(self.ended_key) == "exited"
        except Exception:  # noqa: BLE001 (not beating yet)
            return False

    def share(self, key: str, produce: Callable[[], str]) -> str:
        """``produce()`` on process 0, written in chunks of :data:`CHUNK` characters; the others read it.

        Raises:
            what ``produce()`` raised (process 0); RuntimeError naming process 0's failure (the others).
        """
        prefix = f"{SHARE_PREFIX}{key}/"
        if self.process_id == 0:
            try:
                value = str(produce())
            except BaseException as err:
                self.client.key_value_set(prefix + "n", f"{FAILED}{type(err).__name__}: {err}"[:2000], True)
                raise
            chunks = [value[i:i + CHUNK] for i in range(0, len(value), CHUNK)] or [""]
            for i, chunk in enumerate(chunks):
                self.client.key_value_set(f"{prefix}{i}", chunk, True)
            self.client.key_value_set(prefix + "n", str(len(chunks)), True)  # last: the value is complete
            return value
        count = self._get(prefix + "n", f"the {key}")
        if count.startswith(FAILED):
            raise RuntimeError(f"process 0 failed to make the {key}: {count[len(FAILED):]}")
        return "".join(self._get(f"{prefix}{i}", f"the {key}") for i in range(int(count)))

    def exit_status(self, code: int) -> int:
        """Process 0 publishes ``code``; another process ends with process 0's status when its own is 0 (it has
        nothing of its own to report), saying so in one tagged line, else with its own."""
        if self.process_id == 0:
            try:
                self.client.key_value_set(EXIT_STATUS_KEY, str(int(code)), True)
            except Exception:  # noqa: BLE001 (the store is this process's own service: gone only at exit)
                pass
            return int(code)
        if code != 0:
            return int(code)
        try:
            main = int(self._get(EXIT_STATUS_KEY, "its exit status"))
        except RuntimeError as err:
            print(f"hf-tpu train: error: [process {self.process_id}] {err}", file=sys.stderr, flush=True)
            return 1
        if main != 0:
            print(f"hf-tpu train: error: [process {self.process_id}] process 0 ended the run with exit status "
                  f"{main} (its lines say why); this process ends with it.", file=sys.stderr, flush=True)
        return main
