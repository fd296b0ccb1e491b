"""Seccomp filters for sandbox jobs, built as classic BPF with ctypes + prctl (stdlib only).

Installed in the job process after its namespaces, uid drop and rlimits, just before the
program runs; it cannot be removed and is inherited by every child. Two profiles:

"calls" (restricted call jobs, `sandbox_runtime.py`): an ALLOW-list. Only reading and writing
already open descriptors, memory management, signals of the process itself, clocks, getrandom,
futex and exit pass; everything else fails with EPERM: no open, stat, socket, process, thread,
namespace, mount, IPC or ptrace call exists for the program at all.

"generic" (plain `Job`s: evaluation programs with the whole stdlib): a deny-list. Denied calls fail
with EPERM (clone3 with ENOSYS, so libc falls back to clone, whose flags the filter can inspect):

- namespaces: unshare, setns, clone with any CLONE_NEW* flag (no user namespace, no escape
  from the job's PID/mount/IPC namespaces);
- mounts and roots: mount, umount2, pivot_root, chroot, the new mount API (fsopen, ...);
- other processes' memory and the kernel: ptrace, process_vm_readv/writev, bpf,
  perf_event_open, userfaultfd, io_uring, keyrings, module and kexec loading, reboot, swap,
  acct, syslog, quotactl, open_by_handle_at, personality;
- sockets other than AF_INET/AF_INET6 (no unix socket to the host, no netlink, no packet
  sockets) and socketpair. Inet sockets are harmless inside the empty network namespace;
- ways to watch or mark files that other jobs can see without writing them: inotify, fanotify,
  flock and fcntl locks, leases and dnotify, and page-cache probes (mincore, cachestat,
  preadv2/pwritev2 with RWF_NOWAIT); and sysinfo (host-wide load, memory and process counts).

This file is imported by `sandbox_worker.py`, a plain script: it must not import the package.
"""
import ctypes
import errno
import os
import struct

PR_SET_NO_NEW_PRIVS = 38
PR_SET_SECCOMP = 22
SECCOMP_MODE_FILTER = 2
_RET_ALLOW = 0x7FFF0000
_RET_ERRNO = 0x00050000
_RET_KILL_PROCESS = 0x80000000
_NS_FLAGS = 0x7E020080  # CLONE_NEWNS|NEWCGROUP|NEWUTS|NEWIPC|NEWUSER|NEWPID|NEWNET|NEWTIME
_AF_INET, _AF_INET6 = 2, 10

_DENIED = ("unshare", "setns", "mount", "umount2", "pivot_root", "chroot", "ptrace",
           "process_vm_readv", "process_vm_writev", "bpf", "perf_event_open", "keyctl", "add_key",
           "request_key", "userfaultfd", "io_uring_setup", "io_uring_enter", "io_uring_register",
           "kexec_load", "kexec_file_load", "init_module", "finit_module", "delete_module",
           "reboot", "swapon", "swapoff", "acct", "socketpair", "fsopen", "fsconfig", "fsmount",
           "fspick", "open_tree", "move_mount", "mount_setattr", "name_to_handle_at",
           "open_by_handle_at", "personality", "syslog", "quotactl", "vhangup", "inotify_init",
           "inotify_init1", "fanotify_init", "flock", "mincore", "cachestat", "preadv2",
           "pwritev2", "sysinfo")
# fcntl commands that lock, lease or watch a file (F_SETLK, F_SETLKW, F_OFD_SETLK, F_OFD_SETLKW,
# F_SETLEASE, F_NOTIFY); the same numbers on every Linux architecture.
_FCNTL_DENIED = (6, 7, 37, 38, 1024, 1026)
# The "calls" profile's allow-list.
_CALLS_ALLOWED = ("read", "write", "readv", "writev", "close", "fstat", "lseek", "mmap", "mprotect",
                  "munmap", "brk", "mremap", "madvise", "rt_sigaction", "rt_sigprocmask",
                  "rt_sigreturn", "sigaltstack", "getpid", "gettid", "getuid", "geteuid", "getgid",
                  "getegid", "getrandom", "futex", "sched_yield", "clock_gettime", "clock_getres",
                  "gettimeofday", "restart_syscall", "prlimit64", "exit", "exit_group")
PROFILES = ("generic", "calls")

# (AUDIT_ARCH, syscall numbers); from asm/unistd_64.h and asm-generic/unistd.h.
_ARCHES = {
    "x86_64": (0xC000003E, dict(
        unshare=272, setns=308, clone=56, clone3=435, mount=165, umount2=166, pivot_root=155,
        chroot=161, ptrace=101, process_vm_readv=310, process_vm_writev=311, bpf=321,
        perf_event_open=298, keyctl=250, add_key=248, request_key=249, userfaultfd=323,
        io_uring_setup=425, io_uring_enter=426, io_uring_register=427, kexec_load=246,
        kexec_file_load=320, init_module=175, finit_module=313, delete_module=176, reboot=169,
        swapon=167, swapoff=168, acct=163, socket=41, socketpair=53, fsopen=430, fsconfig=431,
        fsmount=432, fspick=433, open_tree=428, move_mount=429, mount_setattr=442,
        name_to_handle_at=303, open_by_handle_at=304, personality=135, syslog=103, quotactl=179,
        vhangup=153, inotify_init=253, inotify_init1=294, fanotify_init=300, flock=73, mincore=27,
        cachestat=451, preadv2=327, pwritev2=328, fcntl=72, read=0, write=1, readv=19, writev=20,
        close=3, fstat=5, lseek=8, mmap=9, mprotect=10, munmap=11, brk=12, mremap=25, madvise=28,
        rt_sigaction=13, rt_sigprocmask=14, rt_sigreturn=15, sigaltstack=131, getpid=39, gettid=186,
        getuid=102, geteuid=107, getgid=104, getegid=108, getrandom=318, futex=202, sched_yield=24,
        clock_gettime=228, clock_getres=229, gettimeofday=96, restart_syscall=219, prlimit64=302,
        exit=60, exit_group=231, sysinfo=99)),
    "aarch64": (0xC00000B7, dict(
        unshare=97, setns=268, clone=220, clone3=435, mount=40, umount2=39, pivot_root=41,
        chroot=51, ptrace=117, process_vm_readv=270, process_vm_writev=271, bpf=280,
        perf_event_open=241, keyctl=219, add_key=217, request_key=218, userfaultfd=282,
        io_uring_setup=425, io_uring_enter=426, io_uring_register=427, kexec_load=104,
        kexec_file_load=294, init_module=105, finit_module=273, delete_module=106, reboot=142,
        swapon=224, swapoff=225, acct=89, socket=198, socketpair=199, fsopen=430, fsconfig=431,
        fsmount=432, fspick=433, open_tree=428, move_mount=429, mount_setattr=442,
        name_to_handle_at=264, open_by_handle_at=265, personality=92, syslog=116, quotactl=60,
        vhangup=58, inotify_init=None, inotify_init1=26, fanotify_init=262, flock=32, mincore=232,
        cachestat=451, preadv2=286, pwritev2=287, fcntl=25, read=63, write=64, readv=65, writev=66,
        close=57, fstat=80, lseek=62, mmap=222, mprotect=226, munmap=215, brk=214, mremap=216,
        madvise=233, rt_sigaction=134, rt_sigprocmask=135, rt_sigreturn=139, sigaltstack=132,
        getpid=172, gettid=178, getuid=174, geteuid=175, getegid=177, getgid=176, getrandom=278,
        futex=98, sched_yield=124, clock_gettime=113, clock_getres=114, gettimeofday=169,
        restart_syscall=128, prlimit64=261, exit=93, exit_group=94, sysinfo=179)),
}

# Classic BPF opcodes.
_LD_W_ABS, _JEQ, _JGE, _JSET, _RET = 0x20, 0x15, 0x35, 0x45, 0x06
_NR, _ARCH, _ARG0, _ARG1 = 0, 4, 16, 24  # offsets in struct seccomp_data (low words, little endian)


def _machine():
  return os.uname().machine  # (not the platform module: the zygote stays small)


class _SockFprog(ctypes.Structure):
  _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def unavailable_reason():
  """None when a filter can be built for this machine, else why not."""
  if _machine() not in _ARCHES:
    return f"no syscall table for {_machine()}"
  if struct.pack("=I", 1) != struct.pack("<I", 1):
    return "big-endian machine"
  return None


def build_filter(machine=None, profile="generic"):
  """The BPF program as a list of (code, jt, jf, k); labels are resolved here."""
  if profile not in PROFILES:
    raise ValueError(f"seccomp profile must be one of {PROFILES}, got {profile!r}")
  arch, nrs = _ARCHES[machine or _machine()]
  deny = _RET_ERRNO | errno.EPERM
  prog = [("ld", _ARCH), ("jeq", arch, None, "kill"), ("ld", _NR)]
  if arch == 0xC000003E:
    prog.append(("jge", 0x40000000, "deny", None))  # x32 ABI numbers alias the checks below.
  if profile == "calls":
    for name in _CALLS_ALLOWED:
      prog.append(("jeq", nrs[name], "allow", None))
    prog += [("label", "deny"), ("ret", deny),
             ("label", "allow"), ("ret", _RET_ALLOW),
             ("label", "kill"), ("ret", _RET_KILL_PROCESS)]
    return _assemble(prog)
  prog.append(("jeq", nrs["clone3"], "enosys", None))
  prog.append(("jeq", nrs["clone"], "clone", None))
  prog.append(("jeq", nrs["socket"], "socket", None))
  prog.append(("jeq", nrs["fcntl"], "fcntl", None))
  for name in _DENIED:
    if nrs[name] is not None:
      prog.append(("jeq", nrs[name], "deny", None))
  prog += [("ret", _RET_ALLOW),
           ("label", "clone"), ("ld", _ARG0), ("jset", _NS_FLAGS, "deny", None),
           ("ret", _RET_ALLOW),
           ("label", "fcntl"), ("ld", _ARG1)]
  prog += [("jeq", cmd, "deny", None) for cmd in _FCNTL_DENIED]
  prog += [("ret", _RET_ALLOW),
           ("label", "socket"), ("ld", _ARG0), ("jeq", _AF_INET, "allow", None),
           ("jeq", _AF_INET6, "allow", None),
           ("label", "deny"), ("ret", deny),
           ("label", "allow"), ("ret", _RET_ALLOW),
           ("label", "enosys"), ("ret", _RET_ERRNO | errno.ENOSYS),
           ("label", "kill"), ("ret", _RET_KILL_PROCESS)]
  return _assemble(prog)


def _assemble(prog):
  """Resolves labels into relative jumps."""
  labels, index = {}, 0
  for ins in prog:
    if ins[0] == "label":
      labels[ins[1]] = index
    else:
      index += 1
  out, pc = [], 0
  rel = lambda target: 0 if target is None else labels[target] - pc - 1
  for ins in prog:
    if ins[0] == "label":
      continue
    op = ins[0]
    if op == "ld":
      out.append((_LD_W_ABS, 0, 0, ins[1]))
    elif op == "ret":
      out.append((_RET, 0, 0, ins[1]))
    else:
      code = {"jeq": _JEQ, "jge": _JGE, "jset": _JSET}[op]
      jt, jf = rel(ins[2]), rel(ins[3])
      assert 0 <= jt < 256 and 0 <= jf < 256, "BPF jump out of range"
      out.append((code, jt, jf, ins[1]))
    pc += 1
  return out


_prepared = {}


def prepare(profile="generic"):
  """Builds the filter and the prctl binding once (before any job), returning both."""
  if profile not in _prepared:
    reason = unavailable_reason()
    if reason:
      raise OSError(errno.ENOSYS, reason)
    program = build_filter(profile=profile)
    raw = b"".join(struct.pack("=HBBI", *ins) for ins in program)
    buffer = ctypes.create_string_buffer(raw, len(raw))
    fprog = _SockFprog(len(program), ctypes.cast(buffer, ctypes.c_void_p))
    libc = ctypes.CDLL(None, use_errno=True)
    prctl = libc.prctl
    prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong,
                      ctypes.c_ulong]
    _prepared[profile] = (prctl, fprog, buffer)
  return _prepared[profile]


def install(profile="generic"):
  """Sets no_new_privs and installs the filter on the calling thread; raises OSError on failure."""
  prctl, fprog, _ = prepare(profile)
  if prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
    raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS)")
  if prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.addressof(fprog), 0, 0) != 0:
    raise OSError(ctypes.get_errno(), "prctl(PR_SET_SECCOMP)")
