"""Who an on-prem job runs as: a per-namespace unprivileged user, a clean environment, a private directory.

The security model (``docs/API.md``, "Security model") in code:

* **Mode** (``BROKER_ONPREM_SANDBOX`` for ``broker serve``; the ``sandbox`` argument of
  :class:`providers.onprem.OnPremPool`): ``user`` runs every local job as the namespace's own system user and
  refuses to run work when the broker cannot switch users (not root); ``auto`` (the ``broker serve``
  default) does the same when the broker runs as root and otherwise logs one warning and runs jobs as the
  broker's user; ``off`` runs jobs as the broker's user (development only).
* **User**: ``hbj-<namespace>`` (:func:`user_name`: at most 32 characters, with a hash suffix so two
  namespaces never share one), created on first use with ``useradd --system`` (no home, no login shell,
  its own group, no supplementary groups). Jobs of different namespaces cannot read each other's files.
* **Files**: the data directory is made ``0711`` (others may pass through, not list), the database,
  its WAL files and every other file in it ``0600``, its sub-directories (CA keys, logs) ``0700``
  (:func:`secure_data_dir`). A run's own directory holds root-owned ``0600`` logs and ``run.json``; only
  its ``work`` directory (``0700``) belongs to the job's user.
* **Environment**: only :func:`clean_env` (a fixed ``PATH``, ``HOME``/``TMPDIR`` in the work directory,
  ``LANG``), the job's ``env`` and the ``HB_*`` variables; nothing of the broker's own environment.
"""

from __future__ import annotations

import hashlib
import logging
import os
import pwd
import re
import stat
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from broker.errors import InvalidRequestError

__all__ = ["SANDBOX_MODES", "JobUser", "Sandbox", "user_name", "secure_data_dir", "clean_env", "safe_workdir"]

log = logging.getLogger("providers.sandbox")

SANDBOX_MODES = ("user", "auto", "off")
SAFE_PATH = "/usr/local/bin:/usr/bin:/bin"
_NAME_OK = re.compile(r"[^a-z0-9-]")


@dataclass(frozen=True)
class JobUser:
    """The system user a job runs as."""

    name: str
    uid: int
    gid: int


def user_name(namespace: str) -> str:
    """``hbj-<namespace>`` cut to fit 32 characters, with 6 hex digits of the namespace's hash."""
    digest = hashlib.sha256(namespace.encode("utf-8", "surrogatepass")).hexdigest()[:6]
    clean = _NAME_OK.sub("-", namespace.lower())[:20] or "ns"
    return f"hbj-{clean}-{digest}"


def _ensure_user(name: str) -> JobUser:
    """The user ``name``, created (system user, own group, no home, no shell) when missing."""
    for attempt in range(50):
        try:
            pw = pwd.getpwnam(name)
            return JobUser(name, pw.pw_uid, pw.pw_gid)
        except KeyError:
            pass
        done = subprocess.run(
            ["useradd", "--system", "--no-create-home", "--home-dir", "/nonexistent", "--shell",
             "/usr/sbin/nologin", "--user-group", name],
            capture_output=True, text=True, check=False,
        )
        if done.returncode in (0, 9):  # 9: it exists (made meanwhile by another broker)
            continue
        if attempt >= 49:
            raise InvalidRequestError(
                f"onprem: cannot create the job user {name!r}: {done.stderr.strip() or done.returncode}. "
                "To fix: create it (useradd --system --user-group NAME) or set BROKER_ONPREM_SANDBOX=off"
            )
        time.sleep(0.1)  # /etc/passwd is locked by another useradd
    raise InvalidRequestError(f"onprem: the job user {name!r} cannot be created. To fix: create it by hand")


class Sandbox:
    """The sandbox of one pool (see the module docstring). ``mode`` is one of :data:`SANDBOX_MODES`."""

    def __init__(self, mode: str = "off") -> None:
        mode = (mode or "off").strip().lower()
        if mode not in SANDBOX_MODES:
            raise InvalidRequestError(
                f"onprem: sandbox mode must be one of {', '.join(SANDBOX_MODES)}, got {mode!r}. "
                "To fix: set BROKER_ONPREM_SANDBOX to user, auto or off"
            )
        self.mode = mode
        self.can_switch = os.geteuid() == 0
        self._users: dict[str, JobUser] = {}
        self._warned = False

    @property
    def drops_privileges(self) -> bool:
        """True when jobs run as a namespace user (not as the broker's user)."""
        return self.mode != "off" and self.can_switch

    def user_for(self, namespace: str) -> JobUser | None:
        """The user jobs of ``namespace`` run as, or ``None`` for the broker's own user (mode ``off``, or
        ``auto`` when not root). Mode ``user`` without root raises :class:`InvalidRequestError`."""
        if self.mode == "off":
            return None
        if not self.can_switch:
            if self.mode == "user":
                raise InvalidRequestError(
                    "onprem: BROKER_ONPREM_SANDBOX=user needs the broker to run as root to start jobs as "
                    "their namespace's user. To fix: run the broker as root, or set BROKER_ONPREM_SANDBOX=auto"
                )
            if not self._warned:
                self._warned = True
                log.warning("on-prem jobs run as the broker's own user (not root, BROKER_ONPREM_SANDBOX=auto): "
                            "they can read the broker's data directory. Run as root to sandbox them")
            return None
        user = self._users.get(namespace)
        if user is None:
            user = _ensure_user(user_name(namespace))
            self._users[namespace] = user
        return user


def secure_data_dir(data_dir: str | os.PathLike[str], *, keep_open: tuple[str, ...] = ("runs",)) -> None:
    """Make ``data_dir`` ``0711``, every file under it ``0600`` and every directory ``0700``, except the top-level
    ``keep_open`` directories (made ``0711``, contents left to their owner: the runs). Symlinks are left alone;
    errors (a file gone meanwhile) are ignored."""
    root = Path(data_dir)
    try:
        os.chmod(root, 0o711)
    except OSError:
        return
    for top, dirs, files in os.walk(root):
        here = Path(top)
        if here == root:
            for name in [d for d in dirs if d in keep_open]:
                dirs.remove(name)
                _chmod(here / name, 0o711)
        for name in dirs:
            _chmod(here / name, 0o700)
        for name in files:
            _chmod(here / name, 0o600, only_if_open=True)


def _chmod(path: Path, mode: int, *, only_if_open: bool = False) -> None:
    try:
        st = os.lstat(path)
        if stat.S_ISLNK(st.st_mode) or (only_if_open and not stat.S_IMODE(st.st_mode) & 0o077):
            return
        os.chmod(path, mode)
    except OSError:
        pass


def clean_env(work: Path) -> dict[str, str]:
    """The base environment of a job: a fixed ``PATH``, ``HOME`` and ``TMPDIR`` in its work dir, ``LANG``."""
    return {"PATH": SAFE_PATH, "HOME": str(work), "TMPDIR": str(work / "tmp"), "LANG": "C.UTF-8"}


def safe_workdir(work: Path, workdir: str | None) -> Path:
    """The job's working directory inside ``work``: ``workdir`` relative to it, never outside it (``..``,
    an absolute path, or a symlink out raise :class:`InvalidRequestError`)."""
    if not workdir:
        return work
    if os.path.isabs(workdir) or ".." in Path(workdir).parts:
        raise InvalidRequestError(
            f"onprem: workingDir {workdir!r} must be a relative path inside the job's directory (no '..', not "
            "absolute). To fix: use e.g. workingDir: src"
        )
    path = work / workdir
    if not path.resolve().is_relative_to(work.resolve()):
        raise InvalidRequestError(f"onprem: workingDir {workdir!r} leaves the job's directory. To fix: use a "
                                  "relative path without symlinks")
    return path
