/*
 * pgprobe_fd.d - name the file behind a file descriptor, DTrace for Linux.
 *
 * A D library (dtrace -L d/lib/linux) for d/clog_reads.d: the same inlines as
 * d/lib/fds/pgprobe_fd.d, from the kernel's struct file. DTrace for Linux's
 * fds[fd].fi_dirname is "." (its d_path() is a stub), so the directory is
 * read from the dentry: the name of the file's parent, and of the parent's
 * parent ("pg_xact", or "offsets" under "pg_multixact"). Verified on DTrace
 * 2.0.7 with kernel 6.18.
 *
 *   pgprobe_fd_dir[fd]     last component of the file's directory
 *   pgprobe_fd_parent[fd]  the component above it
 *   pgprobe_fd_name[fd]    the file's name
 */

inline struct file *pgprobe_fd_file[int fd] =
    fd >= 0 && fd < curthread->files->fdt->max_fds ? curthread->files->fdt->fd[fd] : NULL;

inline string pgprobe_fd_dir[int fd] = pgprobe_fd_file[fd] == NULL ? "<none>" :
    stringof(pgprobe_fd_file[fd]->f_path.dentry->d_parent->d_name.name);

inline string pgprobe_fd_parent[int fd] = pgprobe_fd_file[fd] == NULL ? "<none>" :
    stringof(pgprobe_fd_file[fd]->f_path.dentry->d_parent->d_parent->d_name.name);

inline string pgprobe_fd_name[int fd] = pgprobe_fd_file[fd] == NULL ? "<none>" :
    stringof(pgprobe_fd_file[fd]->f_path.dentry->d_name.name);
