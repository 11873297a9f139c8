"""The guest of a fake cloud VM: it runs the start-up script the adapter sent, as the VM would at boot.

A real VM runs the script as root with the serial port at ``/dev/ttyS0`` and ``poweroff`` stopping it. Here
the same bytes run with ``sh`` in a subprocess whose environment is the "hardware": ``HB_CONSOLES`` points at
a file that plays the serial port (the script's own documented override), and ``PATH`` starts with a
directory holding a ``poweroff`` that only records the power-off, a ``curl`` that plays the metadata
server (it answers the interruption checks once :meth:`Guest.notice` was called) and an ``nvidia-smi`` that
works once :meth:`Guest.install_driver` was called (``HB_STATE_DIR``/``HB_PER_BOOT_DIR`` point into the guest's
directory). So the exit code the
adapter reads back really came from the script it sent. Only scripts that :mod:`providers.bootstrap`
generated are run (the machine running the tests must never be powered off by a stray command); anything
else is only stored, like a VM whose image ignores it.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path

__all__ = ["Guest", "GENERATED_HEADER"]

GENERATED_HEADER = "#!/bin/sh\n# hybrid-broker job runner (generated)"
BOOT_NOISE = "[    0.000000] Linux version 6.1.0-cloud-amd64\r\n[  OK  ] Reached target Cloud-init target.\r\n"
RUN_TIMEOUT_SECONDS = 60  # bounded: a guest is killed past this, like a VM hitting its runtime limit


class Guest:
    """One booted VM: :meth:`boot` starts the script in a thread; ``on_poweroff`` is called once when the
    script powered the VM off (not when it was killed by :meth:`kill`). ``console`` is the serial output."""

    def __init__(self, script: str | None, on_poweroff: Callable[[], None]) -> None:
        self.script = script
        self.on_poweroff = on_poweroff
        self.dir = Path(tempfile.mkdtemp(prefix="hb-guest-"))
        self.serial = self.dir / "ttyS0"
        self.serial.write_text(BOOT_NOISE)
        self._proc: subprocess.Popen[bytes] | None = None
        self._killed = False
        self._lock = threading.Lock()
        self.thread: threading.Thread | None = None

    @property
    def runs(self) -> bool:
        return bool(self.script and self.script.startswith(GENERATED_HEADER))

    def boot(self) -> None:
        if not self.runs or self.thread is not None:
            return
        bin_dir = self.dir / "bin"
        bin_dir.mkdir()
        marker = self.dir / "powered-off"
        shim = bin_dir / "poweroff"
        shim.write_text(f"#!/bin/sh\ntouch '{marker}'\n")
        shim.chmod(0o755)
        # The metadata server: every cloud's interruption check (curl) succeeds once notice() was called.
        curl = bin_dir / "curl"
        curl.write_text(f"#!/bin/sh\n[ -e '{self.dir / 'notice'}' ] || exit 22\necho TRUE\necho '\"Preempt\"'\n")
        curl.chmod(0o755)
        # The GPU: nvidia-smi works once a driver was installed (install_driver: the cloud's driver extension).
        smi = bin_dir / "nvidia-smi"
        smi.write_text(f"#!/bin/sh\n[ -e '{self.dir / 'nvidia-driver'}' ] || exit 9\necho 'NVIDIA-SMI fake'\n")
        smi.chmod(0o755)
        (self.dir / "user-data").write_text(self.script or "")
        env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "HB_CONSOLES": str(self.serial), "HOME": str(self.dir),
               "TMPDIR": str(self.dir), "HB_INTERRUPT_POLL": "0.1", "HB_GPU_POLL": "0.1",
               "HB_STATE_DIR": str(self.dir / "state"), "HB_PER_BOOT_DIR": str(self.dir / "per-boot")}

        def run() -> None:
            with self._lock:
                if self._killed:
                    return
                self._proc = subprocess.Popen([shutil.which("sh") or "/bin/sh", str(self.dir / "user-data")],
                                              cwd=self.dir, env=env, stdout=subprocess.DEVNULL,
                                              stderr=subprocess.DEVNULL, start_new_session=True)
            try:
                self._proc.wait(RUN_TIMEOUT_SECONDS)
            except subprocess.TimeoutExpired:
                self._killpg()
                self._proc.wait()
            with self._lock:
                if not self._killed and marker.exists():
                    self.serial.open("a").write("reboot: Power down\r\n")
                    self.on_poweroff()

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()

    def install_driver(self) -> None:
        """A GPU driver is installed (the cloud's NVIDIA driver extension ran): ``nvidia-smi`` works."""
        (self.dir / "nvidia-driver").touch()

    def notice(self) -> None:
        """The cloud announces the VM's interruption (spot notice / scheduled Preempt event / preempted)."""
        (self.dir / "notice").touch()

    def console(self) -> str:
        return self.serial.read_text(errors="replace")

    def kill(self) -> None:
        """The VM is gone (deleted, preempted): stop the script without calling ``on_poweroff``."""
        with self._lock:
            self._killed = True
            self._killpg()

    def _killpg(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            try:
                os.killpg(self._proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def wait(self, timeout: float = 30.0) -> None:
        if self.thread is not None:
            self.thread.join(timeout)

    def cleanup(self) -> None:
        self.kill()
        if self.thread is not None:
            self.thread.join(5)
        shutil.rmtree(self.dir, ignore_errors=True)

