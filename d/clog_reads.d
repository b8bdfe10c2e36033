#!/usr/sbin/dtrace -qs
/*
 * clog_reads.d - physical reads of SLRU segment files (pg_xact, pg_subtrans,
 *                pg_multixact, ...) by PostgreSQL processes (DTrace "rsnoop";
 *                the twin of bpf/clog_reads.bt).
 *
 * An SLRU buffer miss in PostgreSQL (SimpleLruReadPage -> SlruPhysicalReadPage)
 * opens the segment file, reads one BLCKSZ page (pread since 12, lseek + read
 * before) and closes it. This script times the read system calls (read,
 * readv, pread*) of the cluster's processes whose file descriptor is a file
 * in an enabled SLRU directory, as the kernel names the open file (fds[],
 * or the dentry on Linux: see PLATFORM LIBRARY below). Per
 * pid and segment file it keeps the number of reads, the bytes and the read
 * latency; optionally the user stack of each read, or one line per read.
 * Each read counted is one blks_read in pg_stat_slru.
 *
 * USAGE: dtrace -qs clog_reads.d [POSTMASTER_PID] [SLRU_MASK] [MODE] [ONLY_PID] [INTERVAL_S]
 *   The positional parameters of bpf/clog_reads.bt, all used, as macros:
 *   POSTMASTER_PID  $1: count only that cluster's processes: the postmaster
 *                   and its children (0 or omitted: every process whose
 *                   execname is "postgres")
 *   SLRU_MASK       $2: which SLRU directories count, OR of the bits
 *                     1 pg_xact    2 pg_clog (before 10)   4 pg_subtrans
 *                     8 pg_multixact/offsets   16 pg_multixact/members
 *                    32 pg_commit_ts   64 pg_serial   128 pg_notify
 *                   (0 or omitted: 3 = pg_xact + pg_clog; 255: all of them)
 *   MODE            $3: 0 aggregate only; 1 also count the user stack of each
 *                   read (@read_stacks); 2 also print one line per read as it
 *                   completes (trace)
 *   ONLY_PID        $4: count only this pid (0: all of the cluster)
 *   INTERVAL_S      $5: print and truncate the aggregations every N seconds
 *                   (0: only at exit)
 *   Omitted parameters are 0 (#pragma D option defaultargs).
 *   Ctrl-C (SIGINT) ends the capture: the END clause prints the aggregations.
 *   (bpf/clog_reads.bt's 6th parameter, STOPPER_PID, is not needed here: bpftrace
 *   stops its tracepoints at SIGINT, long before END under load, while DTrace runs
 *   END with its probes still enabled, so END closes the window in time.)
 *
 * SOURCE: this is the syscall view only. pgprobe clog-reads counts from a uprobe
 *   on pgstat_count_slru_page_read by default (bpf/clog_reads_uprobe.bt); DTrace
 *   for Linux 2.0.7 here has no usable pid provider for it: "pid<PID>:postgres:
 *   pgstat_count_slru_page_read:entry" matches no probes, "failed to grab process"
 *   (the pid provider ptrace-grabs each process, which would stop a backend, and
 *   only for processes that exist when dtrace starts). So with --engine dtrace
 *   clog-reads uses this script (--source syscalls), and says so.
 *
 * PLATFORM LIBRARY: the directory and name of a file descriptor come from a
 *   D library passed with -L: d/lib/fds (fds[]: illumos, Solaris, FreeBSD,
 *   macOS) or d/lib/linux (DTrace for Linux, whose fds[].fi_dirname is ".":
 *   the parent dentries' names). pgprobe passes the right one; by hand:
 *   dtrace -L d/lib/linux -qs d/clog_reads.d ...
 *
 * REQUIREMENTS: DTrace with the syscall provider (illumos, Solaris, FreeBSD,
 *   macOS, Linux); root (illumos/Solaris: dtrace_proc + dtrace_user). No
 *   USDT: any PostgreSQL build and version (pg_clog for 9.x). On macOS, SIP
 *   must allow DTrace (csrutil enable --without dtrace).
 *
 * WHAT COUNTS, AND HOW IT DIFFERS FROM bpf/clog_reads.bt: a read counts when
 *   the file's directory is an enabled SLRU directory (its last component, and
 *   "pg_multixact" above offsets/members). The file is named as PostgreSQL
 *   opens it, relative to the data directory ("pg_xact/0002"), so the keys
 *   are those of the bpf script. Differences, all from fds[] naming open files
 *   rather than watching opens: failed opens are not seen (@open_errors is
 *   never printed); a read whose file the kernel cannot name ("<unknown>")
 *   is not counted; a process of the cluster that reads SLRU files for
 *   another reason (a backup through a walsender) counts too (the bpf script
 *   skips "./" and absolute paths). preadv is not traced (PostgreSQL reads
 *   SLRU pages with pread, or read before 12). On macOS, read_nocancel is not
 *   traced (PostgreSQL 12+ uses pread there).
 *
 * COLUMNS (aggregate keys are [pid, file]):
 *   @read_stats    :count = reads (one page each), :total = latency ns summed
 *   @read_bytes    bytes returned by the reads (reads x BLCKSZ normally)
 *   @read_max_ns   longest single read in ns
 *   @read_ns       quantize() histogram of read latency in ns
 *   @read_stacks   MODE 1: [pid, ustack()] -> reads, frames already named by
 *                  DTrace (module`function+0xoffset)
 *   MODE 2 line:   TIME_NS PID FILE OFFSET BYTES LAT_NS, tab-separated, after a
 *                  header line; TIME_NS is DTrace's timestamp (ns, monotonic)
 *                  at the end of the read; OFFSET is pread's offset, or the
 *                  file offset fds[] gives for read/readv (-1 when unknown)
 *   Latency is syscall entry to return.
 *
 * OUTPUT (the layout pgprobe's DTrace engine parses, tab-separated):
 *   @@attached <TAB> clog_reads.d                 BEGIN: all probes enabled
 *   @@snapshot <TAB> 2026 Nov 21 23:44:19         before each set of maps
 *   @read_stats:count <TAB> PID <TAB> FILE <TAB> READS
 *   @read_stats:total <TAB> PID <TAB> FILE <TAB> TOTAL_NS
 *   @read_bytes <TAB> PID <TAB> FILE <TAB> BYTES
 *   @read_max_ns <TAB> PID <TAB> FILE <TAB> MAX_NS
 *   @read_ns <TAB> PID <TAB> FILE, then DTrace's quantize table
 *   @read_stacks <TAB> PID <TAB> COUNT, then the ustack() frames, one a line
 *   @@end                                         END printed everything
 *
 * OVERHEAD: the read entry/return probes fire for every read of every
 *   process; for others than the targets each costs a predicate test. For
 *   targets, an fds[] lookup and a few string operations per read (a few
 *   us). Tracked reads are only SLRU misses, normally rare. MODE 2 prints one
 *   line per read.
 *
 * EXAMPLE:
 *   # dtrace -qs d/clog_reads.d $(head -1 $PGDATA/postmaster.pid) 0 1
 *   @@attached	clog_reads.d
 *   ^C
 *   @@snapshot	2026 Nov 21 23:51:02
 *   @read_stats:count	28544	pg_xact/0001	48
 *   [...]
 *   (a real run, DTrace for Linux 2.0.7: samples/clog_reads_d_example.txt)
 *
 * Part of pgprobe (pgprobe clog-reads --engine dtrace runs this script).
 */

#pragma D option quiet
#pragma D option defaultargs
#pragma D option switchrate=10hz
#pragma D option ustackframes=127

dtrace:::BEGIN
{
	rd_ticks = 0;	/* seconds since the last interval print */
	printf("@@attached\tclog_reads.d\n");
}

dtrace:::BEGIN
/$3 == 2/
{
	printf("TIME_NS\tPID\tFILE\tOFFSET\tBYTES\tLAT_NS\n");
}

/*
 * Entry: is the fd a segment file in an enabled SLRU directory? The
 * directory's last two components come from the platform library (-L).
 */
syscall::read:entry,
syscall::readv:entry,
syscall::pread*:entry
/(($1 == 0 && execname == "postgres") || ($1 != 0 && (pid == $1 || ppid == $1))) &&
 ($4 == 0 || pid == $4)/
{
	this->d1 = pgprobe_fd_dir[arg0];
	this->d2 = pgprobe_fd_parent[arg0];
	this->m = $2 != 0 ? $2 : 3;
	self->rd_slru =
	    ((this->m & 1) && this->d1 == "pg_xact") ||
	    ((this->m & 2) && this->d1 == "pg_clog") ||
	    ((this->m & 4) && this->d1 == "pg_subtrans") ||
	    ((this->m & 8) && this->d1 == "offsets" && this->d2 == "pg_multixact") ||
	    ((this->m & 16) && this->d1 == "members" && this->d2 == "pg_multixact") ||
	    ((this->m & 32) && this->d1 == "pg_commit_ts") ||
	    ((this->m & 64) && this->d1 == "pg_serial") ||
	    ((this->m & 128) && this->d1 == "pg_notify");
}

syscall::read:entry,
syscall::readv:entry,
syscall::pread*:entry
/self->rd_slru/
{
	self->rd_slru = 0;
	self->rd_fd = arg0;
	/* pread(fd, buf, nbyte, offset); read/readv use the file offset */
	self->rd_off = probefunc == "read" || probefunc == "readv" ?
	    fds[arg0].fi_offset : (int64_t)arg3;
	self->rd_start = timestamp;
}

/*
 * Return: name the file as PostgreSQL opened it ("pg_xact/0002",
 * "pg_multixact/offsets/0000") and aggregate. The fd is still open here.
 */
syscall::read:return,
syscall::readv:return,
syscall::pread*:return
/self->rd_start/
{
	this->ns = timestamp - self->rd_start;
	this->bytes = (int64_t)arg0 > 0 ? (int64_t)arg0 : 0;
	this->d1 = pgprobe_fd_dir[self->rd_fd];
	this->name = pgprobe_fd_name[self->rd_fd];
	this->file = this->d1 == "offsets" || this->d1 == "members" ?
	    strjoin(strjoin(strjoin("pg_multixact/", this->d1), "/"), this->name) :
	    strjoin(strjoin(this->d1, "/"), this->name);
	@read_count[pid, this->file] = count();
	@read_total[pid, this->file] = sum(this->ns);
	@read_bytes[pid, this->file] = sum(this->bytes);
	@read_max_ns[pid, this->file] = max(this->ns);
	@read_ns[pid, this->file] = quantize(this->ns);
}

syscall::read:return,
syscall::readv:return,
syscall::pread*:return
/self->rd_start && $3 == 1/
{
	@read_stacks[pid, ustack()] = count();
}

syscall::read:return,
syscall::readv:return,
syscall::pread*:return
/self->rd_start && $3 == 2/
{
	printf("%d\t%d\t%s\t%d\t%d\t%d\n", timestamp, pid, this->file, self->rd_off,
	    this->bytes, this->ns);
}

syscall::read:return,
syscall::readv:return,
syscall::pread*:return
/self->rd_start/
{
	self->rd_start = 0;
	self->rd_fd = 0;
	self->rd_off = 0;
}

tick-1sec
/$5 > 0/
{
	rd_ticks++;
}

tick-1sec
/$5 > 0 && rd_ticks >= $5/
{
	rd_ticks = 0;
	printf("@@snapshot\t%Y\n", walltimestamp);
	printa("@read_stats:count\t%d\t%s\t%@d\n", @read_count);
	printa("@read_stats:total\t%d\t%s\t%@d\n", @read_total);
	printa("@read_bytes\t%d\t%s\t%@d\n", @read_bytes);
	printa("@read_max_ns\t%d\t%s\t%@d\n", @read_max_ns);
	printa("@read_ns\t%d\t%s\n%@d\n", @read_ns);
	printa("@read_stacks\t%d\t%@d%k\n", @read_stacks);
	trunc(@read_count);
	trunc(@read_total);
	trunc(@read_bytes);
	trunc(@read_max_ns);
	trunc(@read_ns);
	trunc(@read_stacks);
}

dtrace:::END
{
	printf("@@snapshot\t%Y\n", walltimestamp);
	printa("@read_stats:count\t%d\t%s\t%@d\n", @read_count);
	printa("@read_stats:total\t%d\t%s\t%@d\n", @read_total);
	printa("@read_bytes\t%d\t%s\t%@d\n", @read_bytes);
	printa("@read_max_ns\t%d\t%s\t%@d\n", @read_max_ns);
	printa("@read_ns\t%d\t%s\n%@d\n", @read_ns);
	printa("@read_stacks\t%d\t%@d%k\n", @read_stacks);
	printf("@@end\n");
}
