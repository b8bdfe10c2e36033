/* The probe-cost micro-benchmark's target (bench/probe_cost.py compiles and runs it).
 *
 *   probe_cost call N     calls target() N times: a uprobe on target fires N times
 *   probe_cost syscall N  makes N getppid() system calls: a tracepoint on
 *                         syscalls:sys_enter_getppid fires N times
 *
 * Prints the nanoseconds per iteration, of CPU time (the thread's) and of wall time.
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <sys/syscall.h>

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

int main(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: %s call|syscall N\n", argv[0]);
        return 2;
    }
    long n = atol(argv[2]);
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
