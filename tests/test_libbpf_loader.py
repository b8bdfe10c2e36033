"""pgprobe.engines.libbpf: a compiled object loads with its rodata set, attaches, and its maps read.

Each test compiles a tiny BPF program with clang-14 into tmp_path (no vmlinux.h: the one
struct read is declared with preserve_access_index, CO-RE relocated at load):
- a tp_btf/sched_switch program counts the switches out of one process, by thread, in a
  hash map; the process is named through a `const volatile` global: the counts are > 0
  and the keys are its pid (one thread), and a 64-bit global set to a negative value
  lands masked to its width;
- an unknown rodata name, and a program the verifier rejects, each give one line of
  LibbpfError (the program's name and the verifier's reason), and libbpf wrote nothing
  to stderr itself;
- a map of 10,000 entries reads the same in batches and key by key.
"""

from __future__ import annotations

import errno
import os
import platform
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from helpers import need

from pgprobe.engines.libbpf import BpfObject, LibbpfError, recursion_misses, unavailable, version

CLANG = "clang-14"
HEADER = """
#include <linux/types.h>
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>

typedef _Bool bool;
char LICENSE[] SEC("license") = "GPL";

struct task_struct {
	int pid;
	int tgid;
} __attribute__((preserve_access_index));
"""

COUNTER = (
    HEADER
    + """
const volatile int target = 0;
const volatile __u64 tag = 0;

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1024);
	__type(key, __u32);
	__type(value, __u64);
} switches SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 2);
	__type(key, __u32);
	__type(value, __u64);
} tags SEC(".maps");

SEC("tp_btf/sched_switch")
int BPF_PROG(on_switch, bool preempt, struct task_struct *prev, struct task_struct *next)
{
	__u32 pid, zero = 0;
	__u64 one = 1, *n;

	if (prev->tgid != target)
		return 0;
	pid = prev->pid;
	n = bpf_map_lookup_elem(&switches, &pid);
	if (n)
		__sync_fetch_and_add(n, 1);
	else
		bpf_map_update_elem(&switches, &pid, &one, BPF_NOEXIST);
	bpf_map_update_elem(&tags, &zero, (void *)&tag, BPF_ANY);
	return 0;
}
"""
)

REJECTED = (
    HEADER
    + """
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16);
	__type(key, __u32);
	__type(value, __u64);
} m SEC(".maps");

SEC("tp_btf/sched_switch")
int BPF_PROG(bad_prog, bool preempt, struct task_struct *prev, struct task_struct *next)
{
	__u32 k = 0;
	__u64 *v = bpf_map_lookup_elem(&m, &k);

	return *v;  /* no NULL check: the verifier rejects the load */
}
"""
)

# clang's __TARGET_ARCH_ name and Debian's multiarch include dir (for asm/types.h).
ARCH = {"x86_64": ("x86", "x86_64-linux-gnu"), "aarch64": ("arm64", "aarch64-linux-gnu")}


@pytest.fixture
def compile_bpf(tmp_path: Path) -> Callable[[str, str], Path]:
    need(unavailable() is None, f"cannot load BPF objects here: {unavailable()}")
    need(shutil.which(CLANG) is not None, f"{CLANG} is not installed")
    need(Path("/usr/include/bpf/bpf_helpers.h").exists(), "libbpf-dev is not installed")
    need(platform.machine() in ARCH, f"no BPF target arch for {platform.machine()}")
    target_arch, multiarch = ARCH[platform.machine()]

    def build(name: str, source: str) -> Path:
        src, obj = tmp_path / f"{name}.bpf.c", tmp_path / f"{name}.bpf.o"
        src.write_text(source)
        subprocess.run(
            [CLANG, "-O2", "-g", "-target", "bpf", f"-D__TARGET_ARCH_{target_arch}",
             f"-I/usr/include/{multiarch}", "-c", str(src), "-o", str(obj)],
            check=True, capture_output=True, timeout=120,
        )  # fmt: skip
        return obj

    return build


def as_int(raw: bytes) -> int:
    return int.from_bytes(raw, sys.byteorder)


@pytest.mark.integration
def test_counts_switches_of_the_target_process(compile_bpf: Callable[[str, str], Path]) -> None:
    obj_path = compile_bpf("counter", COUNTER)
    sleeper = subprocess.Popen([sys.executable, "-c", "import time\nwhile True: time.sleep(0.002)"])
    try:
        with BpfObject(obj_path, {"target": sleeper.pid, "tag": -2}) as obj:
            obj.attach()
            time.sleep(0.5)
            counts = {as_int(k): as_int(v) for k, v in obj.items("switches")}
            tags = dict(obj.items("tags"))
            assert all(fd > 0 for fd in obj.program_fds())
            assert recursion_misses(obj.program_fds()) == 0
            assert obj.map_fd("switches") > 0
            obj.update("tags", (1).to_bytes(4, sys.byteorder), (42).to_bytes(8, sys.byteorder))
            updated = {as_int(k): as_int(v) for k, v in obj.items("tags")}
        obj.close()  # idempotent
    finally:
        sleeper.kill()
        sleeper.wait()
    print(f"switches of {sleeper.pid}: {counts}")
    assert set(counts) == {sleeper.pid}, counts
    assert counts[sleeper.pid] > 10
    # -2 in an 8-byte global: masked to 64 bits; the array map has both entries.
    assert as_int(tags[(0).to_bytes(4, sys.byteorder)]) == (1 << 64) - 2
    assert updated == {0: (1 << 64) - 2, 1: 42}
    assert version().startswith("1.")
    with pytest.raises(LibbpfError):
        obj.items("switches")  # closed


@pytest.mark.integration
def test_unknown_rodata_name_is_one_line(compile_bpf: Callable[[str, str], Path]) -> None:
    obj_path = compile_bpf("counter", COUNTER)
    with pytest.raises(LibbpfError) as caught:
        BpfObject(obj_path, {"target": os.getpid(), "no_such_global": 1})
    message = str(caught.value)
    assert "no_such_global" in message
    assert "\n" not in message and "Traceback" not in message


@pytest.mark.integration
def test_verifier_rejection_is_one_line_naming_the_program(
    compile_bpf: Callable[[str, str], Path], capfd: pytest.CaptureFixture[str]
) -> None:
    obj_path = compile_bpf("rejected", REJECTED)
    with pytest.raises(LibbpfError) as caught:
        BpfObject(obj_path, {})
    message = str(caught.value)
    print(message)
    assert "bad_prog" in message and "invalid mem access" in message, message
    assert "\n" not in message and "Traceback" not in message
    assert capfd.readouterr().err == ""  # libbpf's messages were captured, not printed


MANY = (
    HEADER
    + """
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16384);
	__type(key, __u64);
	__type(value, __u64);
} many SEC(".maps");

SEC("tp_btf/sched_switch")
int BPF_PROG(untouched, bool preempt, struct task_struct *prev, struct task_struct *next)
{
	return 0;  /* loaded, never attached: the map is the test's */
}
"""
)


@pytest.mark.integration
def test_maps_read_in_batches_and_key_by_key_alike(
    compile_bpf: Callable[[str, str], Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """items() reads a map in batches (several here: 10,000 entries, 4,096 a batch), and
    key by key where the kernel refuses batch reads: the same entries, every one written."""
    from pgprobe.engines import libbpf

    def entry(i: int) -> tuple[bytes, bytes]:
        return (i * 7919).to_bytes(8, sys.byteorder), (i * i + 1).to_bytes(8, sys.byteorder)

    written = dict(entry(i) for i in range(10_000))
    with BpfObject(compile_bpf("many", MANY), {}) as obj:
        for key, value in written.items():
            obj.update("many", key, value)
        batched = obj.items("many")
        monkeypatch.setattr(libbpf, "_batch_items", lambda *_: -errno.EINVAL)  # no batch ops
        walked = obj.items("many")
    assert len(batched) == len(walked) == len(written)
    assert dict(batched) == dict(walked) == written
