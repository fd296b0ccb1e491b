"""The seccomp deny-list: the BPF program's shape, and what it denies in a real child process."""
import ctypes
import errno
import os
import platform
import socket

import pytest

from compassplay_jax.verifiers import sandbox_seccomp


@pytest.mark.parametrize("machine", ["x86_64", "aarch64"])
def test_filter_is_well_formed(machine):
  program = sandbox_seccomp.build_filter(machine)
  assert 10 < len(program) < 256
  for code, jt, jf, _ in program:
    assert 0 <= jt < 256 and 0 <= jf < 256 and code in (0x20, 0x15, 0x35, 0x45, 0x06)
  assert program[-1] == (0x06, 0, 0, 0x80000000)  # Wrong architecture: kill the process.
  arch = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}[machine]
  assert program[1][3] == arch


def _in_filtered_child(check):
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
      sandbox_seccomp.install()
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
