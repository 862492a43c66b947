/* How many `cpuid` instructions a program runs: count_cpuid PROGRAM [ARG...] single-steps it
 * under ptrace (x86_64 Linux; seconds for a start of `true`) and prints the instructions it
 * ran and how many of them were `cpuid` (0F A2). Not part of the bench's run; the figure it
 * gives is quoted in bench/process_start.py and docs/performance.md.
 *   cc -O2 -o /tmp/count_cpuid bench/probes/count_cpuid.c && /tmp/count_cpuid /usr/bin/true
 */
#include <errno.h>
#include <stdio.h>
#include <sys/ptrace.h>
#include <sys/user.h>
#include <sys/wait.h>
#include <unistd.h>

int main(int argc, char **argv)
{
#if !defined(__x86_64__)
    (void)argc;
    (void)argv;
    fprintf(stderr, "count_cpuid: x86_64 only\n");
    return 2;
#else
    if (argc < 2) {
        fprintf(stderr, "usage: count_cpuid PROGRAM [ARG...]\n");
        return 2;
    }
    pid_t pid = fork();
    if (pid == 0) {
        ptrace(PTRACE_TRACEME, 0, NULL, NULL);
        execv(argv[1], argv + 1);
        _exit(127);
    }
    int status;
    waitpid(pid, &status, 0); /* stopped at the exec */
    long steps = 0, cpuids = 0;
    for (;;) {
        struct user_regs_struct regs;
        if (ptrace(PTRACE_GETREGS, pid, NULL, &regs) < 0)
            break;
        errno = 0;
        long word = ptrace(PTRACE_PEEKTEXT, pid, (void *)regs.rip, NULL);
        if (errno == 0 && (word & 0xffff) == 0xa20f)
            cpuids++;
        if (ptrace(PTRACE_SINGLESTEP, pid, NULL, NULL) < 0)
            break;
        waitpid(pid, &status, 0);
        if (WIFEXITED(status) || WIFSIGNALED(status))
            break;
        steps++;
    }
    printf("%s: %ld instructions, %ld cpuid\n", argv[1], steps, cpuids);
    return 0;
#endif
}
