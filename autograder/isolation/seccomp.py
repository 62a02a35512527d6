"""The system-call filter every sandbox gets (classic BPF, handed to bwrap with `--seccomp FD`).

Why a filter at all: the sandbox's processes run as a plain unprivileged uid in the machine's
own user namespace (so that their files and processes belong to a uid no other sandbox has, see
`sandbox`). An unprivileged uid may normally create user namespaces, and a few kernel interfaces
outlive a sandbox or are shared by uid. The filter closes exactly those, like Docker's default
profile does:

- new user namespaces (`unshare`/`clone` with CLONE_NEWUSER): EPERM; `clone3` (its flags are
  behind a pointer a filter cannot read): ENOSYS, so libc falls back to `clone`;
- kernel keyrings (`add_key`, `keyctl`, `request_key`): a uid's keyring would outlive the
  sandbox and reach the next submission graded with the same uid;
- `bpf`, `perf_event_open`, `userfaultfd`: kernel attack surface no lab needs;
- any other architecture's system calls (i386, x32 on x86-64): the process is killed;
- in the ranks the grader starts for a distributed test (`filter_program(unix_sockets=False)`,
  autograder.grading.rank_pool), every new socket but an IPv4 or IPv6 one (and netlink's route
  family, NETLINK_ROUTE, which getaddrinfo reads and which carries nothing from one user process
  to another): EPERM. Those sandboxes share one network namespace, and with it what other
  families name in it: abstract Unix sockets, NETLINK_USERSOCK ports (a message from one uid to
  another: tried), and families whose loopback bypasses the interface whose bytes the grader
  counts (SMC-D's, vsock's). Sockets, not addresses, are refused (a filter cannot read a sockaddr
  behind a pointer); gloo and torch.distributed's TCPStore use TCP only, and the observer's
  channel is inherited already open.

A second filter (`forbid_exec`), which the student's process installs on itself once it is up
and before any of the student's code runs: `execve`/`execveat` fail with EPERM, in that process,
its threads and every child it forks. No new interpreter (`python -c`, a spawned process pool, a
shell) can start without the grader's observer (autograder.grading.observe); nothing a lab grades
execs (torch.compile's C++ compiler and the fresh-process export demo run only in the GPU profile
or in `skip-grading` cells, which the grader does not run), and code that tries gets an OSError.
"""
from __future__ import annotations

import ctypes
import errno
import platform
import struct

CLONE_NEWUSER = 0x10000000
RET_ALLOW = 0x7FFF0000
RET_KILL_PROCESS = 0x80000000
X32_SYSCALL_BIT = 0x40000000

# architecture -> (AUDIT_ARCH value, {call name: number})
_ARCHES = {
    "x86_64": (0xC000003E, {"unshare": 272, "clone": 56, "clone3": 435, "add_key": 248, "request_key": 249,
                            "keyctl": 250, "bpf": 321, "perf_event_open": 298, "userfaultfd": 323,
                            "execve": 59, "execveat": 322, "seccomp": 317, "socket": 41}),
    "aarch64": (0xC00000B7, {"unshare": 97, "clone": 220, "clone3": 435, "add_key": 217, "request_key": 218,
                             "keyctl": 219, "bpf": 280, "perf_event_open": 241, "userfaultfd": 282,
                             "execve": 221, "execveat": 281, "seccomp": 277, "socket": 198}),
}
DENIED = ("add_key", "request_key", "keyctl", "bpf", "perf_event_open", "userfaultfd")
NO_NEW_USER_NAMESPACE = ("unshare", "clone")   # flags in the first argument
AF_UNIX, AF_INET, AF_INET6, AF_NETLINK, NETLINK_ROUTE = 1, 2, 10, 16, 0


def _stmt(code: int, k: int, jt: int = 0, jf: int = 0) -> bytes:
    return struct.pack("=HBBI", code, jt, jf, k)


LD_ABS, JEQ, JGE, JSET, RET = 0x20, 0x15, 0x35, 0x45, 0x06


def _errno(code: int) -> int:
    return 0x00050000 | code


def supported() -> bool:
    return platform.machine() in _ARCHES


def filter_program(machine: str | None = None, unix_sockets: bool = True) -> bytes:
    """The BPF program (bytes of `struct sock_filter`) for this machine's architecture;
    `unix_sockets` False (a rank's sandbox): `socket()` refused too, but for AF_INET, AF_INET6 and
    AF_NETLINK with NETLINK_ROUTE."""
    arch, calls = _ARCHES[machine or platform.machine()]
    prog = [_stmt(LD_ABS, 4),                          # seccomp_data.arch
            _stmt(JEQ, arch, jt=1),
            _stmt(RET, RET_KILL_PROCESS),
            _stmt(LD_ABS, 0)]                          # seccomp_data.nr
    if arch == _ARCHES["x86_64"][0]:
        prog += [_stmt(JGE, X32_SYSCALL_BIT, jf=1), _stmt(RET, RET_KILL_PROCESS)]
    for name in DENIED:
        prog += [_stmt(JEQ, calls[name], jf=1), _stmt(RET, _errno(errno.EPERM))]
    prog += [_stmt(JEQ, calls["clone3"], jf=1), _stmt(RET, _errno(errno.ENOSYS))]
    for name in NO_NEW_USER_NAMESPACE:
        prog += [_stmt(JEQ, calls[name], jf=4),
                 _stmt(LD_ABS, 16),                    # low 32 bits of the first argument (flags)
                 _stmt(JSET, CLONE_NEWUSER, jf=1),
                 _stmt(RET, _errno(errno.EPERM)),
                 _stmt(RET, RET_ALLOW)]
    if not unix_sockets:
        prog += [_stmt(JEQ, calls["socket"], jf=8),
                 _stmt(LD_ABS, 16),                    # low 32 bits of the first argument (the domain)
                 _stmt(JEQ, AF_INET, jt=5),
                 _stmt(JEQ, AF_INET6, jt=4),
                 _stmt(JEQ, AF_NETLINK, jf=2),
                 _stmt(LD_ABS, 32),                    # low 32 bits of the third argument (the protocol)
                 _stmt(JEQ, NETLINK_ROUTE, jt=1),
                 _stmt(RET, _errno(errno.EPERM)),
                 _stmt(RET, RET_ALLOW)]
    prog.append(_stmt(RET, RET_ALLOW))
    return b"".join(prog)


EXEC = ("execve", "execveat")
PR_SET_NO_NEW_PRIVS = 38
SECCOMP_SET_MODE_FILTER = 1
SECCOMP_FILTER_FLAG_TSYNC = 1


def no_exec_program(machine: str | None = None) -> bytes:
    """The BPF program refusing execve and execveat (EPERM); everything else passes to the
    sandbox's own filter, which the kernel still applies."""
    arch, calls = _ARCHES[machine or platform.machine()]
    prog = [_stmt(LD_ABS, 4), _stmt(JEQ, arch, jt=1), _stmt(RET, RET_KILL_PROCESS), _stmt(LD_ABS, 0)]
    if arch == _ARCHES["x86_64"][0]:   # x32's execve (also outside the bwrap sandbox)
        prog += [_stmt(JGE, X32_SYSCALL_BIT, jf=1), _stmt(RET, RET_KILL_PROCESS)]
    for name in EXEC:
        prog += [_stmt(JEQ, calls[name], jf=1), _stmt(RET, _errno(errno.EPERM))]
    prog.append(_stmt(RET, RET_ALLOW))
    return b"".join(prog)


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_char_p)]


def forbid_exec() -> None:
    """Install `no_exec_program` on this process and all its threads (TSYNC), for good: filters
    cannot be removed, and children inherit them. Raises OSError where the kernel refuses."""
    program = no_exec_program()
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS) failed")
    fprog = _SockFprog(len(program) // 8, program)
    number = _ARCHES[platform.machine()][1]["seccomp"]
    if libc.syscall(number, SECCOMP_SET_MODE_FILTER, SECCOMP_FILTER_FLAG_TSYNC, ctypes.byref(fprog)) != 0:
        raise OSError(ctypes.get_errno(), "seccomp(SECCOMP_SET_MODE_FILTER) failed")
