"""The private network of `python -m tfscale.run`: a network namespace of its own whose only
interface is loopback, entered by the launcher before it starts the ranks (they inherit it).

TensorFlow's gRPC server listens on every interface of its port, whatever address TF_CONFIG
gives, and runs what a connecting client sends; inside this namespace every interface is
loopback, so nothing outside it can connect. Root needs only a new network namespace; any other
user gets it inside a new user namespace that maps the user to itself (same uid and gid, files
written as the user). The ranks then have no network beyond loopback."""

import ctypes
import fcntl
import os
import socket
import struct

from tfscale.errors import UserError

CLONE_NEWNET = 0x40000000
CLONE_NEWUSER = 0x10000000
_SIOCGIFFLAGS = 0x8913
_SIOCSIFFLAGS = 0x8914
_IFF_UP = 0x1
_IFREQ = struct.Struct("16sh22x")  # struct ifreq: the name, then ifr_flags; 40 bytes

# Settings that forbid user namespaces to users other than root: (file, value that forbids, how
# to allow them).
_USERNS_SWITCHES = (
    ("/proc/sys/kernel/apparmor_restrict_unprivileged_userns", "1",
     "AppArmor restricts unprivileged user namespaces (Ubuntu 23.10 and later): allow them with "
     "`sysctl kernel.apparmor_restrict_unprivileged_userns=0` or an AppArmor profile granting "
     "`userns` to this Python"),
    ("/proc/sys/kernel/unprivileged_userns_clone", "0",
     "unprivileged user namespaces are off: `sysctl kernel.unprivileged_userns_clone=1`"),
    ("/proc/sys/user/max_user_namespaces", "0",
     "user namespaces are off: `sysctl user.max_user_namespaces=15000`"),
)


class NamespaceUnavailable(UserError):
    """The private network namespace could not be made; the message says why and how to allow
    it."""


def enter_private_network():
    """Moves this process into a new network namespace with only `lo`, brought up. Call it in a
    process with one thread (a user namespace cannot be entered by a threaded process): the
    launcher calls it in a process it forks for the purpose.

    Raises:
        NamespaceUnavailable: the kernel or the container refused one of the steps.
    """
    root = os.geteuid() == 0
    uid, gid = os.geteuid(), os.getegid()
    step = "unshare"
    try:
        _unshare(CLONE_NEWNET if root else CLONE_NEWUSER | CLONE_NEWNET)
        if not root:
            for step, path, text in (("setgroups", "/proc/self/setgroups", "deny"),
                                     ("uid_map", "/proc/self/uid_map", f"{uid} {uid} 1"),
                                     ("gid_map", "/proc/self/gid_map", f"{gid} {gid} 1")):
                with open(path, "w", encoding="ascii") as file:
                    file.write(text)
        step = "bringing up lo"
        _bring_up("lo")
    except OSError as error:
        raise NamespaceUnavailable(
            f"cannot make a private network namespace for the ranks ({step}: "
            f"{os.strerror(error.errno) if error.errno else error}): {_how_to_allow(root)}"
        ) from None


def _unshare(flags):
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(flags) != 0:
        number = ctypes.get_errno()
        raise OSError(number, os.strerror(number))


def _bring_up(interface):
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        request = _IFREQ.pack(interface.encode(), 0)
        flags = _IFREQ.unpack(fcntl.ioctl(probe, _SIOCGIFFLAGS, request))[1]
        fcntl.ioctl(probe, _SIOCSIFFLAGS, _IFREQ.pack(interface.encode(), flags | _IFF_UP))


def _how_to_allow(root):
    """What allows a network namespace on this machine, as far as its settings tell."""
    if root:
        return ("this process lacks CAP_SYS_ADMIN (in a container: start it with "
                "`--cap-add=SYS_ADMIN`, or a seccomp profile that allows unshare)")
    for path, forbidding, advice in _USERNS_SWITCHES:
        try:
            with open(path, encoding="ascii") as file:
                if file.read().strip() == forbidding:
                    return advice
        except OSError:
            continue
    return ("user namespaces are not allowed here (in a container: one without CAP_SYS_ADMIN, "
            "or a seccomp profile that blocks unshare)")
