/* The probe-cost micro-benchmark's target (bench/probe_cost.py compiles and runs it).
 *
 *   probe_cost call N     calls target() N times: a uprobe on target fires N times
 *   probe_cost syscall N  makes N getppid() system calls: a tracepoint on
 *                         syscalls:sys_enter_getppid fires N times
 *   probe_cost switch N [CPU [mixed]]  two processes pinned to one CPU (default 0) pass a byte
 *                         back and forth over two pipes N times: 2N context switches
 *                         (sched_switch) and 2N wakeups (sched_wakeup); prints
 *                         "PID ADDR" first and starts on a line on stdin (below)
 *
 * Prints the nanoseconds per iteration (per context switch for `switch`), of CPU time
 * (the thread's; for `switch` both processes') and of wall time.
 */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <sched.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>

__attribute__((noinline)) int target(int x)
{
    __asm__ volatile("" ::: "memory"); /* keep the call and its body */
    return x + 1;
}

static double seconds(clockid_t clock)
{
    struct timespec ts;
    clock_gettime(clock, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

static double rusage_s(int who)
{
    struct rusage ru;
    getrusage(who, &ru);
    return ru.ru_utime.tv_sec + ru.ru_stime.tv_sec + (ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6;
}

/* What bpf/waits.bt reads at a switch-out of one of "its" processes (the children of
 * the process it is given as postmaster): a pointer to the current wait event. */
uint32_t wait_event_value = 0x06000000;
uint32_t *my_wait_event_info = &wait_event_value;

static int ping_pong(int in, int out, long n, int first)
{
    char c = 0;
    for (long i = 0; i < n; i++) {
        if (first && write(out, &c, 1) != 1)
            return 1;
        if (read(in, &c, 1) != 1)
            return 1;
        if (!first && write(out, &c, 1) != 1)
            return 1;
    }
    return 0;
}

/* Ping-pong on one CPU: two processes pass a byte back and forth over two pipes; each
 * read blocks the reader and wakes the other side, so every iteration is two switches
 * between them (and whatever else the machine puts on that CPU). The parent first
 * prints its pid and the address of my_wait_event_info and waits for a line on stdin
 * (time for a tracer to attach with it as "postmaster"), then forks the first process,
 * which forks the second: with `mixed` the second is the first's child (not the
 * parent's: a foreign task to a script that follows the parent's children, as pgbench
 * is to a backend), else the parent's. Prints both processes' CPU time per switch. */
static int switches(long n, int on_cpu, int mixed)
{
    int ping[2], pong[2];
    cpu_set_t set;
    char line[16];
    CPU_ZERO(&set);
    CPU_SET(on_cpu, &set);
    if (sched_setaffinity(0, sizeof set, &set) != 0 || pipe(ping) != 0 || pipe(pong) != 0) {
        perror("probe_cost switch");
        return 1;
    }
    printf("%d %lu\n", (int)getpid(), (unsigned long)&my_wait_event_info);
    fflush(stdout);
    if (fgets(line, sizeof line, stdin) == NULL)
        return 1;
    double wall0 = seconds(CLOCK_MONOTONIC);
    int sa, sb = 0;
    pid_t a = fork();
    if (a == 0) {
        pid_t b = mixed ? fork() : 1;
        if (b == 0)
            _exit(ping_pong(pong[0], ping[1], n, 1));
        int rc = ping_pong(ping[0], pong[1], n, 0);
        if (mixed)
            waitpid(b, &sb, 0);
        _exit(rc || sb);
    }
    if (!mixed) {
        pid_t b = fork();
        if (b == 0)
            _exit(ping_pong(pong[0], ping[1], n, 1));
        waitpid(b, &sb, 0);
    }
    waitpid(a, &sa, 0);
    /* RUSAGE_CHILDREN: every descendant waited for, the grandchild included */
    double cpu = rusage_s(RUSAGE_CHILDREN), wall = seconds(CLOCK_MONOTONIC) - wall0;
    printf("%.2f %.2f\n", cpu / (2 * n) * 1e9, wall / (2 * n) * 1e9);
    return sa == 0 && sb == 0 ? 0 : 1;
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: %s call|syscall N | switch N [CPU [mixed]]\n", argv[0]);
        return 2;
    }
    long n = atol(argv[2]);
    if (strcmp(argv[1], "switch") == 0)
        return switches(n, argc > 3 ? atoi(argv[3]) : 0, argc > 4 && strcmp(argv[4], "mixed") == 0);
    int syscall_mode = strcmp(argv[1], "syscall") == 0;
    volatile int sink = 0;
    double cpu0 = seconds(CLOCK_THREAD_CPUTIME_ID), wall0 = seconds(CLOCK_MONOTONIC);
    for (long i = 0; i < n; i++) {
        if (syscall_mode)
            sink += (int)syscall(SYS_getppid);
        else
            sink = target(sink);
    }
    double cpu = seconds(CLOCK_THREAD_CPUTIME_ID) - cpu0, wall = seconds(CLOCK_MONOTONIC) - wall0;
    printf("%.2f %.2f\n", cpu / n * 1e9, wall / n * 1e9);
    return 0;
}
