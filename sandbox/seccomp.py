"""A small seccomp-BPF deny list for sandboxed code (x86_64 only), loaded by bwrap `--seccomp`.

It refuses (EPERM) the system calls untrusted code has no use for and that widen the kernel
attack surface: ptrace and cross-process memory access, keyrings, bpf, userfaultfd,
perf_event_open, module loading, kexec, mounts and namespace changes, io_uring, clock and
system changes, modify_ldt, and AF_VSOCK sockets. `clone3` answers ENOSYS so libc falls back to `clone`, which bwrap's
`--disable-userns` and the missing capabilities already restrict. The x32 ABI is refused whole.
On other architectures `program()` returns None and no filter is loaded (reported on /health).
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import struct

_AUDIT_ARCH_X86_64 = 0xC000003E
_X32_BIT = 0x40000000

# x86_64 numbers (arch/x86/entry/syscalls/syscall_64.tbl)
_DENY_X86_64 = {
    "ptrace": 101, "syslog": 103, "uselib": 134, "ustat": 136, "sysfs": 139, "vhangup": 153,
    "modify_ldt": 154, "pivot_root": 155, "_sysctl": 156, "adjtimex": 159, "chroot": 161, "acct": 163,
    "settimeofday": 164, "mount": 165, "umount2": 166, "swapon": 167, "swapoff": 168,
    "reboot": 169, "iopl": 172, "ioperm": 173, "init_module": 175, "delete_module": 176,
    "quotactl": 179, "nfsservctl": 180, "lookup_dcookie": 212, "clock_settime": 227,
    "kexec_load": 246, "add_key": 248, "request_key": 249, "keyctl": 250, "unshare": 272,
    "perf_event_open": 298, "name_to_handle_at": 303, "open_by_handle_at": 304,
    "clock_adjtime": 305, "setns": 308, "process_vm_readv": 310, "process_vm_writev": 311,
    "kcmp": 312, "finit_module": 313, "kexec_file_load": 320, "bpf": 321, "userfaultfd": 323,
    "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427, "open_tree": 428,
    "move_mount": 429, "fsopen": 430, "fsconfig": 431, "fsmount": 432, "fspick": 433,
    "pidfd_getfd": 438, "process_madvise": 440, "mount_setattr": 442, "quotactl_fd": 443,
}  # fmt: skip
_CLONE3_X86_64 = 435
_SOCKET_X86_64 = 41
_AF_VSOCK = 40

# classic BPF opcodes
_LD_W_ABS = 0x20
_JEQ_K = 0x15
_JGE_K = 0x35
_RET_K = 0x06
_RET_ALLOW = 0x7FFF0000
_RET_KILL_PROCESS = 0x80000000
_RET_ERRNO = 0x00050000


def _insn(code: int, k: int, jt: int = 0, jf: int = 0) -> bytes:
    return struct.pack("=HBBI", code, jt, jf, k)


def program() -> bytes | None:
    """The compiled filter (an array of `struct sock_filter`), or None on an unsupported arch."""
    if platform.machine() != "x86_64":
        return None
    deny_eperm = _RET_ERRNO | errno.EPERM
    out = [
        _insn(_LD_W_ABS, 4),  # seccomp_data.arch
        _insn(_JEQ_K, _AUDIT_ARCH_X86_64, jt=1),
        _insn(_RET_K, _RET_KILL_PROCESS),
        _insn(_LD_W_ABS, 0),  # seccomp_data.nr
        _insn(_JGE_K, _X32_BIT, jf=1),
        _insn(_RET_K, deny_eperm),
        _insn(_JEQ_K, _CLONE3_X86_64, jf=1),
        _insn(_RET_K, _RET_ERRNO | errno.ENOSYS),
        # socket(AF_VSOCK, ...): the host's hypervisor sockets are no business of the code
        _insn(_JEQ_K, _SOCKET_X86_64, jf=3),
        _insn(_LD_W_ABS, 16),  # seccomp_data.args[0], low 32 bits
        _insn(_JEQ_K, _AF_VSOCK, jf=1),
        _insn(_RET_K, _RET_ERRNO | errno.EAFNOSUPPORT),
        _insn(_LD_W_ABS, 0),  # the syscall number again
    ]
    for nr in sorted(set(_DENY_X86_64.values())):
        out += [_insn(_JEQ_K, nr, jf=1), _insn(_RET_K, deny_eperm)]
    out.append(_insn(_RET_K, _RET_ALLOW))
    return b"".join(out)


def program_fd(prog: bytes) -> int:
    """A readable fd holding `prog` at offset 0 (bwrap reads the filter from it)."""
    fd = os.memfd_create("agentrl-seccomp", 0)
    os.write(fd, prog)
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def fprog(prog: bytes) -> ctypes.pointer:
    """A `struct sock_fprog *` for prctl(PR_SET_SECCOMP) (the buffer is kept alive with it)."""
    buf = ctypes.create_string_buffer(prog, len(prog))
    p = ctypes.pointer(_SockFprog(len(prog) // 8, ctypes.addressof(buf)))
    p._buf = buf  # type: ignore[attr-defined]
    return p


def denied_syscalls() -> list[str]:
    return sorted(_DENY_X86_64) + ["clone3 (ENOSYS)"] if platform.machine() == "x86_64" else []
