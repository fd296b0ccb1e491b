"""Kernel-level isolation used by the sandbox worker (stdlib only, Linux).

The worker process calls `setup_worker_isolation` once at start; it then forks
one child per job. Every step degrades gracefully: what is actually active is
returned as a report so the pool can tell its callers.

This file is imported by `sandbox_worker.py`, which runs as a plain script
(`python3 -S -s -B sandbox_worker.py`), so it must not import the package.
"""
import ctypes
import errno
import os
import signal
import sys

import sandbox_seccomp  # pylint: disable=g-import-not-at-top  (a sibling plain-script module)

CLONE_NEWNS = 0x00020000
CLONE_NEWIPC = 0x08000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
MS_RDONLY = 1
MS_NOSUID = 2
MS_NODEV = 4
MS_NOEXEC = 8
MS_REMOUNT = 32
MS_NOATIME = 1024
MS_NODIRATIME = 2048
MS_BIND = 4096
MS_REC = 16384
MS_PRIVATE = 1 << 18
MS_RELATIME = 1 << 21
MS_STRICTATIME = 1 << 24
MNT_DETACH = 2
PR_SET_PDEATHSIG = 1

# Sandbox uids start here; worker pid is added so concurrent workers (even of
# different pools or test sessions) never share a uid.
UID_BASE = 200000

# Layers a caller may switch off (benchmarks measure each one's cost this way).
LAYERS = ("netns", "mountns", "pidns", "uid", "jobns", "ipcns", "seccomp")
# Where host services keep unix sockets; covered by an empty tmpfs in the worker's mount namespace.
SOCKET_DIRS = ("/run", "/var/run")
# Fresh per job (its own tmpfs in the job's mount namespace); the job's cwd is JOB_WORKDIR. Every
# other world-writable dir is made read-only in the worker's mount namespace instead (one mount
# per job fewer for each).
JOB_TMP_DIRS = ("/tmp", "/dev/shm")
JOB_WORKDIR = "/tmp/job"
JOB_TMPFS_OPTIONS = "size=64m,nr_inodes=4096,mode=1777"

# Device nodes a job keeps; the rest of /dev (ptys, /dev/kmsg, block devices, ...) is not there.
JOB_DEVICES = ("null", "zero", "full", "random", "urandom")
# Kernel views of host-wide state (process lists, load and memory counters, cgroups): covered by an
# empty tmpfs, so that nothing a job reads there depends on other jobs.
KERNEL_VIEWS = ("/proc", "/sys")

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


def umount(target):
  _check(_libc.umount2(os.fsencode(target), ctypes.c_int(MNT_DETACH)), f"umount {target}")


def setns(fd, nstype):
  _check(_libc.setns(ctypes.c_int(fd), ctypes.c_int(nstype)), f"setns({nstype:#x})")


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


def _stdlib_dir():
  import sysconfig  # pylint: disable=g-import-not-at-top  (only the worker needs it)
  return sysconfig.get_paths()["stdlib"]


def python_paths():
  """Paths the sandboxed interpreter must still read (its stdlib)."""
  paths = {os.path.realpath(_stdlib_dir()), os.path.realpath(sys.base_prefix)}
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
    _drop_stage(stage)
  mount(None, hidden, None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)


def _drop_stage(stage):
  """Unmounts a staging bind (its target keeps its own mount) and removes the empty stage."""
  umount(stage)
  os.rmdir(stage)


def _minimal_dev(staging):
  """Covers /dev with a tmpfs holding only JOB_DEVICES (bind mounts) and an empty shm dir."""
  staged = []
  for name in JOB_DEVICES:
    source = os.path.join("/dev", name)
    if not os.path.exists(source):
      continue
    stage = os.path.join(staging, f"dev_{name}")
    open(stage, "w").close()
    mount(source, stage, None, MS_BIND)
    staged.append((name, stage))
  mount("tmpfs", "/dev", "tmpfs", MS_NOSUID | MS_NOEXEC, "size=64k,nr_inodes=64,mode=0755")
  for name, stage in staged:
    target = os.path.join("/dev", name)
    open(target, "w").close()
    mount(stage, target, None, MS_BIND)
    umount(stage)
    os.unlink(stage)
  os.mkdir("/dev/shm", 0o1777)
  os.chmod("/dev/shm", 0o1777)
  mount(None, "/dev", None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NOEXEC)
  return [name for name, _ in staged]


_MOUNT_FLAGS = {"nodev": MS_NODEV, "noexec": MS_NOEXEC, "nodiratime": MS_NODIRATIME}


def mount_points():
  """(mount point, per-mount options) of every mount of this mount namespace (/proc/self/mountinfo)."""
  found = []
  with open("/proc/self/mountinfo") as f:
    for line in f:
      fields = line.split()
      if len(fields) < 6:
        continue
      # Octal escapes (\040 for a space) in the mount point.
      point = fields[4].encode().decode("unicode_escape").encode("latin-1").decode(
          errors="surrogateescape")
      found.append((point, fields[5].split(",")))
  return found


def read_only_everywhere(keep_writable=()):
  """Bind-remounts every visible mount read-only, nosuid and noatime (what a job reads leaves no
  access time another job could see, and no file can change); returns the mount points that
  refused. Mounts under KERNEL_VIEWS are skipped (they are hidden next)."""
  failed, seen = [], set()
  for point, options in reversed(mount_points()):  # Last listed = the one visible at the path.
    if point in seen or any(_is_under(point, v) for v in KERNEL_VIEWS) or point in keep_writable:
      continue
    seen.add(point)
    if not os.path.isdir(point) and not os.path.exists(point):
      continue  # Covered by a later mount (a hidden path), unreachable anyway.
    keep = 0
    for option, flag in _MOUNT_FLAGS.items():
      if option in options:
        keep |= flag
    base = MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | keep
    try:
      mount(None, point, None, base | MS_NOATIME)
    except OSError:
      # A mount whose atime flags are locked (a less privileged user namespace): read-only alone
      # already stops access-time updates (the kernel skips them on read-only mounts).
      atime = (MS_RELATIME if "relatime" in options else
               MS_NOATIME if "noatime" in options else MS_STRICTATIME)
      try:
        mount(None, point, None, base | atime)
      except OSError as e:
        if e.errno != errno.EINVAL:  # EINVAL: covered by a later mount, no longer a mount point.
          failed.append(f"{point} ({e.strerror})")
  return failed


def hide_kernel_views():
  """Covers KERNEL_VIEWS with an empty read-only tmpfs; returns those done."""
  done = []
  for path in KERNEL_VIEWS:
    try:
      mount("tmpfs", path, "tmpfs", MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC,
            "size=4k,nr_inodes=4,mode=0555")
      done.append(path)
    except OSError:
      pass
  return done


def host_socket_dirs():
  """Directories holding filesystem unix sockets of this network namespace (/proc/net/unix)."""
  dirs = set()
  try:
    with open("/proc/net/unix") as f:
      next(f, None)
      for line in f:
        parts = line.split()
        if len(parts) >= 8 and parts[7].startswith("/"):
          dirs.add(os.path.dirname(parts[7]))
  except OSError:
    pass
  return sorted(dirs)


def setup_worker_isolation(network, hidden_paths, sandbox_root, disabled=(), on_namespaces=None):
  """Puts the calling (worker) process into private namespaces; returns (report, flags).

  network: "auto" | "netns" | "socket-guard". hidden_paths: directories to
  cover with an empty tmpfs (the trainer's repo, cwd, home). sandbox_root: where
  job directories are made when there is no per-job mount namespace. disabled:
  names from LAYERS to leave off (for measuring their cost). Every layer that is
  not active says why in the report. flags["pidns_fd"] is a descriptor of this
  process's PID namespace (the zygote returns to it after making each job's).
  on_namespaces: called once the network and mount namespaces exist, before any path is hidden
  (the worker starts its zygotes there: their files may be under a hidden path).
  """
  disabled = set(disabled)
  unknown = disabled - set(LAYERS)
  if unknown:
    raise ValueError(f"unknown sandbox layers {sorted(unknown)}; known: {LAYERS}")
  report = {}
  is_root = os.geteuid() == 0
  netns = False
  mountns = False
  socket_dirs = sorted(set(SOCKET_DIRS) | set(host_socket_dirs()))  # Read before leaving the netns.
  want_net = network != "socket-guard" and "netns" not in disabled
  want_mount = "mountns" not in disabled
  if is_root and (want_net or want_mount):
    flags = (CLONE_NEWNET if want_net else 0) | (CLONE_NEWNS if want_mount else 0)
    try:
      unshare(flags)
      netns, mountns = want_net, want_mount
    except OSError:
      if want_net:
        try:
          unshare(CLONE_NEWNET)
          netns = True
        except OSError:
          pass
  if network == "netns" and not netns:
    raise OSError("network namespace requested but the kernel refused it")
  report["network"] = "netns" if netns else "socket-guard"

  hidden_done, devices = [], None
  if mountns:
    try:
      mount("none", "/", None, MS_REC | MS_PRIVATE)
    except OSError:
      pass
  if on_namespaces is not None:
    on_namespaces()
  if mountns:
    try:
      for path in world_writable_dirs():
        mount("tmpfs", path, "tmpfs", MS_NOSUID | MS_NODEV, "size=256m,mode=1777")
      staging = os.path.join("/tmp", ".cp_staging")
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
      try:
        devices = _minimal_dev(staging)
      except OSError as e:
        devices = f"host /dev ({e.strerror})"
      os.rmdir(staging)
      report["filesystem"] = "private tmpfs over world-writable dirs; hidden: " + (
          ", ".join(hidden_done) or "none")
    except OSError as e:
      report["filesystem"] = f"partial ({e})"
    report["sockets"] = _hide_socket_dirs(socket_dirs, python_paths())
  else:
    report["filesystem"] = "host (no mount namespace)"
    report["sockets"] = "host socket paths visible (no mount namespace)"
  os.makedirs(sandbox_root, mode=0o711, exist_ok=True)
  os.chmod(sandbox_root, 0o711)

  pidns = False
  if "pidns" in disabled:
    report["pid"] = "process group + uid sweep (pidns disabled)"
  else:
    if is_root or mountns:
      pidns = _probe_unshare(CLONE_NEWPID, check_pid1=True)
    report["pid"] = "pidns per job" if pidns else "process group + uid sweep"
  pidns_fd = os.open("/proc/self/ns/pid", os.O_RDONLY) if pidns else None
  uid = UID_BASE + os.getpid() if is_root and "uid" not in disabled else None
  if uid is not None and not _probe_uid_can_import(uid):
    uid = None
  report["user"] = f"uid {uid}" if uid is not None else f"same uid ({os.geteuid()})"

  jobns = False
  if "jobns" in disabled:
    report["job_fs"] = "shared per-worker tmp dirs (jobns disabled)"
  elif not mountns:
    report["job_fs"] = "shared tmp dirs (no worker mount namespace)"
  else:
    jobns = _probe_unshare(CLONE_NEWNS, mounts=True)
    if jobns:
      report["job_fs"] = ("fresh tmpfs per job: " + ", ".join(JOB_TMP_DIRS) + f"; cwd {JOB_WORKDIR}"
                          "; call jobs: no writable path")
    else:
      report["job_fs"] = "shared per-worker tmp dirs (kernel refused a mount namespace per job)"
  ipcns = False
  if "ipcns" in disabled:
    report["ipc"] = "host IPC namespace (ipcns disabled)"
  elif not is_root:
    report["ipc"] = "host IPC namespace (not root)"
  else:
    ipcns = _probe_unshare(CLONE_NEWIPC)
    report["ipc"] = ("IPC namespace per job" if ipcns
                     else "host IPC namespace (kernel refused CLONE_NEWIPC)")
  seccomp = False
  if "seccomp" in disabled:
    report["seccomp"] = "off (seccomp disabled)"
  else:
    reason = sandbox_seccomp.unavailable_reason() or _probe_seccomp()
    seccomp = reason is None
    report["seccomp"] = (f"deny-list ({len(sandbox_seccomp.build_filter())} BPF instructions); "
                         f"call jobs: allow-list "
                         f"({len(sandbox_seccomp.build_filter(profile='calls'))} instructions)"
                         if seccomp else f"off ({reason})")
  if mountns:
    # Last: every mount read-only and noatime, then the kernel's host-wide views hidden. Without a
    # mount namespace per job, jobs keep the worker's writable tmp dirs (degraded, reported).
    writable = () if jobns else tuple(world_writable_dirs())
    failed = read_only_everywhere(writable)
    views = hide_kernel_views()
    report["metadata"] = (
        f"every mount read-only, noatime; hidden: {', '.join(views) or 'nothing'}; /dev: "
        + (", ".join(devices) if isinstance(devices, list) else str(devices))
        + (f"; NOT read-only: {', '.join(failed)}" if failed else "")
        + (f"; writable: {', '.join(writable)} ("
           + ("jobns disabled)" if "jobns" in disabled else "no mount namespace per job)")
           if writable else ""))
  else:
    report["metadata"] = ("host mounts: reads update access times (" +
                          ("mountns disabled)" if "mountns" in disabled else "no mount namespace)"))
  return report, {"netns": netns, "pidns": pidns, "uid": uid, "jobns": jobns, "ipcns": ipcns,
                  "seccomp": seccomp, "pidns_fd": pidns_fd}


def _hide_socket_dirs(dirs, keep):
  """Covers each socket directory with an empty read-only tmpfs (host sockets unreachable)."""
  hidden, failed = [], []
  for path in sorted({os.path.realpath(d) for d in dirs}, key=len):
    if path in ("/", "/tmp", "/var/tmp", "/dev/shm") or not os.path.isdir(path):
      continue  # World-writable dirs are already fresh tmpfs (and per job with jobns).
    if any(_is_under(path, h) for h in hidden) or any(_is_under(k, path) for k in keep):
      continue
    try:
      mount("tmpfs", path, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,mode=0755")
      hidden.append(path)
    except OSError as e:
      failed.append(f"{path} ({e.strerror})")
  text = "hidden: " + (", ".join(hidden) or "none")
  return text + (f"; NOT hidden: {', '.join(failed)}" if failed else "")


def enter_job_namespaces(flags):
  """In a generic job process (root, PID 1 of its own PID namespace already): fresh mount and IPC
  namespaces, a fresh tmpfs over every JOB_TMP_DIRS entry and an empty work dir."""
  ns = (CLONE_NEWNS if flags["jobns"] else 0) | (CLONE_NEWIPC if flags["ipcns"] else 0)
  if ns:
    unshare(ns)
  if flags["jobns"]:
    for path in JOB_TMP_DIRS:
      if os.path.isdir(path) and not os.path.islink(path):
        mount("tmpfs", path, "tmpfs", MS_NOSUID | MS_NODEV, JOB_TMPFS_OPTIONS)
    os.mkdir(JOB_WORKDIR, 0o700)
    if flags["uid"] is not None:
      os.chown(JOB_WORKDIR, flags["uid"], flags["uid"])


def _probe_seccomp():
  """None when a child can install the filter and still fork; else the reason."""
  r, w = os.pipe()
  pid = os.fork()
  if pid == 0:
    os.close(r)
    try:
      sandbox_seccomp.install()
      inner = os.fork()
      if inner == 0:
        os._exit(0)
      os.waitpid(inner, 0)
      os.write(w, b"ok")
    except BaseException as e:  # pylint: disable=broad-except
      os.write(w, f"{type(e).__name__}: {e}".encode()[:500])
    os._exit(0)
  os.close(w)
  message = os.read(r, 1000).decode(errors="replace")
  os.close(r)
  os.waitpid(pid, 0)
  return None if message == "ok" else (message or "probe died")


def _probe_unshare(flags, check_pid1=False, mounts=False):
  """True when a forked child may unshare `flags` (and mount a tmpfs there / be PID 1)."""
  pid = os.fork()
  if pid == 0:
    try:
      unshare(flags)
      if mounts:
        mount("tmpfs", "/tmp", "tmpfs", MS_NOSUID | MS_NODEV, JOB_TMPFS_OPTIONS)
      if check_pid1:
        inner = os.fork()
        if inner == 0:
          os._exit(0 if os.getpid() == 1 else 1)
        _, status = os.waitpid(inner, 0)
        os._exit(os.waitstatus_to_exitcode(status))
      os._exit(0)
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
      with open(os.path.join(_stdlib_dir(), "os.py"), "rb"):
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
