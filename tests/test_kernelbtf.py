"""pgprobe.kernelbtf: the task_struct offsets waits.bt reads, against the running kernel.

The truth is bpftrace's own reading of the same fields by name (curtask->field, which
bpftrace resolves through the kernel's BTF with libclang): both readings of each field, in
one probe firing in one task, must be equal.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
from helpers import need

from pgprobe import kernelbtf
from pgprobe.errors import PgprobeError

# Each field twice: by name, then at pgprobe's offset ($1-$6, in TaskOffsets' order).
BOTH_READINGS = """
BEGIN {
    $c = (uint64)curtask;
    printf("%d %d\\n", curtask->se.sum_exec_runtime, *(uint64 *)($c + $1));
    printf("%d %d\\n", curtask->se.prev_sum_exec_runtime, *(uint64 *)($c + $2));
    printf("%d %d\\n", curtask->flags, *(uint32 *)($c + $3));
    printf("%d %d\\n", curtask->real_parent->tgid, *(int32 *)(*(uint64 *)($c + $4) + $5));
    printf("%d %d\\n", curtask->sched_info.pcount, *(uint64 *)($c + $6));
    exit();
}
"""


def test_offsets_read_what_bpftrace_reads_by_name(tmp_path: Path) -> None:
    need(os.geteuid() == 0 and shutil.which("bpftrace") is not None, "root and bpftrace")
    offsets = kernelbtf.task_offsets()
    script = tmp_path / "both.bt"
    script.write_text(BOTH_READINGS)
    out = subprocess.run(
        ["bpftrace", str(script), *map(str, offsets.as_args())],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    pairs = [line.split() for line in out.stdout.splitlines() if line[:1].isdigit()]
    assert len(pairs) == 5, out.stdout
    for by_name, by_offset in pairs:
        assert by_name == by_offset
    assert int(pairs[3][1]) == os.getpid()  # bpftrace's parent is this test


def test_offsets_are_those_of_the_module_entry_point() -> None:
    """`python3 -m pgprobe.kernelbtf` (the scripts' USAGE) prints the same six numbers."""
    need(kernelbtf.VMLINUX_BTF.exists(), "the kernel has no BTF")
    out = subprocess.run(
        ["python3", "-m", "pgprobe.kernelbtf"], capture_output=True, text=True, check=True,
        cwd=Path(__file__).resolve().parent.parent,
    )  # fmt: skip
    assert out.stdout.split() == [str(o) for o in kernelbtf.task_offsets().as_args()]


@pytest.mark.parametrize(
    ("content", "said"),
    [(b"", "not usable"), (b"\x00" * 64, "bad magic"), (None, "cannot read")],
)
def test_no_usable_btf_is_one_line(tmp_path: Path, content: bytes | None, said: str) -> None:
    path = tmp_path / "vmlinux"
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(PgprobeError) as err:
        kernelbtf.task_offsets(path)
    assert said in str(err.value) and "\n" not in str(err.value)


def test_a_struct_without_the_field_is_said(tmp_path: Path) -> None:
    """A BTF blob with no task_struct at all (the kernel's, cut after its header)."""
    need(kernelbtf.VMLINUX_BTF.exists(), "the kernel has no BTF")
    data = bytearray(kernelbtf.VMLINUX_BTF.read_bytes())
    data[12:16] = (0).to_bytes(4, "little")  # type_len: no type records at all
    path = tmp_path / "vmlinux"
    path.write_bytes(bytes(data))
    with pytest.raises(PgprobeError, match="no struct task_struct"):
        kernelbtf.task_offsets(path)
