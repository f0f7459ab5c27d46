// A small TCP key-value store for rendezvous, as torch.distributed's TCPStore: rank 0 serves it at
// MASTER_ADDR:MASTER_PORT from a thread of its own, and every rank (rank 0 too, over loopback) is a client
// that sets keys, waits for keys and meets the others at barriers. NCCL's unique id travels through it when
// the job did not come from mpirun.
//
// Every blocking call has a timeout; a server that died (connection reset, end of stream in the middle of a
// request) is an error, never a hang. Keys are 1..255 bytes, values 0..1 MiB. Keys beginning
// "kiln/barrier/" are the store's own. A struct kiln_store is one client connection: use it from one thread
// at a time.
//
// The wire protocol (big-endian integers), one request and one reply at a time on each connection:
//   request  "KSRQ", op (1 byte), 3 zero bytes, key length (4), value length (4), key, value
//   reply    "KSRP", status (1 byte), 3 zero bytes, payload length (4), payload
// The first request on a connection is a hello carrying the client's world size, which the server checks
// against its own. A get carries its timeout in milliseconds and the server answers it when the key is set
// or the time is up, so a waiting client holds no polling loop. The server answers a malformed request
// with an error and hangs up (bytes that are not the protocol at all, without a word).
#ifndef KILN_COMM_STORE_H
#define KILN_COMM_STORE_H

#include <stddef.h>
#include <stdint.h>

#include "util/error.h"

#ifdef __cplusplus
extern "C" {
#endif

#define KILN_STORE_MAX_KEY 255
#define KILN_STORE_MAX_VALUE (1u << 20)

struct kiln_store;

// Opens the store. With is_server (rank 0), first serves it: binds port on addr when addr is a loopback
// address (127.0.0.1, localhost, ::1), otherwise on every interface, as TCPStore does (the name a job gives
// rank 0 may resolve elsewhere on rank 0's own host); a port in use is a usage error naming addr:port; port 0
// takes a free port (kiln_store_port says which). Then connects as a client: rank 0 over loopback, the others
// to addr:port, retrying until timeout_s (rank 0 may start later); on timeout the error names addr:port, the
// seconds waited and the last connect error. world: the ranks that will connect, for barriers and close.
// timeout_s also bounds each set and the server's wait in kiln_store_close.
int kiln_store_open(struct kiln_store **out, const char *addr, int port, int is_server, int world,
                    double timeout_s, struct kiln_error *err);

// The port the store is on (the one the server bound when opened with port 0).
int kiln_store_port(const struct kiln_store *s);

// Sets key to the n bytes at val (replacing an earlier value), and wakes the ranks waiting for it.
int kiln_store_set(struct kiln_store *s, const char *key, const void *val, size_t n, struct kiln_error *err);

// Waits until key is set (at most timeout_s; 0 only looks), then copies its value into buf (cap bytes) and
// its length into *n. A value longer than cap, and a key still unset at the timeout, are errors naming the
// key (the latter with the seconds waited).
int kiln_store_get(struct kiln_store *s, const char *key, void *buf, size_t cap, size_t *n, double timeout_s,
                   struct kiln_error *err);

// As kiln_store_get, but a key still unset after timeout_s is no error: *found says whether it was set (for
// callers that poll, such as kiln launch watching for another node's failure).
int kiln_store_try_get(struct kiln_store *s, const char *key, void *buf, size_t cap, size_t *n,
                       double timeout_s, int *found, struct kiln_error *err);

// The address this client's connection comes from, as the server sees it (numeric), e.g. "10.1.0.2": the
// address by which the others can reach this host. 0, or -1 when the connection is lost.
int kiln_store_local_addr(const struct kiln_store *s, char *buf, size_t cap);

// Adds delta to the 64-bit counter at key (0 when unset) and returns the sum in *out (may be NULL).
int kiln_store_add(struct kiln_store *s, const char *key, int64_t delta, int64_t *out,
                   struct kiln_error *err);

// Returns when all `world` ranks have called kiln_store_barrier with this name, or fails after timeout_s with
// an error saying how many of them arrived. Every rank must call the same barriers in the same order (the
// n-th barrier call of each rank meets the others' n-th), so one name may be used again. name: up to 200
// bytes.
int kiln_store_barrier(struct kiln_store *s, const char *name, double timeout_s, struct kiln_error *err);

// Closes the connection. The server's rank also waits until every one of the world ranks has connected and
// disconnected again (at most the open's timeout_s, so a rank that died costs time, not a hang), then stops
// the server thread, which drops whoever is still connected, and closes its socket. NULL is fine.
void kiln_store_close(struct kiln_store *s);

// As kiln_store_close, but the server stops at once, without waiting for the others: for a rank that gives
// up (the others then see the connection lost). NULL is fine.
void kiln_store_close_now(struct kiln_store *s);

#ifdef __cplusplus
}
#endif

#endif
