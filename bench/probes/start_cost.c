/* The CPU a process start costs on this machine, apart from anything of ours.
 *
 * start_cost N PROGRAM...: starts each PROGRAM N times, one after another, the way the worker's
 * spawner does (vfork, execve, waitpid), and prints one line per program: its path, then the
 * microseconds of CPU per start of the children (user and system: the exec, the program's own
 * start and its exit) and of this process. Then one line "cpuid" with the microseconds one
 * `cpuid` instruction takes (on x86; "-" elsewhere): under a hypervisor it leaves the guest,
 * and glibc runs it dozens of times in every process's start (docs/performance.md).
 */
#include <stdio.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

extern char **environ;

static double cpu_us(const struct rusage *u)
{
    return (u->ru_utime.tv_sec + u->ru_stime.tv_sec) * 1e6
        + u->ru_utime.tv_usec + u->ru_stime.tv_usec;
}

/* One start, in a function of its own: nothing of the caller's lives across the vfork. */
static int __attribute__((noinline)) start_one(const char *path)
{
    char *argv[] = {(char *)path, NULL};
    pid_t pid = vfork();
    if (pid == 0) {
        execve(path, argv, environ);
        _exit(127);
    }
    int status;
    if (pid < 0 || waitpid(pid, &status, 0) < 0) {
        perror("start_cost");
        return 1;
    }
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        fprintf(stderr, "start_cost: %s did not exit 0\n", path);
        return 1;
    }
    return 0;
}

static int starts(const char *path, int n)
{
    struct rusage c0, c1, s0, s1;
    getrusage(RUSAGE_CHILDREN, &c0);
    getrusage(RUSAGE_SELF, &s0);
    for (int i = 0; i < n; i++)
        if (start_one(path))
            return 1;
    getrusage(RUSAGE_CHILDREN, &c1);
    getrusage(RUSAGE_SELF, &s1);
    printf("%s %.2f %.2f\n", path, (cpu_us(&c1) - cpu_us(&c0)) / n,
           (cpu_us(&s1) - cpu_us(&s0)) / n);
    return 0;
}

static void cpuid_cost(void)
{
#if defined(__x86_64__) || defined(__i386__)
    enum { ROUNDS = 5000 };
    unsigned a, b, c, d;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (int i = 0; i < ROUNDS; i++)
        __cpuid_count(4, i & 3, a, b, c, d);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    printf("cpuid %.3f\n",
           ((t1.tv_sec - t0.tv_sec) * 1e9 + (t1.tv_nsec - t0.tv_nsec)) / ROUNDS / 1e3);
#else
    printf("cpuid -\n");
#endif
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: start_cost N PROGRAM...\n");
        return 2;
    }
    int n = atoi(argv[1]);
    for (int k = 2; k < argc; k++)
        if (starts(argv[k], n))
            return 1;
    cpuid_cost();
    return 0;
}
