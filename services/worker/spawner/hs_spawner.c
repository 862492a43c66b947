/*
 * hs-spawner: starts and reaps a worker's job processes, so that the worker's Python does not.
 *
 * A no-op job's process costs the worker more to start from Python (subprocess.Popen's own
 * code, a vfork of a big process, a pidfd and its epoll registration, a waitpid) than the job
 * itself costs to run: this small process does the starting with posix_spawn, waits for its
 * children through a signalfd, and tells the worker over one socket. See
 * services/worker/spawner/__init__.py for the protocol and the Python side.
 *
 * Requests (one SOCK_SEQPACKET packet each, integers in native byte order):
 *   'S' u64 id, u32 argc, u32 envc, then NUL-terminated strings: cwd, argv[0..argc), env[0..envc);
 *       exactly one descriptor as ancillary data: the process's stdout and stderr.
 *   'K' u64 id, i32 signal: signal the process group of attempt `id`, if its leader has not
 *       been reaped yet (a pid is never signalled after it could have been reused).
 * Replies (one packet each):
 *   'P' u64 id, i32 pid      started
 *   'E' u64 id, i32 errno    not started (the command not found, not executable, ...)
 *   'X' u64 id, i32 status   ended (the wait status, as waitpid gives it); whatever else was
 *                            left in its process group has been sent SIGKILL
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
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#define MAX_PACKET (1 << 20)
#define MAX_STRINGS 65536

struct child {
    pid_t pid;
    uint64_t id;
};

static struct child *children;
static size_t n_children, cap_children;
static int sock = -1;
static int devnull = -1;

static void die(const char *what) {
    fprintf(stderr, "hs-spawner: %s: %s\n", what, strerror(errno));
    exit(2);
}

static void reply(char kind, uint64_t id, int32_t value) {
    char out[1 + sizeof id + sizeof value];
    out[0] = kind;
    memcpy(out + 1, &id, sizeof id);
    memcpy(out + 1 + sizeof id, &value, sizeof value);
    while (send(sock, out, sizeof out, MSG_NOSIGNAL) < 0) {
        if (errno == EINTR)
            continue;
        if (errno == EPIPE || errno == ECONNRESET)
            exit(0); /* the worker is gone */
        die("send");
    }
}

static void remember(pid_t pid, uint64_t id) {
    if (n_children == cap_children) {
        cap_children = cap_children ? 2 * cap_children : 256;
        children = realloc(children, cap_children * sizeof *children);
        if (!children)
            die("realloc");
    }
    children[n_children].pid = pid;
    children[n_children].id = id;
    n_children++;
}

static struct child *find_id(uint64_t id) {
    for (size_t i = 0; i < n_children; i++)
        if (children[i].id == id)
            return &children[i];
    return NULL;
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

static void spawn(const char *body, size_t size, int out_fd) {
    uint64_t id;
    uint32_t argc, envc;
    if (size < sizeof id + 2 * sizeof argc) {
        fprintf(stderr, "hs-spawner: short spawn request\n");
        exit(2);
    }
    memcpy(&id, body, sizeof id);
    memcpy(&argc, body + sizeof id, sizeof argc);
    memcpy(&envc, body + sizeof id + sizeof argc, sizeof envc);
    const char *p = body + sizeof id + 2 * sizeof argc, *end = body + size;
    if (argc == 0 || argc > MAX_STRINGS || envc > MAX_STRINGS) {
        reply('E', id, EINVAL);
        return;
    }
    char **strings = calloc((size_t)argc + envc + 3, sizeof(char *));
    if (!strings)
        die("calloc");
    const char *cwd = NULL;
    size_t k = 0;
    for (uint32_t i = 0; i < 1 + argc + envc; i++) {
        const char *nul = memchr(p, '\0', (size_t)(end - p));
        if (!nul) {
            fprintf(stderr, "hs-spawner: malformed spawn request\n");
            exit(2);
        }
        if (i == 0)
            cwd = p;
        else
            strings[k++] = (char *)p;
        if (i == argc) /* the argv's NULL, then the env */
            strings[k++] = NULL;
        p = nul + 1;
    }
    char **argv = strings, **env = strings + argc + 1;

    char path[4096];
    int err = resolve(argv[0], env, cwd, path, sizeof path);
    if (err == 0) {
        posix_spawn_file_actions_t actions;
        posix_spawnattr_t attr;
        sigset_t none, all;
        sigemptyset(&none);
        sigfillset(&all);
        posix_spawn_file_actions_init(&actions);
        posix_spawnattr_init(&attr);
        posix_spawn_file_actions_adddup2(&actions, devnull, 0);
        posix_spawn_file_actions_adddup2(&actions, out_fd, 1);
        posix_spawn_file_actions_adddup2(&actions, out_fd, 2);
        posix_spawn_file_actions_addchdir_np(&actions, cwd);
        posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSID | POSIX_SPAWN_SETSIGMASK |
                                            POSIX_SPAWN_SETSIGDEF);
        posix_spawnattr_setsigmask(&attr, &none);
        posix_spawnattr_setsigdefault(&attr, &all);
        pid_t pid;
        err = posix_spawn(&pid, path, &actions, &attr, argv, env);
        posix_spawn_file_actions_destroy(&actions);
        posix_spawnattr_destroy(&attr);
        if (err == 0) {
            remember(pid, id);
            reply('P', id, pid);
        }
    }
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
    struct child *c = find_id(id);
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
            if (children[i].pid == pid) {
                uint64_t id = children[i].id;
                children[i] = children[--n_children];
                /* The group dies with its leader, killed here at once: while any of its
                 * processes lives, the group's id (the leader's pid) cannot be reused. */
                kill(-pid, SIGKILL);
                reply('X', id, status);
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
    signal(SIGPIPE, SIG_IGN);
    struct pollfd fds[2] = {{sock, POLLIN, 0}, {sfd, POLLIN, 0}};
    for (;;) {
        if (poll(fds, 2, -1) < 0) {
            if (errno == EINTR)
                continue;
            die("poll");
        }
        if (fds[1].revents) {
            struct signalfd_siginfo info;
            while (read(sfd, &info, sizeof info) > 0) {
            }
            reap();
        }
        if (fds[0].revents & POLLIN) {
            /* Several requests per wakeup: the worker sends a delivery's starts together. */
            for (int i = 0; i < 64; i++) {
                struct pollfd one = {sock, POLLIN, 0};
                if (i > 0 && poll(&one, 1, 0) <= 0)
                    break;
                serve_request();
            }
        } else if (fds[0].revents & (POLLHUP | POLLERR)) {
            return 0;
        }
    }
}
