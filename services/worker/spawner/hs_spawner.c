/*
 * hs-spawner: starts and reaps a worker's job processes, so that the worker's Python does not.
 *
 * A no-op job's process costs the worker more to start from Python (subprocess.Popen's own
 * code, a vfork of a big process, a pidfd and its epoll registration, a waitpid) than the job
 * itself costs to run: this small process does the starting with vfork and execve, waits for
 * its children through a signalfd, and tells the worker over one socket. See
 * services/worker/spawner/__init__.py for the protocol and the Python side.
 *
 * Requests (one SOCK_SEQPACKET packet each, integers in native byte order):
 *   'S' u64 id, u32 argc, u32 envc, then NUL-terminated strings: cwd, argv[0..argc), env[0..envc);
 *       exactly one descriptor as ancillary data: the process's stdout and stderr.
 *   'L' u64 id, u32 argc, u32 envc, u32 drain_ms, then NUL-terminated strings: log, cwd,
 *       argv[0..argc), env[0..envc); no descriptor. The process's stdout and stderr are a pipe
 *       this process reads into the file `log`, which it creates (truncated, and its missing
 *       directories too) on the first byte: a job that writes nothing costs no file. A file
 *       an earlier run left at `log` is removed when this one ends without output. The end
 *       ('X') is told once the pipe has closed (every writer gone), or drain_ms after the
 *       process ended while something it left outside its group still holds the pipe.
 *   'K' u64 id, i32 signal: signal the process group of attempt `id`, if its leader has not
 *       been reaped yet (a pid is never signalled after it could have been reused).
 * Replies (13 bytes each; those of one turn of this process's loop in one packet, in order,
 * at most 256 a packet):
 *   'P' u64 id, i32 pid      started
 *   'E' u64 id, i32 errno    not started (the command not found, not executable, ...)
 *   'X' u64 id, i32 status   ended (the wait status, as waitpid gives it); whatever else was
 *                            left in its process group has been sent SIGKILL, and its log
 *                            ('L') is complete and closed
 *   'Y' u64 id, i32 status   ended, as 'X', and (an 'L' start) its working directory was
 *                            empty then: the worker gives it to the next job without looking
 * The worker's end of the socket closing (the worker exited) ends this process; its children
 * are left running in their own sessions, as the worker's shutdown kills what it must first.
 *
 * Every child gets: its own session (setsid), /dev/null as stdin, the given descriptor as stdout
 * and stderr, the given working directory, default signal dispositions and an empty signal
 * mask, and no other descriptor of this process (all are close-on-exec). A command without a
 * slash is looked up in the PATH of the child's environment (/bin:/usr/bin without one), as
 * Python's subprocess does, not in this process's PATH.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MAX_PACKET (1 << 20)
#define MAX_STRINGS 65536

struct child {
    pid_t pid;
    uint64_t id;
    int reaped;          /* its leader waited for: the pid is no longer this process's */
    int status;          /* the wait status, once reaped */
    int pipe_fd;         /* 'L': the read end of its output, until that closes; else -1 */
    int log_fd;          /* 'L': the log file, from the first byte on; else -1 */
    int log_failed;      /* the log file could not be made: its output is dropped */
    uint32_t drain_ms;   /* 'L': how long the pipe may stay open once the process ended */
    int64_t deadline_ms; /* reaped with the pipe open: when to stop waiting for its end */
    char *log_path;      /* 'L': the log file's path; else NULL */
    char *cwd;           /* 'L': its working directory, looked into at its end; else NULL */
};

static struct child **children;
static size_t n_children, cap_children;
static int sock = -1;
static int devnull = -1;
static int epfd = -1;
/* epoll's tags of the two descriptors that are not a child's pipe */
static char sock_tag, signal_tag;

static void die(const char *what) {
    fprintf(stderr, "hs-spawner: %s: %s\n", what, strerror(errno));
    exit(2);
}

/* Replies wait here until the end of the loop's turn, then go out together, one packet:
 * a turn that starts or reaps several children sends one packet, not one per reply. */
#define REPLY_SIZE 13
#define MAX_REPLIES 256
static char replies[REPLY_SIZE * MAX_REPLIES];
static size_t n_replies;

static void send_replies(void) {
    if (n_replies == 0)
        return;
    while (send(sock, replies, n_replies * REPLY_SIZE, MSG_NOSIGNAL) < 0) {
        if (errno == EINTR)
            continue;
        if (errno == EPIPE || errno == ECONNRESET)
            exit(0); /* the worker is gone */
        die("send");
    }
    n_replies = 0;
}

static void reply(char kind, uint64_t id, int32_t value) {
    char *out = replies + n_replies * REPLY_SIZE;
    out[0] = kind;
    memcpy(out + 1, &id, sizeof id);
    memcpy(out + 1 + sizeof id, &value, sizeof value);
    if (++n_replies == MAX_REPLIES)
        send_replies();
}

static int64_t now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static struct child *remember(pid_t pid, uint64_t id) {
    if (n_children == cap_children) {
        cap_children = cap_children ? 2 * cap_children : 256;
        children = realloc(children, cap_children * sizeof *children);
        if (!children)
            die("realloc");
    }
    struct child *c = calloc(1, sizeof *c);
    if (!c)
        die("calloc");
    c->pid = pid;
    c->id = id;
    c->pipe_fd = c->log_fd = -1;
    children[n_children++] = c;
    return c;
}

/* A child still running (unreaped), by attempt id. */
static struct child *find_running(uint64_t id) {
    for (size_t i = 0; i < n_children; i++)
        if (children[i]->id == id && !children[i]->reaped)
            return children[i];
    return NULL;
}

/* Make the directories above `path` (as mkdir -p its dirname). */
static void make_parents(const char *path) {
    char dir[4096];
    size_t n = strlen(path);
    if (n >= sizeof dir)
        return;
    memcpy(dir, path, n + 1);
    for (char *p = dir + 1; *p; p++) {
        if (*p != '/')
            continue;
        *p = '\0';
        if (mkdir(dir, 0777) < 0 && errno != EEXIST)
            return;
        *p = '/';
    }
}

static void write_log(struct child *c, const char *data, size_t n) {
    if (c->log_failed)
        return;
    if (c->log_fd < 0) {
        int flags = O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC;
        c->log_fd = open(c->log_path, flags, 0666);
        if (c->log_fd < 0 && errno == ENOENT) {
            make_parents(c->log_path);
            c->log_fd = open(c->log_path, flags, 0666);
        }
        if (c->log_fd < 0) {
            fprintf(stderr, "hs-spawner: %s: %s (the job's output is dropped)\n", c->log_path,
                    strerror(errno));
            c->log_failed = 1;
            return;
        }
    }
    while (n > 0) {
        ssize_t w = write(c->log_fd, data, n);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            fprintf(stderr, "hs-spawner: %s: %s (the rest of the job's output is dropped)\n",
                    c->log_path, strerror(errno));
            c->log_failed = 1;
            return;
        }
        data += w;
        n -= (size_t)w;
    }
}

/* Done with the child's pipe. Out of the epoll set first: closing it would not take it out
 * while another process holds it, and a child being spawned does, for a moment after this
 * process runs on (the kernel closes an exec's close-on-exec descriptors after it lets the
 * vfork parent go): its end would be told again, of a child already forgotten. */
static void close_pipe(struct child *c) {
    if (epoll_ctl(epfd, EPOLL_CTL_DEL, c->pipe_fd, NULL) < 0)
        die("epoll_ctl");
    close(c->pipe_fd);
    c->pipe_fd = -1;
}

/* Whether the directory `path` holds nothing (no if it cannot be read). Here rather than in
 * the worker: Python's scandir of the empty directory cost the worker 7.5 us a job. */
static int dir_empty(const char *path) {
    int fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        return 0;
    static char buf[4096];
    int empty = 1;
    for (;;) {
        ssize_t n = getdents64(fd, buf, sizeof buf);
        if (n <= 0) {
            empty = empty && n == 0;
            break;
        }
        for (ssize_t off = 0; off < n && empty;) {
            struct dirent64 *d = (struct dirent64 *)(buf + off);
            if (strcmp(d->d_name, ".") != 0 && strcmp(d->d_name, "..") != 0)
                empty = 0;
            off += d->d_reclen;
        }
        if (!empty)
            break;
    }
    close(fd);
    return empty;
}

/* Tell of the child's end, its log complete, and forget it. */
static void finish(struct child *c) {
    if (c->pipe_fd >= 0)
        close_pipe(c);
    if (c->log_fd >= 0)
        close(c->log_fd);
    else if (c->log_path && !c->log_failed)
        unlink(c->log_path); /* an earlier run's, of the same attempt */
    reply(c->cwd && dir_empty(c->cwd) ? 'Y' : 'X', c->id, c->status);
    for (size_t i = 0; i < n_children; i++) {
        if (children[i] == c) {
            children[i] = children[--n_children];
            break;
        }
    }
    free(c->log_path);
    free(c->cwd);
    free(c);
}

/* The child's pipe is readable (or closed): one read, so that no read blocks. */
static void drain(struct child *c) {
    static char buf[65536];
    ssize_t n = read(c->pipe_fd, buf, sizeof buf);
    if (n < 0 && (errno == EINTR || errno == EAGAIN))
        return;
    if (n > 0) {
        write_log(c, buf, (size_t)n);
        return;
    }
    close_pipe(c); /* its end, or an error reading it */
    if (c->reaped)
        finish(c);
}

/* The executable for `name` as execvp finds it, in the PATH of the child's environment; a
 * relative entry of that PATH (or an empty one: the current directory) is the job's `cwd`'s. */
static int resolve(const char *name, char **env, const char *cwd, char *out, size_t size) {
    if (strchr(name, '/')) {
        if (strlen(name) >= size)
            return ENAMETOOLONG;
        strcpy(out, name);
        return 0;
    }
    const char *path = "/bin:/usr/bin";
    for (char **e = env; *e; e++)
        if (strncmp(*e, "PATH=", 5) == 0)
            path = *e + 5;
    int err = ENOENT;
    size_t n = strlen(name);
    for (const char *p = path;; p++) {
        const char *end = strchr(p, ':');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        const char *dir = len ? p : ".";
        size_t dlen = len ? len : 1;
        size_t clen = dir[0] == '/' ? 0 : strlen(cwd) + 1;
        if (clen + dlen + 1 + n < size) {
            if (clen) {
                memcpy(out, cwd, clen - 1);
                out[clen - 1] = '/';
            }
            memcpy(out + clen, dir, dlen);
            out[clen + dlen] = '/';
            memcpy(out + clen + dlen + 1, name, n + 1);
            struct stat st;
            if (stat(out, &st) == 0 && S_ISREG(st.st_mode)) {
                if (access(out, X_OK) == 0)
                    return 0;
                err = EACCES; /* as execvp: keep looking, report EACCES if nothing runs */
            }
        }
        if (!end)
            break;
        p = end;
    }
    return err;
}

/* The kernel's struct sigaction (x86-64 and arm64), for signals glibc's sigaction refuses. */
struct kernel_sigaction {
    void (*handler)(int);
    unsigned long flags;
    void (*restorer)(void);
    uint64_t mask;
};

/* The vfork child's errno when it could not exec (it shares this process's memory). */
static volatile int child_errno;
static sigset_t no_signals;
static struct sigaction default_action; /* SIG_DFL */

/* `fd` as the descriptor `target`, kept open across exec (dup2 of a descriptor onto itself
 * leaves its close-on-exec flag set). */
static int move_fd(int fd, int target) {
    if (fd == target)
        return fcntl(fd, F_SETFD, 0);
    return dup2(fd, target);
}

/* Start `path` as a child in a session of its own: stdout and stderr `out_fd`, stdin /dev/null,
 * `cwd`, every signal at its default and none blocked. Its pid; *err is 0, or the errno that
 * kept it from running (the child, if any, has been reaped).
 *
 * What posix_spawn did, without the cost that was the most of its own: glibc's child set every
 * one of the 64 signals to its default with a sigaction call each (POSIX_SPAWN_SETSIGDEF), and
 * each file action asked getrlimit first; 35-45 us of CPU a job of 520-560 here (a no-op job's
 * start, the parent and the child, measured). This process has no signal handler (main resets
 * every disposition at its start), so a vfork child can run no handler of ours, and only
 * SIGPIPE, which this process ignores, needs resetting. vfork's child shares this process's
 * memory and stack until it execs or exits: it only makes system calls. */
static pid_t start_child(const char *path, char **argv, char **env, const char *cwd,
                         int out_fd, int *err) {
    child_errno = 0;
    pid_t pid = vfork();
    if (pid == 0) {
        /* stdin last: out_fd could be 0 only if this process's stdin were closed */
        if (setsid() < 0 || move_fd(out_fd, 1) < 0 || move_fd(out_fd, 2) < 0 ||
            move_fd(devnull, 0) < 0 || chdir(cwd) < 0 ||
            sigaction(SIGPIPE, &default_action, NULL) < 0 ||
            sigprocmask(SIG_SETMASK, &no_signals, NULL) < 0) {
            child_errno = errno;
            _exit(127);
        }
        execve(path, argv, env);
        child_errno = errno;
        _exit(127);
    }
    if (pid < 0) {
        *err = errno;
        return -1;
    }
    /* vfork returns once the child has exec'd or exited */
    *err = child_errno;
    if (*err != 0)
        while (waitpid(pid, NULL, 0) < 0 && errno == EINTR) {
        }
    return pid;
}

/* A start: with `out_fd` as the output ('S'), or with a pipe read into a log file ('L',
 * out_fd < 0). */
static void spawn(const char *body, size_t size, int out_fd) {
    int logged = out_fd < 0;
    uint64_t id;
    uint32_t argc, envc, drain_ms = 0;
    size_t header = sizeof id + (logged ? 3 : 2) * sizeof argc;
    if (size < header) {
        fprintf(stderr, "hs-spawner: short spawn request\n");
        exit(2);
    }
    memcpy(&id, body, sizeof id);
    memcpy(&argc, body + sizeof id, sizeof argc);
    memcpy(&envc, body + sizeof id + sizeof argc, sizeof envc);
    if (logged)
        memcpy(&drain_ms, body + sizeof id + 2 * sizeof argc, sizeof drain_ms);
    const char *p = body + header, *end = body + size;
    if (argc == 0 || argc > MAX_STRINGS || envc > MAX_STRINGS) {
        reply('E', id, EINVAL);
        return;
    }
    char **strings = calloc((size_t)argc + envc + 3, sizeof(char *));
    if (!strings)
        die("calloc");
    const char *cwd = NULL, *log_path = NULL;
    size_t k = 0;
    uint32_t first = logged ? 2 : 1; /* the strings before argv */
    for (uint32_t i = 0; i < first + argc + envc; i++) {
        const char *nul = memchr(p, '\0', (size_t)(end - p));
        if (!nul) {
            fprintf(stderr, "hs-spawner: malformed spawn request\n");
            exit(2);
        }
        if (logged && i == 0)
            log_path = p;
        else if (i == first - 1)
            cwd = p;
        else
            strings[k++] = (char *)p;
        if (i == first - 1 + argc) /* the argv's NULL, then the env */
            strings[k++] = NULL;
        p = nul + 1;
    }
    char **argv = strings, **env = strings + argc + 1;

    char path[4096];
    int err = resolve(argv[0], env, cwd, path, sizeof path);
    int pipe_fds[2] = {-1, -1};
    if (err == 0 && logged) {
        if (pipe2(pipe_fds, O_CLOEXEC) < 0)
            err = errno;
        else
            out_fd = pipe_fds[1];
    }
    if (err == 0) {
        pid_t pid = start_child(path, argv, env, cwd, out_fd, &err);
        if (err == 0) {
            struct child *c = remember(pid, id);
            if (logged) {
                c->pipe_fd = pipe_fds[0];
                c->drain_ms = drain_ms;
                c->log_path = strdup(log_path);
                c->cwd = strdup(cwd);
                if (!c->log_path || !c->cwd)
                    die("strdup");
                struct epoll_event ev = {.events = EPOLLIN, .data.ptr = c};
                if (epoll_ctl(epfd, EPOLL_CTL_ADD, c->pipe_fd, &ev) < 0)
                    die("epoll_ctl");
                pipe_fds[0] = -1;
            }
            reply('P', id, pid);
        }
    }
    if (pipe_fds[1] >= 0)
        close(pipe_fds[1]); /* the child's now */
    if (pipe_fds[0] >= 0)
        close(pipe_fds[0]);
    if (err != 0)
        reply('E', id, err);
    free(strings);
}

static void signal_group(const char *body, size_t size) {
    uint64_t id;
    int32_t sig;
    if (size < sizeof id + sizeof sig) {
        fprintf(stderr, "hs-spawner: short kill request\n");
        exit(2);
    }
    memcpy(&id, body, sizeof id);
    memcpy(&sig, body + sizeof id, sizeof sig);
    struct child *c = find_running(id);
    if (c)
        kill(-c->pid, sig);
}

static void reap(void) {
    for (;;) {
        int status;
        pid_t pid = waitpid(-1, &status, WNOHANG);
        if (pid <= 0)
            return;
        for (size_t i = 0; i < n_children; i++) {
            struct child *c = children[i];
            if (c->pid == pid && !c->reaped) {
                c->reaped = 1;
                c->status = status;
                /* The group dies with its leader, killed here at once: while any of its
                 * processes lives, the group's id (the leader's pid) cannot be reused. */
                kill(-pid, SIGKILL);
                if (c->pipe_fd < 0)
                    finish(c);
                else /* its output may still be in the pipe, or the group about to close it */
                    c->deadline_ms = now_ms() + c->drain_ms;
                break;
            }
        }
    }
}

static void serve_request(void) {
    static char buf[MAX_PACKET];
    char control[CMSG_SPACE(4 * sizeof(int))];
    struct iovec iov = {buf, sizeof buf};
    struct msghdr msg = {0};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = sizeof control;
    ssize_t n = recvmsg(sock, &msg, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
    if (n < 0) {
        if (errno == EAGAIN || errno == EINTR)
            return;
        if (errno == ECONNRESET)
            exit(0);
        die("recvmsg");
    }
    if (n == 0)
        exit(0); /* the worker closed its end */
    int fds[4], nfds = 0;
    for (struct cmsghdr *c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c)) {
        if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
            int k = (int)((c->cmsg_len - CMSG_LEN(0)) / sizeof(int));
            for (int i = 0; i < k && nfds < 4; i++)
                memcpy(&fds[nfds++], CMSG_DATA(c) + i * sizeof(int), sizeof(int));
        }
    }
    if (msg.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) {
        fprintf(stderr, "hs-spawner: request truncated\n");
        exit(2);
    }
    if (buf[0] == 'S' && nfds == 1)
        spawn(buf + 1, (size_t)n - 1, fds[0]);
    else if (buf[0] == 'L' && nfds == 0)
        spawn(buf + 1, (size_t)n - 1, -1);
    else if (buf[0] == 'K' && nfds == 0)
        signal_group(buf + 1, (size_t)n - 1);
    else {
        fprintf(stderr, "hs-spawner: unknown request %c with %d descriptors\n", buf[0], nfds);
        exit(2);
    }
    for (int i = 0; i < nfds; i++)
        close(fds[i]);
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: hs-spawner FD (a SOCK_SEQPACKET socket to the worker)\n");
        return 2;
    }
    sock = atoi(argv[1]);
    if (fcntl(sock, F_SETFD, FD_CLOEXEC) < 0)
        die("fcntl");
    devnull = open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (devnull < 0)
        die("open /dev/null");
    sigset_t chld;
    sigemptyset(&chld);
    sigaddset(&chld, SIGCHLD);
    if (sigprocmask(SIG_BLOCK, &chld, NULL) < 0)
        die("sigprocmask");
    int sfd = signalfd(-1, &chld, SFD_CLOEXEC | SFD_NONBLOCK);
    if (sfd < 0)
        die("signalfd");
    /* No handler and nothing ignored that a child would inherit (start_child relies on it):
     * every signal at its default, then SIGPIPE ignored here (each child's is reset). By the
     * system call itself: glibc's sigaction refuses its own signals (32 and 33), which can
     * come ignored too (CI once saw 32 ignored in a job). */
    sigemptyset(&no_signals);
    default_action.sa_handler = SIG_DFL;
    for (int sig = 1; sig <= 64; sig++) {
        struct kernel_sigaction dfl = {0}; /* SIG_DFL, no flags, nothing masked */
        if (sig != SIGKILL && sig != SIGSTOP)
            syscall(SYS_rt_sigaction, sig, &dfl, NULL, sizeof dfl.mask);
    }
    signal(SIGPIPE, SIG_IGN);
    epfd = epoll_create1(EPOLL_CLOEXEC);
    if (epfd < 0)
        die("epoll_create1");
    struct epoll_event ev = {.events = EPOLLIN, .data.ptr = &sock_tag};
    if (epoll_ctl(epfd, EPOLL_CTL_ADD, sock, &ev) < 0)
        die("epoll_ctl");
    ev.data.ptr = &signal_tag;
    if (epoll_ctl(epfd, EPOLL_CTL_ADD, sfd, &ev) < 0)
        die("epoll_ctl");
    struct epoll_event events[64];
    for (;;) {
        /* Until the soonest deadline of a reaped child's pipe, if any. */
        int timeout = -1;
        int64_t now = -1;
        for (size_t i = 0; i < n_children; i++) {
            struct child *c = children[i];
            if (!c->reaped)
                continue;
            if (now < 0)
                now = now_ms();
            int64_t left = c->deadline_ms > now ? c->deadline_ms - now : 0;
            if (timeout < 0 || left < timeout)
                timeout = (int)left;
        }
        send_replies(); /* this turn's, before waiting for the next */
        int n = epoll_wait(epfd, events, 64, timeout);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            die("epoll_wait");
        }
        int requests = 0, hangup = 0;
        for (int i = 0; i < n; i++) {
            void *tag = events[i].data.ptr;
            if (tag == &signal_tag) {
                struct signalfd_siginfo info;
                while (read(sfd, &info, sizeof info) > 0) {
                }
                reap();
            } else if (tag == &sock_tag) {
                if (events[i].events & EPOLLIN)
                    requests = 1;
                else
                    hangup = 1;
            } else {
                drain(tag);
            }
        }
        if (requests) {
            /* Several requests per wakeup: the worker sends a delivery's starts together. */
            for (int i = 0; i < 64; i++) {
                struct pollfd one = {sock, POLLIN, 0};
                if (i > 0 && poll(&one, 1, 0) <= 0)
                    break;
                serve_request();
            }
        } else if (hangup) {
            return 0;
        }
        /* The pipes whose time is up: what escaped the group keeps them open. */
        now = -1;
        for (size_t i = 0; i < n_children;) {
            struct child *c = children[i];
            if (c->reaped && c->pipe_fd >= 0) {
                if (now < 0)
                    now = now_ms();
                if (now >= c->deadline_ms) {
                    finish(c); /* moves the last child to i */
                    continue;
                }
            }
            i++;
        }
    }
}
