/*
 * tensorlane.h: the C ABI of tensorlane (libtensorlane.so, built with
 * `go build -buildmode=c-shared ./cmd/libtensorlane`).
 *
 * A small, handle-based API: no Go type crosses it. Runtimes are uint64
 * handles made from a JSON config; memory is (pointer, length); a Ref is
 * opaque bytes (a few hundred) that travel on any channel; results that are
 * text (Explain, stats, ref info) are JSON written into the caller's buffer.
 *
 * Every function returns 0 on success or an error kind (TL_E_*, the names
 * of rdt.ErrorKind); tl_last_error gives the calling thread's last error
 * message. A JSON or ref output buffer that is too small yields
 * TL_E_TOO_SMALL with *len set to the size needed. No call panics across
 * the boundary, every call is safe from many threads, and every blocking
 * call is bounded (timeout_ms, 0 = the runtime's transfer timeout).
 *
 * Stable: functions are only ever added; kinds keep their numbers.
 */
#ifndef TENSORLANE_H
#define TENSORLANE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

enum {
	TL_OK = 0,
	TL_E_OTHER = 1,
	TL_E_INVALID_ARGUMENT = 2,
	TL_E_OWNER_DIED = 3,
	TL_E_PEER_UNREACHABLE = 4,
	TL_E_OBJECT_NOT_FOUND = 5,
	TL_E_OBJECT_FREED = 6,
	TL_E_STALE_REF = 7,
	TL_E_UNAUTHORIZED = 8,
	TL_E_MALFORMED_REF = 9,
	TL_E_OUT_OF_MEMORY = 10,
	TL_E_TOO_SMALL = 11,
	TL_E_NO_PATH = 12,
	TL_E_UNKNOWN_DEVICE = 13,
	TL_E_CORRUPT = 14,
	TL_E_STALLED = 15,
	TL_E_PEER_CLOSED = 16,
	TL_E_BAD_REQUEST = 17,
	TL_E_CLOSED = 18,
	TL_E_TIMEOUT = 19,
	TL_E_CANCELED = 20,
	TL_E_OWNER_CLOSED = 21,    /* the owner is shutting down */
	TL_E_LAYOUT_MISMATCH = 22, /* the ref's layout is not the one its owner published (forged or corrupted) */
	TL_E_NO_ZERO_COPY = 23,    /* tl_view: no path maps the object here (another host, shm not allowed) */
};

/* The ABI version (1) and the kind names ("owner_died", ...). */
int tl_abi_version(void);
const char *tl_kind_name(int kind);
/* The calling thread's last error: returns its kind, copies the message. */
int tl_last_error(char *msg, size_t cap, size_t *len);

/* Runtimes. config_json may be NULL or "" for the defaults (see
 * internal/capi.Config: preset, hosts, discover, host, listen, data_addr,
 * cluster_key, allow, deny, transfer_timeout_ms, sim_devices, host_memory,
 * log_level, lazy_staging, stage_pool_bytes, slabs, pool_bytes, slab_bytes;
 * TENSORLANE_SLABS and TENSORLANE_POOL_BYTES apply when slabs/pool_bytes are
 * absent). tl_runtime_close is idempotent; tl_shutdown_all closes every
 * runtime of the process (call it at exit). */
int tl_runtime_new(const char *config_json, uint64_t *rt);
int tl_runtime_close(uint64_t rt);
int tl_shutdown_all(void);

/* Shareable host memory (memfd backed): Put of a region inside it costs no
 * copy on any path. Free with tl_free_memory; published objects keep their
 * part alive until they are freed. */
int tl_alloc(uint64_t rt, int64_t nbytes, void **ptr);
int tl_free_memory(uint64_t rt, void *ptr);

/* Publish a tensor at ptr (nbytes cover its span from ptr). dtype is a name
 * ("float32", "bfloat16", "int64", ...); shape and strides are in elements,
 * strides NULL for row-major. Foreign memory (not from tl_alloc) must stay
 * alive and unchanged until tl_free returns: network paths read it in
 * place, a same-host reader in another process makes the owner copy it once
 * into shareable memory. The marshalled Ref goes to ref_out. */
int tl_put(uint64_t rt, void *ptr, int64_t nbytes, const char *dtype, int32_t ndim,
           const int64_t *shape, const int64_t *strides,
           uint8_t *ref_out, size_t ref_cap, size_t *ref_len);

/* Read a Ref's tensor into the caller's buffer (dst_len >= its span), or
 * into new shareable memory (*ptr, *nbytes; free with tl_free_memory). op,
 * when not 0, names the read for tl_cancel. */
int tl_get_into(uint64_t rt, const uint8_t *ref, size_t ref_len, void *dst, int64_t dst_len,
                uint64_t op, int64_t timeout_ms);
int tl_get(uint64_t rt, const uint8_t *ref, size_t ref_len, uint64_t op, int64_t timeout_ms,
           void **ptr, int64_t *nbytes);
/* Zero-copy read on one host: map the Ref's tensor read-only into this
 * process (*ptr, *nbytes: its span; writing faults) under a fresh grant,
 * and return a handle for tl_view_release, which unmaps it. The mapping
 * stays valid until then, even after the owner frees the object (its
 * memory is never reused). Like tl_get it takes a lease: drop it with
 * tl_release when done with the Ref. Fails when no path
 * maps the object (TL_E_NO_ZERO_COPY: another host, or shm not allowed): copy with tl_get
 * then. Flags: TL_VIEW_POPULATE builds the page tables in the call, for a
 * reader that will touch every byte. tl_view_release is idempotent. */
#define TL_VIEW_POPULATE 1u
int tl_view(uint64_t rt, const uint8_t *ref, size_t ref_len, uint32_t flags, uint64_t op, int64_t timeout_ms,
            uint64_t *view, void **ptr, int64_t *nbytes);
int tl_view_release(uint64_t rt, uint64_t view);
/* Cancel the read named op; returns TL_OK if one was in flight, else
 * TL_E_OBJECT_NOT_FOUND. */
int tl_cancel(uint64_t rt, uint64_t op);

/* A reader is done with a Ref (drops its lease); the owner asks for the
 * object to be freed once no reader holds it. */
int tl_release(uint64_t rt, const uint8_t *ref, size_t ref_len);
/* The owner revokes an object and waits (timeout_ms) until no read uses its
 * memory; then foreign memory may be let go. Idempotent. */
int tl_free(uint64_t rt, const uint8_t *ref, size_t ref_len, int64_t timeout_ms);

/* JSON: which path a read would take and why (and, for the owner, whether
 * foreign memory was copied); a Ref's dtype, shape, strides, nbytes; the
 * runtime's counters. */
int tl_explain(uint64_t rt, const uint8_t *ref, size_t ref_len, char *out, size_t cap, size_t *len);
int tl_ref_info(const uint8_t *ref, size_t ref_len, char *out, size_t cap, size_t *len);
int tl_stats(uint64_t rt, char *out, size_t cap, size_t *len);

/* Batches: a state dict in one call each way. n items (0..65536); refs are
 * packed back to back in one buffer, ref i being ref_lens[i] bytes.
 *
 * tl_put_batch publishes n tensors as tl_put does (ptrs[i], nbytes[i],
 * dtypes[i], ndims[i]; shapes and strides hold every item's dims one item
 * after another, strides NULL for all row-major): all or nothing, a refusal
 * names its item and publishes none. The refs go back to back to refs_out
 * (ref_lens[i] each, *total in all; TL_E_TOO_SMALL with *total set when
 * refs_cap is short, and then nothing stays published).
 *
 * tl_get_batch reads n refs into new shareable memory (ptrs[i], nbytes[i];
 * free each with tl_free_memory): one lease request per owner, the transfers
 * coalesced per owner and path. tl_view_batch maps n refs read-only as
 * tl_view does (views[i] for tl_view_release), an owner's slab mapped once
 * for all the objects in it. Both fill codes[i] with each item's kind (0 for
 * success; outputs of failed items are 0) and return TL_OK when every item
 * succeeded, else the first failed item's kind, with tl_last_error naming
 * the item. Successful items are the caller's either way. op names the whole
 * batch for tl_cancel. */
int tl_put_batch(uint64_t rt, int32_t n, void *const *ptrs, const int64_t *nbytes, const char *const *dtypes,
                 const int32_t *ndims, const int64_t *shapes, const int64_t *strides,
                 uint8_t *refs_out, size_t refs_cap, size_t *ref_lens, size_t *total);
int tl_get_batch(uint64_t rt, int32_t n, const uint8_t *refs, const size_t *ref_lens, uint64_t op, int64_t timeout_ms,
                 void **ptrs, int64_t *nbytes, int32_t *codes);
int tl_view_batch(uint64_t rt, int32_t n, const uint8_t *refs, const size_t *ref_lens, uint32_t flags, uint64_t op,
                  int64_t timeout_ms, uint64_t *views, void **ptrs, int64_t *nbytes, int32_t *codes);

#ifdef __cplusplus
}
#endif
#endif
