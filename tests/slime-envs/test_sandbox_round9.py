"""Hostile code, ninth pass (issue 27: "a fresh hostile pass finds nothing new"): kernel objects that hold the host's
memory or disk past every per-run limit without a descriptor or an address space to count them. Each was measured
here before the fix (numbers in the cases); every case first switches the in-process guard off, and the attacks run
at a scale the host shrugs off, so a regression fails on what the kernel answers, not on the host's health."""

import os

import pytest
from slime_sandbox_hostile import hostile

from slime_envs import sandbox

pytestmark = pytest.mark.usefixtures("host_survives_and_nothing_leaks")


async def test_fallocate_cannot_take_the_hosts_disk_through_the_output_file():
    # The code's stdout is a file on the host's disk. fallocate(FALLOC_FL_KEEP_SIZE) allocates blocks past its end
    # without changing its size, which RLIMIT_FSIZE does not check: 2 GiB of the host's disk in one call with
    # max_output_bytes = 1 MiB (the whole free disk was as easy). glibc's posix_fallocate must still work where
    # the limits allow it (it falls back to writing on EOPNOTSUPP).
    code = """
        import ctypes, errno, os, sys
        libc = ctypes.CDLL(None, use_errno=True)
        libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_long, ctypes.c_long]
        for fd in (1, 2):
            for mode in (0, 1, 0x20):  # plain, FALLOC_FL_KEEP_SIZE, FALLOC_FL_INSERT_RANGE
                rc = libc.fallocate(fd, mode, 0, 64 << 20)
                print(fd, mode, rc, os.strerror(ctypes.get_errno()) if rc else "")
            print(fd, "KiB on disk", os.fstat(fd).st_blocks // 2)
        with open("scratch", "w+b") as f:
            os.posix_fallocate(f.fileno(), 0, 1 << 20)  # inside the limits: glibc writes zeros instead
            print("scratch", os.fstat(f.fileno()).st_size)
            try:
                os.posix_fallocate(f.fileno(), 0, 64 << 20)  # past RLIMIT_FSIZE
            except OSError as e:
                print("past the limit", errno.errorcode[e.errno])
    """
    r = await hostile(code, max_output_bytes=1 << 20)
    lines = r.stdout.splitlines()
    assert lines[:8] == [
        "1 0 -1 Operation not supported",
        "1 1 -1 Operation not supported",  # was 0, and 2 GiB on the host's disk with 2 << 30
        "1 32 -1 Operation not supported",
        lines[3],
        "2 0 -1 Operation not supported",
        "2 1 -1 Operation not supported",
        "2 32 -1 Operation not supported",
        lines[7],
    ], r.stdout + r.stderr
    for line in (lines[3], lines[7]):
        assert int(line.split()[-1]) <= 64, line  # what was printed so far, not 64 MiB
    assert lines[8:] == ["scratch 1048576", "past the limit EFBIG"], r.stdout + r.stderr


async def test_system_v_semaphores_and_message_queues_are_refused(monkeypatch):
    # Without a memory cgroup, 400 semaphore sets of 32,000 (3.5 MiB of kernel memory each, no descriptor, no
    # mapping) held 1.4 GB in 3 s with memory_mb=256, and an IPC namespace allows 32,000 sets; message queues
    # hold 16 KiB each, 32,000 of them. shmget was already refused for the same reason.
    monkeypatch.setattr(sandbox.CgroupLimits, "create", classmethod(lambda cls, **kwargs: None))
    code = """
        import ctypes, errno
        libc = ctypes.CDLL(None, use_errno=True)
        calls = {"semget": lambda: libc.semget(0, 32000, 0o1600), "msgget": lambda: libc.msgget(0, 0o1600),
                 "shmget": lambda: libc.shmget(0, 1 << 20, 0o1600)}  # IPC_PRIVATE, IPC_CREAT | 0600
        for name, call in calls.items():
            rc = call()
            print(name, rc, errno.errorcode.get(ctypes.get_errno()) if rc < 0 else "")
    """
    r = await hostile(code, memory_mb=256)
    assert r.stdout.splitlines() == ["semget -1 EPERM", "msgget -1 EPERM", "shmget -1 EPERM"], r.stdout + r.stderr
    assert "no System V IPC" in r.enforcement["memory"]


async def test_no_socket_of_any_family():
    # Sockets reach state that no per-run limit bounds: the machine's TCP memory limit is one for every namespace
    # and memory cgroup v1 does not count TCP buffers (connections to a listener of the sandbox's own loopback,
    # filled and closed unaccepted, pushed the machine past net.ipv4.tcp_mem's hard limit in 6 s with the memory
    # cgroup in place: every TCP socket of the host is then refused memory), and a listener's backlog holds
    # connections without descriptors (unix ones: 1 GiB with memory_mb=256, max_open_files=64, no memory cgroup).
    # The sandbox has no network and the audit hook refuses every socket anyway, so the kernel refuses them all.
    code = """
        import socket
        for family, kind in [("AF_UNIX", socket.SOCK_STREAM), ("AF_UNIX", socket.SOCK_DGRAM),
                             ("AF_INET", socket.SOCK_STREAM), ("AF_INET", socket.SOCK_DGRAM),
                             ("AF_INET6", socket.SOCK_STREAM), ("AF_NETLINK", socket.SOCK_RAW)]:
            try:
                socket.socket(getattr(socket, family), kind).close()
                print(family, kind, "created")
            except OSError as e:
                print(family, kind, type(e).__name__, e.errno)
        try:
            socket.socketpair()
            print("socketpair created")
        except OSError as e:
            print("socketpair", type(e).__name__, e.errno)
    """
    r = await hostile(code)
    expected = [
        f"{family} {kind} PermissionError 13"
        for family, kind in [("AF_UNIX", 1), ("AF_UNIX", 2), ("AF_INET", 1), ("AF_INET", 2), ("AF_INET6", 1)]
    ]
    expected += ["AF_NETLINK 3 PermissionError 13", "socketpair PermissionError 13"]
    assert r.stdout.splitlines() == expected, r.stdout + r.stderr
    assert r.enforcement["network"] == "empty network namespace + seccomp (no socket) + audit hook"


async def test_the_inits_limits_are_out_of_the_codes_reach():
    # prlimit64 on another process needs only the same uid, which the init shares with the code: the code set the
    # init's RLIMIT_AS to 64 KiB and its RLIMIT_CPU to 0. Its own limits it may still lower (pid 0, which is what
    # glibc's getrlimit/setrlimit use).
    code = """
        import resource
        for what, call in [("read", lambda: resource.prlimit(1, resource.RLIMIT_AS)),
                           ("lower", lambda: resource.prlimit(1, resource.RLIMIT_AS, (1 << 16, 1 << 16)))]:
            try:
                print("init", what, call())
            except OSError as e:
                print("init", what, type(e).__name__, e.errno)
        soft, hard = resource.getrlimit(resource.RLIMIT_CPU)
        resource.setrlimit(resource.RLIMIT_CPU, (soft - 1, hard - 1))
        print("own", resource.getrlimit(resource.RLIMIT_CPU) == (soft - 1, hard - 1))
        print("init AS", [line.split()[4] for line in open("/proc/1/limits") if line.startswith("Max address space")])
    """
    r = await hostile(code, memory_mb=512)
    assert r.stdout.splitlines() == [
        "init read PermissionError 1",
        "init lower PermissionError 1",  # was None: done
        "own True",
        f"init AS ['{512 << 20}']",
    ], r.stdout + r.stderr


async def test_linux_aio_is_refused():
    # fs.aio-max-nr is one limit for the whole machine: one io_setup(65536) took all of it, and every other process's
    # io_setup failed with EAGAIN until the run ended.
    code = """
        import ctypes, os
        libc = ctypes.CDLL(None, use_errno=True)
        nr = {"x86_64": 206, "aarch64": 0}[os.uname().machine]
        ctx = ctypes.c_ulong(0)
        rc = libc.syscall(nr, 65536, ctypes.byref(ctx))
        print("io_setup", rc, os.strerror(ctypes.get_errno()) if rc else "")
    """
    r = await hostile(code)
    assert r.stdout == "io_setup -1 Operation not permitted\n", r.stdout + r.stderr


async def test_posix_timers_and_message_queues_are_capped_per_run():
    # Each POSIX timer holds a queued-signal slot of kernel memory no address space counts: with the host's
    # RLIMIT_SIGPENDING (96,369 here) one run made that many timers (49 MiB past memory_mb), a budget counted per
    # host uid and so shared by every concurrent run. POSIX message queues (RLIMIT_MSGQUEUE) are not needed at all.
    code = """
        import ctypes, os
        libc = ctypes.CDLL(None, use_errno=True)
        event = (ctypes.c_byte * 64)()
        event[12] = 1  # sigevent.sigev_notify = SIGEV_NONE (after the 8-byte value and the 4-byte signal number)
        timer, made = ctypes.c_void_p(), 0
        while made < 200_000 and libc.timer_create(1, event, ctypes.byref(timer)) == 0:  # CLOCK_MONOTONIC
            made += 1
        print("timers", made, os.strerror(ctypes.get_errno()))
        libc.mq_open.argtypes = [ctypes.c_char_p, ctypes.c_int, ctypes.c_int, ctypes.c_void_p]
        print("mq_open", libc.mq_open(b"/q", os.O_CREAT | os.O_RDWR, 0o600, None), os.strerror(ctypes.get_errno()))
    """
    r = await hostile(code)
    assert r.stdout.splitlines() == [
        "timers 1024 Resource temporarily unavailable",
        "mq_open -1 Too many open files",
    ], r.stdout + r.stderr


async def test_tmp_holds_at_most_max_files(monkeypatch):
    # tmpfs_mb bounds the bytes of /tmp, not its files: bubblewrap's --tmpfs takes no inode count, and the kernel's
    # default is half the machine's RAM pages. Empty files hold ~1 KiB of kernel memory each: 388,000 of them,
    # 325 MiB, in 4 s with tmpfs_mb=16, memory_mb=256 and no memory cgroup. A root host mounts each run's /tmp itself.
    monkeypatch.setattr(sandbox.CgroupLimits, "create", classmethod(lambda cls, **kwargs: None))
    code = """
        import os
        made = 0
        try:
            while made < 20_000:
                os.close(os.open(f"f{made}", os.O_CREAT | os.O_WRONLY, 0o600))
                made += 1
        except OSError as e:
            print(e.strerror)
        print(made, os.statvfs("/tmp").f_files)
    """
    r = await hostile(code, max_files=500, tmpfs_mb=16, memory_mb=256)
    if os.geteuid() != 0:  # bubblewrap started as the user mounts /tmp itself, without a file count
        assert r.stdout.splitlines() == ["20000 " + r.stdout.split()[-1]], r.stdout + r.stderr
        assert "no file-count limit here" in r.enforcement["files"]
        return
    # 500 inodes in all; the runner's own files take a few (2 to 10 seen), so the count made is read as a range.
    lines = r.stdout.splitlines()
    assert lines[0] == "No space left on device" and lines[1].endswith(" 500"), r.stdout + r.stderr
    assert 450 <= int(lines[1].split()[0]) <= 498, r.stdout + r.stderr
    assert r.enforcement["files"] == "read-only runtime view, private /tmp tmpfs (16 MiB, 500 files) + audit hook"


async def test_extended_attributes_count_against_the_file_budget(monkeypatch):
    # tmpfs keeps user.* extended attributes in kernel memory, charged to its inode space (~1 KiB per inode of
    # nr_inodes), not to its size: with the kernel's default inode count a run could store gigabytes of them.
    monkeypatch.setattr(sandbox.CgroupLimits, "create", classmethod(lambda cls, **kwargs: None))
    code = """
        import os
        open("x", "w").close()
        stored = 0
        try:
            while stored < 100:  # 6.4 MiB: past 500 files' inode space, light on the host
                os.setxattr("x", f"user.a{stored}", b"v" * 65536)
                stored += 1
        except OSError as e:
            print(e.strerror)
        print("KiB", stored * 64)
    """
    r = await hostile(code, max_files=500, tmpfs_mb=16, memory_mb=256)
    if os.geteuid() != 0:  # no file-count limit: only the kernel's default inode space bounds them
        assert "no file-count limit here" in r.enforcement["files"]
        return
    lines = r.stdout.splitlines()
    assert lines[0] == "No space left on device", r.stdout + r.stderr
    assert int(lines[1].split()[1]) <= 500, r.stdout  # at most the inode space of 500 files


async def test_no_real_time_priority_whatever_the_host_allows(monkeypatch):
    # RLIMIT_RTPRIO and RLIMIT_NICE were the host's: a host with a real-time budget (limits.conf's rtprio, `docker
    # --ulimit rtprio=99`) handed the code SCHED_FIFO, whose busy loop owns a CPU. This machine's hard limits are 0
    # and cannot be raised, so the command line is checked too: both are set to 0 on bubblewrap whatever the host has.
    argvs = []
    real = sandbox.bwrap_argv
    monkeypatch.setattr(sandbox, "bwrap_argv", lambda view, **kw: argvs.append(real(view, **kw)) or argvs[-1])
    code = """
        import os, resource
        print(resource.getrlimit(resource.RLIMIT_RTPRIO), resource.getrlimit(resource.RLIMIT_NICE))
        try:
            os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(1))
            print("SCHED_FIFO")
        except OSError as e:
            print(type(e).__name__, e.errno)
    """
    r = await hostile(code)
    assert r.stdout.splitlines() == ["(0, 0) (0, 0)", "PermissionError 1"], r.stdout + r.stderr
    prlimit_options = argvs[0][1 : argvs[0].index("--")]
    assert "--rtprio=0:0" in prlimit_options and "--nice=0:0" in prlimit_options, argvs[0]
