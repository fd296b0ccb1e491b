"""Kernel-level isolation used by the sandbox worker (stdlib only, Linux).

The worker process calls `setup_worker_isolation` once at start; it then forks
one child per job. Every step degrades gracefully: what is actually active is
returned as a report so the pool can tell its callers.

This file is imported by `sandbox_worker.py`, which runs as a plain script
(`python3 -S -s -B sandbox_worker.py`), so it must not import the package.
"""
import ctypes
import os
import signal
import sys
import sysconfig

CLONE_NEWNS = 0x00020000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
MS_RDONLY = 1
MS_NOSUID = 2
MS_NODEV = 4
MS_REMOUNT = 32
MS_BIND = 4096
MS_REC = 16384
MS_PRIVATE = 1 << 18
PR_SET_PDEATHSIG = 1

# Sandbox uids start here; worker pid is added so concurrent workers (even of
# different pools or test sessions) never share a uid.
UID_BASE = 200000

# Never hidden: the interpreter and its shared libraries live there.
_SYSTEM_DIRS = frozenset(("/", "/usr", "/usr/local", "/usr/lib", "/lib", "/lib64", "/bin", "/sbin",
                          "/etc", "/proc", "/sys", "/dev", "/var", "/run", "/opt", "/tmp"))

_libc = ctypes.CDLL(None, use_errno=True)


def _check(ret, what):
  if ret != 0:
    err = ctypes.get_errno()
    raise OSError(err, f"{what}: {os.strerror(err)}")


def unshare(flags):
  _check(_libc.unshare(ctypes.c_int(flags)), f"unshare({flags:#x})")


def mount(source, target, fstype, flags, data=None):
  enc = lambda s: None if s is None else os.fsencode(s)
  _check(_libc.mount(enc(source), enc(target), enc(fstype), ctypes.c_ulong(flags), enc(data)),
         f"mount {target}")


def set_parent_death_signal(sig=signal.SIGKILL):
  """Dies with the parent; cleared by the kernel on credential changes, so call after setuid."""
  _libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0)


def world_writable_dirs():
  """Directories any uid could write to (where a dropped-privilege program could leave files)."""
  found = []
  for path in ("/tmp", "/var/tmp", "/dev/shm", "/run/lock", "/var/lock", "/dev/mqueue"):
    try:
      st = os.lstat(path)
    except OSError:
      continue
    if not os.path.islink(path) and st.st_mode & 0o002:
      found.append(path)
  return found


def _is_under(path, parent):
  return path == parent or path.startswith(parent.rstrip("/") + "/")


def python_paths():
  """Paths the sandboxed interpreter must still read (its stdlib)."""
  paths = {os.path.realpath(sysconfig.get_paths()["stdlib"]), os.path.realpath(sys.base_prefix)}
  return sorted(paths)


def _hide_path(hidden, keep, staging):
  """Covers `hidden` with an empty read-only tmpfs, re-exposing `keep` paths under it."""
  inner = [k for k in keep if _is_under(k, hidden) and k != hidden]
  staged = []
  for i, path in enumerate(inner):
    stage = os.path.join(staging, f"keep{len(os.listdir(staging))}_{i}")
    os.makedirs(stage)
    mount(path, stage, None, MS_BIND | MS_REC)
    staged.append((path, stage))
  mount("tmpfs", hidden, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,mode=0755")
  for path, stage in staged:
    target = path
    os.makedirs(target, mode=0o755, exist_ok=True)
    mount(stage, target, None, MS_BIND | MS_REC)
    mount(None, target, None, MS_REMOUNT | MS_BIND | MS_RDONLY)
  mount(None, hidden, None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)


def setup_worker_isolation(network, hidden_paths, sandbox_root):
  """Puts the calling (worker) process into private namespaces; returns (report, flags).

  network: "auto" | "netns" | "socket-guard". hidden_paths: directories to
  cover with an empty tmpfs (the trainer's repo, cwd, home). sandbox_root: where
  job directories are made (inside a private tmpfs when mounts are available).
  """
  report = {}
  is_root = os.geteuid() == 0
  netns = False
  mountns = False
  if network != "socket-guard" and is_root:
    try:
      unshare(CLONE_NEWNET | CLONE_NEWNS)
      netns = mountns = True
    except OSError:
      try:
        unshare(CLONE_NEWNET)
        netns = True
      except OSError:
        pass
  if network == "netns" and not netns:
    raise OSError("network namespace requested but the kernel refused it")
  report["network"] = "netns" if netns else "socket-guard"

  hidden_done = []
  if mountns:
    try:
      mount("none", "/", None, MS_REC | MS_PRIVATE)
      staging_parent = "/tmp"
      for path in world_writable_dirs():
        mount("tmpfs", path, "tmpfs", MS_NOSUID | MS_NODEV, "size=256m,mode=1777")
      staging = os.path.join(staging_parent, ".cp_staging")
      os.makedirs(staging, exist_ok=True)
      keep = python_paths()
      for path in sorted({os.path.realpath(p) for p in hidden_paths}, key=len):
        if path in _SYSTEM_DIRS or not os.path.isdir(path):
          continue
        if any(_is_under(path, k) for k in keep):
          continue
        if any(_is_under(path, h) for h in hidden_done):
          continue
        _hide_path(path, keep, staging)
        hidden_done.append(path)
      report["filesystem"] = "private tmpfs over world-writable dirs; hidden: " + (
          ", ".join(hidden_done) or "none")
    except OSError as e:
      report["filesystem"] = f"partial ({e})"
  else:
    report["filesystem"] = "host (no mount namespace)"
  os.makedirs(sandbox_root, mode=0o711, exist_ok=True)
  os.chmod(sandbox_root, 0o711)

  pidns = False
  if is_root or mountns:
    pidns = _probe_pid_namespace()
  report["pid"] = "pidns per job" if pidns else "process group + uid sweep"
  uid = UID_BASE + os.getpid() if is_root else None
  if uid is not None and not _probe_uid_can_import(uid):
    uid = None
  report["user"] = f"uid {uid}" if uid is not None else f"same uid ({os.geteuid()})"
  return report, {"netns": netns, "pidns": pidns, "uid": uid}


def _probe_pid_namespace():
  """True when a forked child may create a fresh PID namespace (needed per job)."""
  pid = os.fork()
  if pid == 0:
    try:
      unshare(CLONE_NEWPID)
      inner = os.fork()
      if inner == 0:
        os._exit(0 if os.getpid() == 1 else 1)
      _, status = os.waitpid(inner, 0)
      os._exit(os.waitstatus_to_exitcode(status))
    except BaseException:
      os._exit(1)
  _, status = os.waitpid(pid, 0)
  return os.waitstatus_to_exitcode(status) == 0


def _probe_uid_can_import(uid):
  """True when a process running as `uid` can still read the stdlib."""
  pid = os.fork()
  if pid == 0:
    try:
      drop_privileges(uid)
      with open(os.path.join(sysconfig.get_paths()["stdlib"], "os.py"), "rb"):
        pass
      os._exit(0)
    except BaseException:
      os._exit(1)
  _, status = os.waitpid(pid, 0)
  return os.waitstatus_to_exitcode(status) == 0


def drop_privileges(uid):
  os.setgroups([])
  os.setgid(uid)
  os.setuid(uid)


def kill_uid(uid):
  """SIGKILLs every process running as `uid` (kill(-1) from a process of that uid)."""
  pid = os.fork()
  if pid == 0:
    try:
      drop_privileges(uid)
      os.kill(-1, signal.SIGKILL)
    except BaseException:
      pass
    os._exit(0)
  os.waitpid(pid, 0)
