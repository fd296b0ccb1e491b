"""The seccomp filters: the BPF programs' shape, and what each profile denies in a real child process.

"generic" (plain jobs) is a deny-list; "calls" (restricted call jobs, issue 23) an allow-list under
which no file, socket, process or metadata call exists at all.
"""
import ctypes
import errno
import os
import platform
import socket

import pytest

from compassplay_jax.verifiers import sandbox_seccomp


@pytest.mark.parametrize("profile", sandbox_seccomp.PROFILES)
@pytest.mark.parametrize("machine", ["x86_64", "aarch64"])
def test_filter_is_well_formed(machine, profile):
  program = sandbox_seccomp.build_filter(machine, profile)
  assert 10 < len(program) < 256
  for code, jt, jf, _ in program:
    assert 0 <= jt < 256 and 0 <= jf < 256 and code in (0x20, 0x15, 0x35, 0x45, 0x06)
  assert program[-1] == (0x06, 0, 0, 0x80000000)  # Wrong architecture: kill the process.
  arch = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}[machine]
  assert program[1][3] == arch


def _in_filtered_child(check, profile="generic"):
  """Runs check() in a forked child under the filter (as an unprivileged uid when root)."""
  r, w = os.pipe()
  pid = os.fork()
  if pid == 0:
    os.close(r)
    try:
      if os.geteuid() == 0:
        os.setgroups([])
        os.setgid(199999)
        os.setuid(199999)
      sandbox_seccomp.install(profile)
      os.write(w, repr(check()).encode())
    except BaseException as e:  # pylint: disable=broad-except
      os.write(w, f"raised {type(e).__name__}: {e}".encode())
    os._exit(0)
  os.close(w)
  out = b""
  while chunk := os.read(r, 4096):
    out += chunk
  os.close(r)
  os.waitpid(pid, 0)
  return out.decode()


@pytest.mark.skipif(sandbox_seccomp.unavailable_reason() is not None,
                    reason=f"no seccomp filter for {platform.machine()}")
def test_filter_denies_namespaces_and_unix_sockets_but_allows_ordinary_work():
  def check():
    libc = ctypes.CDLL(None, use_errno=True)
    out = {"userns": libc.unshare(0x10000000), "userns_errno": ctypes.get_errno()}
    try:
      socket.socket(socket.AF_UNIX)
      out["unix"] = "allowed"
    except OSError as e:
      out["unix"] = e.errno
    socket.socket(socket.AF_INET).close()
    child = os.fork()
    if child == 0:
      os._exit(7)
    out["fork"] = os.waitstatus_to_exitcode(os.waitpid(child, 0)[1])
    return out
  result = _in_filtered_child(check)
  assert result == repr({"userns": -1, "userns_errno": errno.EPERM, "unix": errno.EPERM,
                         "fork": 7}), result


def _errno_of(call):
  try:
    call()
    return "allowed"
  except OSError as e:
    return e.errno


@pytest.mark.skipif(sandbox_seccomp.unavailable_reason() is not None,
                    reason=f"no seccomp filter for {platform.machine()}")
def test_generic_filter_denies_ways_to_watch_or_mark_files():
  """Issue 23 item 3: no inotify/fanotify watch, lock, lease or page-cache probe (a concurrent job
  could see them), no host-wide counters (sysinfo), while reading files still works."""
  def check():
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open("/etc/hostname" if os.path.exists("/etc/hostname") else "/etc/passwd", os.O_RDONLY)
    out = {"read": len(os.read(fd, 1)) == 1}
    out["inotify"] = (libc.inotify_init1(0), ctypes.get_errno())
    out["flock"] = (libc.flock(fd, 2 | 4), ctypes.get_errno())  # LOCK_EX | LOCK_NB
    out["fcntl_lock"] = _errno_of(lambda: __import__("fcntl").lockf(fd, 1 | 4))
    out["cachestat"] = (libc.syscall(451 if platform.machine() in ("x86_64", "aarch64") else -1,
                                     fd, 0, 0, 0), ctypes.get_errno())
    out["preadv2"] = _errno_of(lambda: os.preadv(fd, [bytearray(1)], 0, os.RWF_NOWAIT))
    out["sysinfo"] = (libc.sysinfo(ctypes.create_string_buffer(256)), ctypes.get_errno())
    return out
  result = _in_filtered_child(check)
  denied = (-1, errno.EPERM)
  assert result == repr({"read": True, "inotify": denied, "flock": denied,
                         "fcntl_lock": errno.EPERM, "cachestat": denied,
                         "preadv2": errno.EPERM, "sysinfo": denied}), result


@pytest.mark.skipif(sandbox_seccomp.unavailable_reason() is not None,
                    reason=f"no seccomp filter for {platform.machine()}")
def test_calls_filter_leaves_only_computation():
  """The call-job allow-list: computing, printing and allocating work; opening, listing, stat-ing,
  sockets, processes, signals to others and descriptor games do not."""
  def check():
    import json, re  # pylint: disable=import-outside-toplevel,multiple-imports
    out = {"compute": (json.dumps([1]), re.sub("a", "b", "aa"), len(bytearray(1 << 22)))}
    for name, call in [("open", lambda: open("/etc/passwd", "rb")),
                       ("stat", lambda: os.stat("/")), ("listdir", lambda: os.listdir("/")),
                       ("socket", lambda: socket.socket(socket.AF_INET)),
                       ("fork", os.fork), ("kill", lambda: os.kill(1, 0)),
                       ("dup2", lambda: os.dup2(1, 9)), ("pipe", os.pipe),
                       ("write", lambda: os.write(1, b""))]:
      out[name] = _errno_of(call)
    return out
  result = _in_filtered_child(check, "calls")
  eperm = errno.EPERM
  assert result == repr({"compute": ('[1]', 'bb', 1 << 22), "open": eperm, "stat": eperm,
                         "listdir": eperm, "socket": eperm, "fork": eperm, "kill": eperm,
                         "dup2": eperm, "pipe": eperm, "write": "allowed"}), result
