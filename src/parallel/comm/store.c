// The TCP rendezvous store (store.h): a server thread on rank 0 running one poll() loop over its listening
// socket and its clients, and a client side in which every wait is a poll() with a deadline.
#include "parallel/comm/store.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

enum { OP_HELLO = 1, OP_SET = 2, OP_GET = 3, OP_ADD = 4 };
enum { ST_OK = 0, ST_VALUE = 1, ST_TIMEOUT = 2, ST_ERROR = 3 };

#define REQ_MAGIC "KSRQ"
#define REP_MAGIC "KSRP"
#define REQ_HEADER_BYTES 16
#define REP_HEADER_BYTES 12
#define PROTOCOL_VERSION 1
#define MAX_ERROR_TEXT 512
// What the server holds at most (keys and values), and what it says when a set would go past that
#define KILN_STORE_MAX_TOTAL ((size_t)256 << 20)
#define STORE_FULL                                                                                           \
    "the store holds 256 MiB already; rendezvous needs a few bytes per rank, is a rank looping?"
// A client waits this much longer for a reply than the server's own deadline for it (network and scheduling)
#define REPLY_SLACK_S 1.0

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

// Milliseconds from now to deadline for poll(), rounded up, at least 0.
static int ms_until(double deadline) {
    double ms = (deadline - now_s()) * 1e3;
    if (ms <= 0)
        return 0;
    return ms > 1e9 ? 1000000000 : (int)ms + 1;
}

static void sleep_s(double s) {
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

static void put_u32(unsigned char *p, uint32_t x) {
    p[0] = (unsigned char)(x >> 24), p[1] = (unsigned char)(x >> 16), p[2] = (unsigned char)(x >> 8);
    p[3] = (unsigned char)x;
}
static uint32_t get_u32(const unsigned char *p) {
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | (uint32_t)p[3];
}
static void put_u64(unsigned char *p, uint64_t x) {
    put_u32(p, (uint32_t)(x >> 32));
    put_u32(p + 4, (uint32_t)x);
}
static uint64_t get_u64(const unsigned char *p) {
    return (uint64_t)get_u32(p) << 32 | get_u32(p + 4);
}

static int set_nonblocking(int fd) {
    int fl = fcntl(fd, F_GETFL);
    return fl < 0 ? -1 : fcntl(fd, F_SETFL, fl | O_NONBLOCK);
}

static void set_nodelay(int fd) { // one small request, one small reply: no Nagle delays
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

// ---- the server ---------------------------------------------------------------------------------

struct entry {
    char *key;
    unsigned char *val; // (n)
    size_t n;
};

struct conn {
    int fd;
    int greeted; // sent a valid hello: one of the job's ranks
    int dead;    // to be closed at the end of this loop iteration
    unsigned char hdr[REQ_HEADER_BYTES];
    size_t hdr_got;
    unsigned char *body; // key then value (body_len)
    size_t body_len, body_got;
    char *wait_key;       // a get waiting for its key, or NULL
    double wait_deadline; // ... until then (now_s() clock)
    unsigned char *out;   // the reply being written (out_len bytes, out_sent of them sent)
    size_t out_len, out_sent;
    int close_after_write; // a protocol error was answered: hang up once the answer is out
};

struct server {
    int listen_fd;
    int wake[2]; // a pipe: kiln_store_close wakes the loop through it
    int world;
    pthread_t thread;
    struct entry *entries;
    size_t n_entries, cap_entries;
    struct conn **conns;
    size_t n_conns, cap_conns;
    long greeted_total, greeted_now; // ranks that said hello so far, and those still connected
    size_t stored_bytes;             // keys and values held, against KILN_STORE_MAX_TOTAL
    double accept_paused_until;      // accept failed for want of descriptors: leave the listener until then

    pthread_mutex_t mu; // guards what kiln_store_close tells the loop:
    int closing;        // stop once every rank has come and gone, or at drain_deadline
    double drain_deadline;
    int stop; // stop now
};

static struct entry *entry_find(struct server *sv, const char *key) {
    for (size_t i = 0; i < sv->n_entries; i++)
        if (!strcmp(sv->entries[i].key, key))
            return &sv->entries[i];
    return NULL;
}

// Stores a copy of val under key (replacing the old value): 0, or -1 when that would take the store past
// KILN_STORE_MAX_TOTAL bytes (a rogue client must not take rank 0's memory).
static int entry_put(struct server *sv, const char *key, const unsigned char *val, size_t n) {
    struct entry *e = entry_find(sv, key);
    size_t old = e ? e->n : 0, added = e ? 0 : strlen(key) + 1;
    if (sv->stored_bytes - old + added + n > KILN_STORE_MAX_TOTAL)
        return -1;
    sv->stored_bytes = sv->stored_bytes - old + added + n;
    if (!e) {
        if (sv->n_entries == sv->cap_entries) {
            sv->cap_entries = sv->cap_entries ? 2 * sv->cap_entries : 64;
            sv->entries = kiln_xrealloc(sv->entries, sv->cap_entries * sizeof(*sv->entries));
        }
        e = &sv->entries[sv->n_entries++];
        e->key = kiln_xstrdup(key);
        e->val = NULL;
    }
    free(e->val);
    e->val = kiln_xmalloc(n);
    memcpy(e->val, val, n);
    e->n = n;
    return 0;
}

// Sends what the socket takes now of c's queued replies; the rest goes out when poll says it can.
static void conn_write(struct conn *c) {
    while (c->out_sent < c->out_len) {
        ssize_t k = send(c->fd, c->out + c->out_sent, c->out_len - c->out_sent, MSG_NOSIGNAL);
        if (k < 0 && errno == EINTR)
            continue;
        if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return;
        if (k <= 0) {
            c->dead = 1;
            return;
        }
        c->out_sent += (size_t)k;
    }
    c->out_len = c->out_sent = 0;
    if (c->close_after_write)
        c->dead = 1;
}

// Queues a reply on c and sends what the socket takes now (the rest goes out when poll says it can).
static void conn_reply(struct conn *c, int status, const void *payload, size_t n) {
    c->out = kiln_xrealloc(c->out, c->out_len + REP_HEADER_BYTES + n);
    unsigned char *h = c->out + c->out_len;
    memcpy(h, REP_MAGIC, 4);
    h[4] = (unsigned char)status;
    h[5] = h[6] = h[7] = 0;
    put_u32(h + 8, (uint32_t)n);
    if (n)
        memcpy(h + REP_HEADER_BYTES, payload, n);
    c->out_len += REP_HEADER_BYTES + n;
    conn_write(c);
}

// Answers a protocol error with its text, then hangs up: after garbage the stream cannot be trusted.
static void conn_refuse(struct conn *c, const char *why) {
    c->close_after_write = 1;
    conn_reply(c, ST_ERROR, why, strlen(why));
}

// Answers every get waiting for key.
static void wake_waiters(struct server *sv, const char *key, const struct entry *e) {
    for (size_t i = 0; i < sv->n_conns; i++) {
        struct conn *c = sv->conns[i];
        if (c->wait_key && !strcmp(c->wait_key, key)) {
            free(c->wait_key);
            c->wait_key = NULL;
            conn_reply(c, ST_VALUE, e->val, e->n);
        }
    }
}

// Checks a complete request header: 0, or a refusal already sent.
static int check_header(struct conn *c) {
    const unsigned char *h = c->hdr;
    if (memcmp(h, REQ_MAGIC, 4) != 0) { // not one of ours (a port scan, an HTTP probe): hang up silently
        c->dead = 1;
        return -1;
    }
    int op = h[4];
    uint32_t klen = get_u32(h + 8), vlen = get_u32(h + 12);
    const char *why = NULL;
    if (h[5] || h[6] || h[7] || op < OP_HELLO || op > OP_ADD)
        why = "bad request header";
    else if (klen > KILN_STORE_MAX_KEY || vlen > KILN_STORE_MAX_VALUE)
        why = "request too large (keys up to 255 bytes, values up to 1 MiB)";
    else if (!c->greeted && op != OP_HELLO)
        why = "the first request must be a hello";
    else if (op == OP_HELLO ? (klen != 0 || vlen != 8) : klen == 0)
        why = "bad request lengths";
    else if ((op == OP_GET || op == OP_ADD) && vlen != 8)
        why = "bad request lengths";
    if (why) {
        conn_refuse(c, why);
        return -1;
    }
    c->body_len = (size_t)klen + vlen;
    c->body_got = 0;
    c->body = kiln_xmalloc(c->body_len + 1);
    return 0;
}

// Carries out a complete request.
static void handle_request(struct server *sv, struct conn *c) {
    int op = c->hdr[4];
    size_t klen = get_u32(c->hdr + 8), vlen = c->body_len - klen;
    char key[KILN_STORE_MAX_KEY + 1];
    memcpy(key, c->body, klen);
    key[klen] = '\0';
    const unsigned char *val = c->body + klen;
    if (strlen(key) != klen) {
        conn_refuse(c, "key contains a NUL byte");
        return;
    }
    switch (op) {
    case OP_HELLO: {
        uint32_t version = get_u32(val), world = get_u32(val + 4);
        char why[MAX_ERROR_TEXT];
        if (version != PROTOCOL_VERSION) {
            snprintf(why, sizeof(why), "rank 0 speaks store protocol %d, this rank %u; run one kiln build",
                     PROTOCOL_VERSION, version);
            conn_refuse(c, why);
        } else if ((int)world != sv->world) {
            snprintf(
                why, sizeof(why),
                "rank 0's store is for a world of %d ranks, this rank's is %u; launch every rank with the "
                "same WORLD_SIZE",
                sv->world, world);
            conn_refuse(c, why);
        } else {
            c->greeted = 1;
            sv->greeted_total++;
            sv->greeted_now++;
            conn_reply(c, ST_OK, NULL, 0);
        }
        break;
    }
    case OP_SET:
        if (entry_put(sv, key, val, vlen)) {
            conn_reply(c, ST_ERROR, STORE_FULL, strlen(STORE_FULL));
            break;
        }
        conn_reply(c, ST_OK, NULL, 0);
        wake_waiters(sv, key, entry_find(sv, key));
        break;
    case OP_GET: {
        struct entry *e = entry_find(sv, key);
        uint64_t ms = get_u64(val);
        if (e) {
            conn_reply(c, ST_VALUE, e->val, e->n);
        } else if (ms == 0) {
            conn_reply(c, ST_TIMEOUT, NULL, 0);
        } else {
            c->wait_key = kiln_xstrdup(key);
            c->wait_deadline = now_s() + (double)ms * 1e-3;
        }
        break;
    }
    case OP_ADD: {
        struct entry *e = entry_find(sv, key);
        if (e && e->n != 8) {
            const char *why = "the key holds a value that is not a counter";
            conn_reply(c, ST_ERROR, why, strlen(why));
            break;
        }
        unsigned char sum[8];
        put_u64(sum, (e ? get_u64(e->val) : 0) + get_u64(val));
        if (entry_put(sv, key, sum, 8)) {
            conn_reply(c, ST_ERROR, STORE_FULL, strlen(STORE_FULL));
            break;
        }
        conn_reply(c, ST_VALUE, sum, 8);
        wake_waiters(sv, key, entry_find(sv, key));
        break;
    }
    }
}

// Reads what the socket has: completes and handles requests; marks c dead on end of stream or garbage.
static void conn_read(struct server *sv, struct conn *c) {
    while (!c->dead) {
        int busy = c->wait_key || c->out_len; // a request is in progress: the client must wait for its reply
        unsigned char *dst;
        size_t want;
        unsigned char scratch[1];
        if (busy)
            dst = scratch, want = 1;
        else if (c->hdr_got < REQ_HEADER_BYTES)
            dst = c->hdr + c->hdr_got, want = REQ_HEADER_BYTES - c->hdr_got;
        else
            dst = c->body + c->body_got, want = c->body_len - c->body_got;
        ssize_t k = want ? recv(c->fd, dst, want, 0) : 0;
        if (want && k < 0 && errno == EINTR)
            continue;
        if (want && k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return;
        if (want && k <= 0) { // end of stream or reset: the client left
            c->dead = 1;
            return;
        }
        if (busy) { // a second request before the first one's reply: not our client
            c->dead = 1;
            return;
        }
        if (c->hdr_got < REQ_HEADER_BYTES) {
            c->hdr_got += (size_t)k;
            if (c->hdr_got == REQ_HEADER_BYTES && check_header(c))
                return;
            continue;
        }
        c->body_got += (size_t)k;
        if (c->body_got == c->body_len) {
            handle_request(sv, c);
            free(c->body);
            c->body = NULL;
            c->hdr_got = 0;
        }
    }
}

static void conn_free(struct conn *c) {
    close(c->fd);
    free(c->body);
    free(c->wait_key);
    free(c->out);
    free(c);
}

static void server_accept(struct server *sv) {
    for (;;) {
        int fd = accept(sv->listen_fd, NULL, NULL);
        if (fd < 0) {
            if (errno == EINTR || errno == ECONNABORTED)
                continue;
            // out of descriptors (EMFILE and the like): the listener stays readable, so stop polling it for a
            // while rather than spin; the client retries its connect
            if (errno != EAGAIN && errno != EWOULDBLOCK)
                sv->accept_paused_until = now_s() + 0.1;
            return;
        }
        if (set_nonblocking(fd) != 0 || fcntl(fd, F_SETFD, FD_CLOEXEC) != 0) {
            close(fd);
            continue;
        }
        set_nodelay(fd);
        if (sv->n_conns == sv->cap_conns) {
            sv->cap_conns = sv->cap_conns ? 2 * sv->cap_conns : 16;
            sv->conns = kiln_xrealloc(sv->conns, sv->cap_conns * sizeof(*sv->conns));
        }
        struct conn *c = kiln_xcalloc(1, sizeof(*c));
        c->fd = fd;
        sv->conns[sv->n_conns++] = c;
    }
}

static void *server_main(void *arg) {
    struct server *sv = arg;
    size_t pfds_cap = 16;
    struct pollfd *pfds = kiln_xmalloc(pfds_cap * sizeof(*pfds));
    for (;;) {
        double now = now_s();
        double next = -1; // the earliest deadline the loop must wake for
        for (size_t i = 0; i < sv->n_conns; i++) {
            struct conn *c = sv->conns[i];
            if (!c->wait_key)
                continue;
            if (now >= c->wait_deadline) {
                free(c->wait_key);
                c->wait_key = NULL;
                conn_reply(c, ST_TIMEOUT, NULL, 0);
            } else if (next < 0 || c->wait_deadline < next) {
                next = c->wait_deadline;
            }
        }
        pthread_mutex_lock(&sv->mu);
        int stop = sv->stop, closing = sv->closing;
        double drain_deadline = sv->drain_deadline;
        pthread_mutex_unlock(&sv->mu);
        if (stop)
            break;
        if (closing) {
            if ((sv->greeted_total >= sv->world && sv->greeted_now == 0) || now >= drain_deadline)
                break;
            if (next < 0 || drain_deadline < next)
                next = drain_deadline;
        }

        if (pfds_cap < sv->n_conns + 2) {
            pfds_cap = 2 * (sv->n_conns + 2);
            pfds = kiln_xrealloc(pfds, pfds_cap * sizeof(*pfds));
        }
        pfds[0] = (struct pollfd){.fd = sv->wake[0], .events = POLLIN};
        int accepting = now >= sv->accept_paused_until;
        if (!accepting && (next < 0 || sv->accept_paused_until < next))
            next = sv->accept_paused_until;
        pfds[1] = (struct pollfd){.fd = accepting ? sv->listen_fd : -1, .events = POLLIN};
        size_t n_polled = sv->n_conns;
        for (size_t i = 0; i < n_polled; i++) {
            struct conn *c = sv->conns[i];
            pfds[2 + i] =
                (struct pollfd){.fd = c->fd, .events = (short)(POLLIN | (c->out_len ? POLLOUT : 0))};
        }
        int rc = poll(pfds, 2 + n_polled, next < 0 ? -1 : ms_until(next));
        if (rc < 0 && errno != EINTR)
            break; // cannot happen with valid descriptors; clients see the connection drop
        if (rc <= 0)
            continue;
        if (pfds[0].revents) {
            char drain[64];
            while (read(sv->wake[0], drain, sizeof(drain)) > 0) {
            }
        }
        for (size_t i = 0; i < n_polled; i++) {
            struct conn *c = sv->conns[i];
            short ev = pfds[2 + i].revents;
            if (ev & POLLOUT)
                conn_write(c);
            if (ev & (POLLIN | POLLHUP | POLLERR))
                conn_read(sv, c);
        }
        if (accepting && pfds[1].revents)
            server_accept(sv);
        size_t kept = 0;
        for (size_t i = 0; i < sv->n_conns; i++) {
            struct conn *c = sv->conns[i];
            if (c->dead) {
                if (c->greeted)
                    sv->greeted_now--;
                conn_free(c);
            } else {
                sv->conns[kept++] = c;
            }
        }
        sv->n_conns = kept;
    }
    // whoever is still connected is dropped: a client waiting on us gets an error, not a hang
    for (size_t i = 0; i < sv->n_conns; i++)
        conn_free(sv->conns[i]);
    sv->n_conns = 0;
    free(pfds);
    return NULL;
}

static int is_loopback(const struct sockaddr *sa) {
    if (sa->sa_family == AF_INET)
        return (ntohl(((const struct sockaddr_in *)sa)->sin_addr.s_addr) >> 24) == 127;
    if (sa->sa_family == AF_INET6) {
        const struct in6_addr *a = &((const struct sockaddr_in6 *)sa)->sin6_addr;
        return IN6_IS_ADDR_LOOPBACK(a) || (IN6_IS_ADDR_V4MAPPED(a) && a->s6_addr[12] == 127);
    }
    return 0;
}

// Binds and listens (in the caller's thread, so that a port in use is an error of kiln_store_open), then
// starts the loop. *connect_host: where rank 0's own client connects (the bound loopback address, or
// 127.0.0.1 when bound on every interface); *bound_port: the port bound.
static int server_start(struct server **out, const char *addr, int port, int world, char *connect_host,
                        size_t host_cap, int *bound_port, struct kiln_error *err) {
    char port_s[16];
    snprintf(port_s, sizeof(port_s), "%d", port);
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_NUMERICSERV};
    struct addrinfo *res = NULL;
    int family = AF_INET, loopback = 0;
    struct sockaddr_storage sa;
    socklen_t sa_len = sizeof(struct sockaddr_in);
    memset(&sa, 0, sizeof(sa));
    if (getaddrinfo(addr, port_s, &hints, &res) == 0 && res) {
        family = res->ai_family == AF_INET6 ? AF_INET6 : AF_INET;
        loopback = is_loopback(res->ai_addr);
        if (loopback) {
            memcpy(&sa, res->ai_addr, res->ai_addrlen);
            family = res->ai_family;
        }
    }
    if (res)
        freeaddrinfo(res);
    if (loopback) {
        sa_len = family == AF_INET6 ? sizeof(struct sockaddr_in6) : sizeof(struct sockaddr_in);
    } else if (family == AF_INET6) { // every interface, IPv4 too (dual stack)
        struct sockaddr_in6 *a6 = (struct sockaddr_in6 *)&sa;
        a6->sin6_family = AF_INET6;
        a6->sin6_addr = in6addr_any;
        a6->sin6_port = htons((uint16_t)port);
        sa_len = sizeof(*a6);
    }
    int fd = socket(family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0 && family == AF_INET6 && !loopback)
        family = AF_INET; // a host without IPv6: every IPv4 interface
    if (!loopback && family == AF_INET) {
        struct sockaddr_in *a4 = (struct sockaddr_in *)&sa;
        memset(&sa, 0, sizeof(sa));
        a4->sin_family = AF_INET;
        a4->sin_addr.s_addr = htonl(INADDR_ANY);
        a4->sin_port = htons((uint16_t)port);
        sa_len = sizeof(*a4);
        if (fd < 0)
            fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    }
    if (fd < 0)
        return kiln_errorf(err, KILN_ERR_RUNTIME, "serving the TCP store (%s:%d): cannot create a socket: %s",
                           addr, port, strerror(errno));
    int one = 1, zero = 0;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)); // restart at once after a crash (TIME_WAIT)
    if (family == AF_INET6 && !loopback)
        setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof(zero));
    if (bind(fd, (struct sockaddr *)&sa, sa_len) != 0) {
        int e = errno;
        close(fd);
        if (e == EADDRINUSE)
            return kiln_errorf(
                err, KILN_ERR_USAGE,
                "serving the TCP store (%s:%d): port %d is already in use on this host; another "
                "job, or an earlier run still exiting, holds it: pick another MASTER_PORT",
                addr, port, port);
        return kiln_errorf(
            err, KILN_ERR_USAGE,
            "serving the TCP store (%s:%d): cannot bind: %s; check MASTER_ADDR, or pick another "
            "MASTER_PORT",
            addr, port, strerror(e));
    }
    if (listen(fd, SOMAXCONN) != 0 || set_nonblocking(fd) != 0) {
        int e = errno;
        close(fd);
        return kiln_errorf(err, KILN_ERR_RUNTIME, "serving the TCP store (%s:%d): cannot listen: %s", addr,
                           port, strerror(e));
    }
    struct sockaddr_storage bound;
    socklen_t bound_len = sizeof(bound);
    memset(&bound, 0, sizeof(bound));
    *bound_port = port;
    if (getsockname(fd, (struct sockaddr *)&bound, &bound_len) == 0)
        *bound_port = ntohs(bound.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&bound)->sin6_port
                                                        : ((struct sockaddr_in *)&bound)->sin_port);
    if (!loopback || getnameinfo((struct sockaddr *)&sa, sa_len, connect_host, (socklen_t)host_cap, NULL, 0,
                                 NI_NUMERICHOST))
        snprintf(connect_host, host_cap, "127.0.0.1");

    struct server *sv = kiln_xcalloc(1, sizeof(*sv));
    sv->listen_fd = fd;
    sv->world = world;
    if (pipe(sv->wake) != 0) {
        int e = errno;
        close(fd);
        free(sv);
        return kiln_errorf(err, KILN_ERR_RUNTIME, "serving the TCP store (%s:%d): cannot create a pipe: %s",
                           addr, port, strerror(e));
    }
    set_nonblocking(sv->wake[0]);
    fcntl(sv->wake[0], F_SETFD, FD_CLOEXEC);
    fcntl(sv->wake[1], F_SETFD, FD_CLOEXEC);
    pthread_mutex_init(&sv->mu, NULL);
    int e = pthread_create(&sv->thread, NULL, server_main, sv);
    if (e != 0) {
        close(fd);
        close(sv->wake[0]);
        close(sv->wake[1]);
        pthread_mutex_destroy(&sv->mu);
        free(sv);
        return kiln_errorf(err, KILN_ERR_RUNTIME,
                           "serving the TCP store (%s:%d): cannot start its thread: %s", addr, port,
                           strerror(e));
    }
    *out = sv;
    return 0;
}

// Stops the loop: at once (drain_s < 0), or once every rank has come and gone, at most drain_s from now.
static void server_stop(struct server *sv, double drain_s) {
    pthread_mutex_lock(&sv->mu);
    if (drain_s < 0)
        sv->stop = 1;
    sv->closing = 1;
    sv->drain_deadline = now_s() + (drain_s < 0 ? 0 : drain_s);
    pthread_mutex_unlock(&sv->mu);
    char c = 1;
    while (write(sv->wake[1], &c, 1) < 0 && errno == EINTR) {
    }
    pthread_join(sv->thread, NULL);
    close(sv->listen_fd);
    close(sv->wake[0]);
    close(sv->wake[1]);
    pthread_mutex_destroy(&sv->mu);
    for (size_t i = 0; i < sv->n_entries; i++) {
        free(sv->entries[i].key);
        free(sv->entries[i].val);
    }
    free(sv->entries);
    free(sv->conns);
    free(sv);
}

// ---- the client ---------------------------------------------------------------------------------

struct kiln_store {
    int fd;             // -1 once the connection was lost (every later call fails)
    char addr[256];     // as given, for messages
    int port;           // the store's port
    int world;          // ranks in the job
    double timeout_s;   // for set, add and the server's drain at close
    uint64_t barriers;  // barrier calls so far: the n-th call of every rank meets the others'
    struct server *srv; // rank 0: the server
};

// The connection is lost or out of step: close it, so that every later call fails at once.
static void client_break(struct kiln_store *s) {
    if (s->fd >= 0)
        close(s->fd);
    s->fd = -1;
}

static int lost_error(struct kiln_store *s, const char *what, int e, struct kiln_error *err) {
    client_break(s);
    if (e == 0)
        return kiln_errorf(
            err, KILN_ERR_RUNTIME,
            "%s (TCP store at %s:%d): the server closed the connection; rank 0 exited or crashed, "
            "see its log",
            what, s->addr, s->port);
    return kiln_errorf(err, KILN_ERR_RUNTIME,
                       "%s (TCP store at %s:%d): connection lost: %s; rank 0 exited or crashed, see its log",
                       what, s->addr, s->port, strerror(e));
}

static int silent_error(struct kiln_store *s, const char *what, double waited_s, struct kiln_error *err) {
    client_break(s);
    return kiln_errorf(err, KILN_ERR_RUNTIME,
                       "%s (TCP store at %s:%d): no reply after %.1f s; rank 0 is not answering (stopped, "
                       "overloaded, or the network is down)",
                       what, s->addr, s->port, waited_s);
}

// Waits until the connection can take (POLLOUT) or give (POLLIN) more, by the deadline: 0, or the error of a
// dead or silent server.
static int wait_ready(struct kiln_store *s, short events, double deadline, double started, const char *what,
                      struct kiln_error *err) {
    struct pollfd pfd = {.fd = s->fd, .events = events};
    int rc = poll(&pfd, 1, ms_until(deadline));
    if (rc < 0 && errno != EINTR)
        return lost_error(s, what, errno, err);
    if (rc == 0)
        return silent_error(s, what, now_s() - started, err);
    return 0;
}

static int send_all(struct kiln_store *s, const unsigned char *p, size_t n, double deadline, double started,
                    const char *what, struct kiln_error *err) {
    while (n) {
        ssize_t k = send(s->fd, p, n, MSG_NOSIGNAL);
        if (k > 0) {
            p += k, n -= (size_t)k;
            continue;
        }
        if (k < 0 && errno == EINTR)
            continue;
        if (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK)
            return lost_error(s, what, errno, err);
        int rc = wait_ready(s, POLLOUT, deadline, started, what, err);
        if (rc)
            return rc;
    }
    return 0;
}

static int recv_all(struct kiln_store *s, unsigned char *p, size_t n, double deadline, double started,
                    const char *what, struct kiln_error *err) {
    while (n) {
        ssize_t k = recv(s->fd, p, n, 0);
        if (k > 0) {
            p += k, n -= (size_t)k;
            continue;
        }
        if (k == 0)
            return lost_error(s, what, 0, err);
        if (errno == EINTR)
            continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK)
            return lost_error(s, what, errno, err);
        int rc = wait_ready(s, POLLIN, deadline, started, what, err);
        if (rc)
            return rc;
    }
    return 0;
}

// One request and its reply: *status, and the payload in *payload (malloc'd, *n bytes; NULL when empty).
// An error reply is returned as an error carrying the server's text. deadline: for the whole exchange.
static int request(struct kiln_store *s, int op, const char *key, const unsigned char *val, size_t vlen,
                   double deadline, const char *what, int *status, unsigned char **payload, size_t *n,
                   struct kiln_error *err) {
    double started = now_s();
    *status = -1;
    *payload = NULL;
    *n = 0;
    if (s->fd < 0)
        return kiln_errorf(
            err, KILN_ERR_RUNTIME,
            "%s (TCP store at %s:%d): the connection was lost earlier; rank 0 exited or crashed, "
            "see its log",
            what, s->addr, s->port);
    size_t klen = strlen(key);
    unsigned char *msg = kiln_xmalloc(REQ_HEADER_BYTES + klen + vlen);
    memcpy(msg, REQ_MAGIC, 4);
    msg[4] = (unsigned char)op;
    msg[5] = msg[6] = msg[7] = 0;
    put_u32(msg + 8, (uint32_t)klen);
    put_u32(msg + 12, (uint32_t)vlen);
    memcpy(msg + REQ_HEADER_BYTES, key, klen);
    if (vlen)
        memcpy(msg + REQ_HEADER_BYTES + klen, val, vlen);
    int rc = send_all(s, msg, REQ_HEADER_BYTES + klen + vlen, deadline, started, what, err);
    free(msg);
    if (rc)
        return rc;

    unsigned char h[REP_HEADER_BYTES];
    if ((rc = recv_all(s, h, sizeof(h), deadline, started, what, err)))
        return rc;
    uint32_t len = get_u32(h + 8);
    if (memcmp(h, REP_MAGIC, 4) != 0 || h[5] || h[6] || h[7] || h[4] > ST_ERROR ||
        len > (h[4] == ST_VALUE   ? KILN_STORE_MAX_VALUE
               : h[4] == ST_ERROR ? MAX_ERROR_TEXT
                                  : 0)) {
        client_break(s);
        return kiln_errorf(
            err, KILN_ERR_RUNTIME,
            "%s (TCP store at %s:%d): the reply is not the store's protocol; is another service "
            "on that port? check MASTER_ADDR/MASTER_PORT",
            what, s->addr, s->port);
    }
    unsigned char *body = kiln_xmalloc((size_t)len + 1);
    if ((rc = recv_all(s, body, len, deadline, started, what, err))) {
        free(body);
        return rc;
    }
    body[len] = '\0';
    if (h[4] == ST_ERROR) {
        rc = kiln_errorf(err, KILN_ERR_RUNTIME, "%s (TCP store at %s:%d): %s", what, s->addr, s->port,
                         (const char *)body);
        free(body);
        return rc;
    }
    *status = h[4];
    *payload = body;
    *n = len;
    return 0;
}

// A key the caller may use: 1..255 bytes.
static int check_key(const struct kiln_store *s, const char *op, const char *key, struct kiln_error *err) {
    size_t n = key ? strlen(key) : 0;
    if (n == 0 || n > KILN_STORE_MAX_KEY)
        return kiln_errorf(err, KILN_ERR_USAGE,
                           "store %s (TCP store at %s:%d): key of %zu bytes; keys are 1 to %d bytes", op,
                           s->addr, s->port, n, KILN_STORE_MAX_KEY);
    return 0;
}

// One connection attempt to host:port that waits at most until deadline. 0 and *fd_out, or -1 and the
// reason in why.
static int connect_once(const char *host, int port, double deadline, int *fd_out, char *why, size_t why_cap) {
    char port_s[16];
    snprintf(port_s, sizeof(port_s), "%d", port);
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_NUMERICSERV};
    struct addrinfo *res = NULL;
    int rc = getaddrinfo(host, port_s, &hints, &res);
    if (rc != 0) {
        snprintf(why, why_cap, "cannot resolve %.200s: %s", host, gai_strerror(rc));
        return -1;
    }
    for (struct addrinfo *ai = res; ai; ai = ai->ai_next) {
        int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
        if (fd < 0) {
            snprintf(why, why_cap, "%s", strerror(errno));
            continue;
        }
        int e = 0;
        if (connect(fd, ai->ai_addr, ai->ai_addrlen) != 0) {
            e = errno;
            if (e == EINPROGRESS || e == EINTR) {
                struct pollfd pfd = {.fd = fd, .events = POLLOUT};
                int prc;
                while ((prc = poll(&pfd, 1, ms_until(deadline))) < 0 && errno == EINTR) {
                }
                socklen_t elen = sizeof(e);
                if (prc == 0)
                    e = ETIMEDOUT;
                else if (prc < 0 || getsockopt(fd, SOL_SOCKET, SO_ERROR, &e, &elen) != 0)
                    e = errno;
            }
        }
        if (e == 0) {
            // connecting to a free port of this host in the ephemeral range can connect the socket to itself
            // (TCP simultaneous open): that is no server
            struct sockaddr_storage me, peer;
            socklen_t me_len = sizeof(me), peer_len = sizeof(peer);
            if (getsockname(fd, (struct sockaddr *)&me, &me_len) == 0 &&
                getpeername(fd, (struct sockaddr *)&peer, &peer_len) == 0 && me_len == peer_len &&
                !memcmp(&me, &peer, me_len))
                e = ECONNREFUSED;
        }
        if (e == 0) {
            freeaddrinfo(res);
            set_nodelay(fd);
            *fd_out = fd;
            return 0;
        }
        snprintf(why, why_cap, "%s", strerror(e));
        close(fd);
    }
    freeaddrinfo(res);
    return -1;
}

// Connects (retrying until deadline) and says hello.
static int client_connect(struct kiln_store *s, const char *host, double started, double deadline,
                          struct kiln_error *err) {
    char why[512] = "no attempt finished";
    double backoff = 0.01;
    for (;;) {
        if (connect_once(host, s->port, deadline, &s->fd, why, sizeof(why)) == 0)
            break;
        double left = deadline - now_s();
        if (left <= 0)
            return kiln_errorf(
                err, KILN_ERR_RUNTIME,
                "connecting to the TCP store (%s:%d): no connection after %.1f s (last error: %s); "
                "is rank 0 running? check MASTER_ADDR/MASTER_PORT",
                s->addr, s->port, now_s() - started, why);
        sleep_s(backoff < left ? backoff : left);
        backoff = backoff * 2 < 0.25 ? backoff * 2 : 0.25;
    }
    unsigned char hello[8];
    put_u32(hello, PROTOCOL_VERSION);
    put_u32(hello + 4, (uint32_t)s->world);
    int status = -1;
    unsigned char *payload;
    size_t n;
    double hello_deadline = deadline > now_s() + REPLY_SLACK_S ? deadline : now_s() + REPLY_SLACK_S;
    int rc =
        request(s, OP_HELLO, "", hello, sizeof(hello), hello_deadline, "joining", &status, &payload, &n, err);
    free(payload);
    if (rc)
        return rc;
    if (status != ST_OK) {
        client_break(s);
        return kiln_errorf(
            err, KILN_ERR_RUNTIME,
            "joining (TCP store at %s:%d): unexpected reply to hello; is another service on that "
            "port? check MASTER_ADDR/MASTER_PORT",
            s->addr, s->port);
    }
    return 0;
}

int kiln_store_open(struct kiln_store **out, const char *addr, int port, int is_server, int world,
                    double timeout_s, struct kiln_error *err) {
    *out = NULL;
    if (!addr || !*addr || strlen(addr) >= 256)
        return kiln_errorf(err, KILN_ERR_USAGE,
                           "opening the TCP store (MASTER_ADDR): no address, or longer than 255 bytes; set "
                           "MASTER_ADDR to rank 0's host");
    if (port < (is_server ? 0 : 1) || port > 65535)
        return kiln_errorf(err, KILN_ERR_USAGE,
                           "opening the TCP store (%s:%d): port outside 1..65535; set "
                           "MASTER_PORT",
                           addr, port);
    if (world < 1 || !(timeout_s >= 0))
        return kiln_errorf(err, KILN_ERR_USAGE,
                           "opening the TCP store (%s:%d): world %d, timeout %g s; need a "
                           "world of 1 or more and a timeout of 0 or more",
                           addr, port, world, timeout_s);
    double started = now_s();
    struct kiln_store *s = kiln_xcalloc(1, sizeof(*s));
    s->fd = -1;
    snprintf(s->addr, sizeof(s->addr), "%s", addr);
    s->port = port;
    s->world = world;
    s->timeout_s = timeout_s;
    char host[256];
    snprintf(host, sizeof(host), "%s", addr);
    if (is_server) {
        int rc = server_start(&s->srv, addr, port, world, host, sizeof(host), &s->port, err);
        if (rc) {
            free(s);
            return rc;
        }
    }
    int rc = client_connect(s, host, started, started + timeout_s, err);
    if (rc) {
        client_break(s);
        if (s->srv)
            server_stop(s->srv, -1);
        free(s);
        return rc;
    }
    *out = s;
    return 0;
}

int kiln_store_port(const struct kiln_store *s) {
    return s->port;
}

int kiln_store_set(struct kiln_store *s, const char *key, const void *val, size_t n, struct kiln_error *err) {
    int rc = check_key(s, "set", key, err);
    if (rc)
        return rc;
    if (n > KILN_STORE_MAX_VALUE)
        return kiln_errorf(
            err, KILN_ERR_USAGE,
            "store set '%s' (TCP store at %s:%d): value of %zu bytes; values are up to %u bytes", key,
            s->addr, s->port, n, KILN_STORE_MAX_VALUE);
    char what[300];
    snprintf(what, sizeof(what), "store set '%s'", key);
    int status = -1;
    unsigned char *payload;
    size_t len;
    rc = request(s, OP_SET, key, val, n, now_s() + s->timeout_s + REPLY_SLACK_S, what, &status, &payload,
                 &len, err);
    free(payload);
    return rc;
}

// A get as the protocol has it: *found says whether the key was set within timeout_s; the value goes to
// buf as in kiln_store_get.
static int get_raw(struct kiln_store *s, const char *key, const char *what, void *buf, size_t cap, size_t *n,
                   double timeout_s, int *found, struct kiln_error *err) {
    unsigned char ms[8];
    double t = timeout_s > 0 ? (timeout_s < 1e9 ? timeout_s : 1e9) : 0; // 1e9 s: forever, as a number
    put_u64(ms, (uint64_t)(t * 1e3 + (t > 0 ? 1 : 0)));
    int status = -1;
    unsigned char *payload;
    size_t len;
    int rc = request(s, OP_GET, key, ms, sizeof(ms), now_s() + t + REPLY_SLACK_S, what, &status, &payload,
                     &len, err);
    if (rc)
        return rc;
    *found = status == ST_VALUE;
    if (*found && len > cap) {
        free(payload);
        return kiln_errorf(
            err, KILN_ERR_RUNTIME,
            "%s (TCP store at %s:%d): the value is %zu bytes, more than the %zu the caller holds; "
            "the ranks disagree on what the key holds",
            what, s->addr, s->port, len, cap);
    }
    if (*found && len)
        memcpy(buf, payload, len);
    if (n)
        *n = *found ? len : 0;
    free(payload);
    return 0;
}

int kiln_store_get(struct kiln_store *s, const char *key, void *buf, size_t cap, size_t *n, double timeout_s,
                   struct kiln_error *err) {
    int rc = check_key(s, "get", key, err);
    if (rc)
        return rc;
    char what[300];
    snprintf(what, sizeof(what), "store get '%s'", key);
    double started = now_s();
    int found;
    if ((rc = get_raw(s, key, what, buf, cap, n, timeout_s, &found, err)))
        return rc;
    if (!found)
        return kiln_errorf(
            err, KILN_ERR_RUNTIME,
            "%s (TCP store at %s:%d): not set after waiting %.1f s; the rank that sets it has not "
            "got there (it crashed, or is slower than the timeout)",
            what, s->addr, s->port, now_s() - started);
    return 0;
}

int kiln_store_try_get(struct kiln_store *s, const char *key, void *buf, size_t cap, size_t *n,
                       double timeout_s, int *found, struct kiln_error *err) {
    int rc = check_key(s, "get", key, err);
    if (rc)
        return rc;
    char what[300];
    snprintf(what, sizeof(what), "store get '%s'", key);
    return get_raw(s, key, what, buf, cap, n, timeout_s, found, err);
}

int kiln_store_local_addr(const struct kiln_store *s, char *buf, size_t cap) {
    struct sockaddr_storage ss;
    socklen_t len = sizeof(ss);
    if (s->fd < 0 || getsockname(s->fd, (struct sockaddr *)&ss, &len) ||
        getnameinfo((struct sockaddr *)&ss, len, buf, (socklen_t)cap, NULL, 0, NI_NUMERICHOST))
        return -1;
    return 0;
}

int kiln_store_add(struct kiln_store *s, const char *key, int64_t delta, int64_t *out,
                   struct kiln_error *err) {
    int rc = check_key(s, "add", key, err);
    if (rc)
        return rc;
    char what[300];
    snprintf(what, sizeof(what), "store add '%s'", key);
    unsigned char d[8];
    put_u64(d, (uint64_t)delta);
    int status = -1;
    unsigned char *payload;
    size_t len;
    rc = request(s, OP_ADD, key, d, sizeof(d), now_s() + s->timeout_s + REPLY_SLACK_S, what, &status,
                 &payload, &len, err);
    if (rc)
        return rc;
    if (status != ST_VALUE || len != 8) {
        free(payload);
        client_break(s);
        return kiln_errorf(err, KILN_ERR_RUNTIME,
                           "%s (TCP store at %s:%d): malformed reply; is another service "
                           "on that port? check MASTER_ADDR/MASTER_PORT",
                           what, s->addr, s->port);
    }
    if (out)
        *out = (int64_t)get_u64(payload);
    free(payload);
    return 0;
}

int kiln_store_barrier(struct kiln_store *s, const char *name, double timeout_s, struct kiln_error *err) {
    if (!name || !*name || strlen(name) > 200)
        return kiln_errorf(err, KILN_ERR_USAGE,
                           "store barrier (TCP store at %s:%d): a barrier's name is 1 to 200 bytes", s->addr,
                           s->port);
    double started = now_s();
    char what[300], count_key[KILN_STORE_MAX_KEY + 1], done_key[KILN_STORE_MAX_KEY + 1];
    snprintf(what, sizeof(what), "store barrier '%s'", name);
    unsigned long long seq = (unsigned long long)s->barriers++;
    snprintf(count_key, sizeof(count_key), "kiln/barrier/%llu/%s/count", seq, name);
    snprintf(done_key, sizeof(done_key), "kiln/barrier/%llu/%s/done", seq, name);
    int64_t arrived = 0;
    int rc = kiln_store_add(s, count_key, 1, &arrived, err);
    if (rc)
        return rc;
    if (arrived >= s->world) { // the last to arrive lets everyone go
        unsigned char one = 1;
        return kiln_store_set(s, done_key, &one, 1, err);
    }
    double left = timeout_s - (now_s() - started);
    unsigned char flag;
    size_t n;
    int found;
    if ((rc = get_raw(s, done_key, what, &flag, 1, &n, left > 0 ? left : 0, &found, err)))
        return rc;
    if (found)
        return 0;
    unsigned char count[8];
    if ((rc = get_raw(s, count_key, what, count, sizeof(count), &n, 0, &found, err)))
        return rc;
    return kiln_errorf(err, KILN_ERR_RUNTIME,
                       "%s (TCP store at %s:%d): %lld of %d ranks arrived in %.1f s; the others have not got "
                       "there (they crashed, or are slower than the timeout)",
                       what, s->addr, s->port,
                       found && n == 8 ? (long long)get_u64(count) : (long long)arrived, s->world,
                       now_s() - started);
}

void kiln_store_close(struct kiln_store *s) {
    if (!s)
        return;
    client_break(s);
    if (s->srv)
        server_stop(s->srv, s->timeout_s);
    free(s);
}

void kiln_store_close_now(struct kiln_store *s) {
    if (!s)
        return;
    client_break(s);
    if (s->srv)
        server_stop(s->srv, -1);
    free(s);
}
