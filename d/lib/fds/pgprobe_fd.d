/*
 * pgprobe_fd.d - name the file behind a file descriptor, with fds[]
 * (illumos, Solaris, FreeBSD, macOS).
 *
 * A D library (dtrace -L d/lib/fds) for d/clog_reads.d; DTrace for Linux uses
 * d/lib/linux/pgprobe_fd.d instead, with the same inlines:
 *   pgprobe_fd_dir[fd]     last component of the file's directory
 *   pgprobe_fd_parent[fd]  the component above it
 *   pgprobe_fd_name[fd]    the file's name
 * fds[].fi_dirname is the kernel's path of the directory
 * ("/srv/pg/15/pg_multixact/offsets"). Not yet run on these systems: see
 * docs/dtrace.md.
 */

#pragma D depends_on library io.d

inline string pgprobe_fd_dir[int fd] = basename(fds[fd].fi_dirname);
inline string pgprobe_fd_parent[int fd] = basename(dirname(fds[fd].fi_dirname));
inline string pgprobe_fd_name[int fd] = fds[fd].fi_name;
