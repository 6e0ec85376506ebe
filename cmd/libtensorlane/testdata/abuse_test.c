/* Hostile input through every entry point of libtensorlane, as a careless or
 * malicious C caller would pass it: NULL pointers, lengths that are negative
 * numbers passed as size_t, lengths of 2^31 and 2^32+n, handles that are 0,
 * random, closed or another runtime's, a shape with a zero dimension, a ref
 * with a forged shape. Every call must return a kind (never crash, never an
 * internal error), and a refusal must leave a message. Then a seeded random
 * walk over the same values. Exits 0 when every check passed.
 *
 * What no C library can check is not tried: a non-NULL pointer to less
 * memory than the length says (a length is only refused when it is
 * impossible, past any address space or any ref). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tensorlane.h"

static int failures, calls;
#define CHECK(cond, ...) do { if (!(cond)) { failures++; fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__); fprintf(stderr, __VA_ARGS__); fprintf(stderr, "\n"); } } while (0)

static const char *last(void) {
	static char msg[4096];
	tl_last_error(msg, sizeof msg, NULL);
	return msg;
}

/* A call's code is a known kind; a refusal has a message and is not an
 * internal error (a panic caught at the boundary). */
static int ok_kind(int rc, const char *what) {
	calls++;
	if (rc < 0 || (rc != TL_E_OTHER && strcmp(tl_kind_name(rc), "other") == 0)) { /* no kind of the library's */
		CHECK(0, "%s: unknown kind %d", what, rc);
		return rc;
	}
	if (rc != TL_OK) {
		const char *m = last();
		CHECK(strlen(m) > 0, "%s: kind %s without a message", what, tl_kind_name(rc));
		CHECK(strstr(m, "internal error") == NULL, "%s: %s", what, m);
	}
	return rc;
}

#define EXPECT(call, want) do { int rc_ = ok_kind((call), #call); CHECK(rc_ == (want), "%s: got %s (%s), want %s", #call, tl_kind_name(rc_), rc_ ? last() : "", tl_kind_name(want)); } while (0)

static uint64_t seed = 0x2545F4914F6CDD1DULL;
static uint64_t next(void) {
	seed ^= seed << 13;
	seed ^= seed >> 7;
	seed ^= seed << 17;
	return seed;
}
#define PICK(arr) (arr[next() % (sizeof arr / sizeof arr[0])])

int main(void) {
	const size_t huge_sizes[] = {(size_t)1 << 31, ((size_t)1 << 32) + 5, (size_t)-1, (size_t)-5, (size_t)1 << 63};

	/* tl_last_error: a NULL buffer has no room, whatever cap says (it
	 * used to abort the process). */
	EXPECT(tl_runtime_new("{\"nope\":1}", &(uint64_t){0}), TL_E_INVALID_ARGUMENT);
	size_t need = 0;
	CHECK(tl_last_error(NULL, 64, &need) == TL_E_INVALID_ARGUMENT && need > 1, "last error into NULL: need %zu", need);
	CHECK(tl_last_error(NULL, (size_t)-1, NULL) == TL_E_INVALID_ARGUMENT, "last error into NULL, no length");
	char tiny[8];
	CHECK(tl_last_error(tiny, sizeof tiny, &need) == TL_E_INVALID_ARGUMENT && strlen(tiny) == sizeof tiny - 1, "truncated message");
	CHECK(strcmp(tl_kind_name(-1), "other") == 0 && strcmp(tl_kind_name(1 << 30), "other") == 0, "kind names out of range");

	/* Runtimes: NULL outputs, bad config, unknown and closed handles. */
	EXPECT(tl_runtime_new("{}", NULL), TL_E_INVALID_ARGUMENT);
	EXPECT(tl_runtime_new("{\"host_memory\":-1,", &(uint64_t){0}), TL_E_INVALID_ARGUMENT);
	uint64_t a = 0, b = 0, closed = 0;
	const char *cfg = "{\"allow\":[\"shm\"]}";
	EXPECT(tl_runtime_new(cfg, &a), TL_OK);
	EXPECT(tl_runtime_new(cfg, &b), TL_OK);
	EXPECT(tl_runtime_new(NULL, &closed), TL_OK);
	EXPECT(tl_runtime_close(closed), TL_OK);
	EXPECT(tl_runtime_close(closed), TL_OK);
	EXPECT(tl_runtime_close(0), TL_OK);
	const uint64_t bad_handles[] = {0, closed, 0xdeadbeefULL, UINT64_MAX};

	/* Memory. */
	void *p = NULL;
	EXPECT(tl_alloc(a, 64, NULL), TL_E_INVALID_ARGUMENT);
	EXPECT(tl_alloc(a, -1, &p), TL_E_INVALID_ARGUMENT);
	EXPECT(tl_alloc(a, 0, &p), TL_E_INVALID_ARGUMENT);
	EXPECT(tl_alloc(a, INT64_MIN, &p), TL_E_INVALID_ARGUMENT);
	int rc = ok_kind(tl_alloc(a, INT64_MAX, &p), "alloc INT64_MAX");
	CHECK(rc == TL_E_OUT_OF_MEMORY || rc == TL_E_INVALID_ARGUMENT, "alloc of INT64_MAX bytes: %s", tl_kind_name(rc));
	for (size_t i = 0; i < sizeof bad_handles / sizeof bad_handles[0]; i++) {
		EXPECT(tl_alloc(bad_handles[i], 64, &p), TL_E_INVALID_ARGUMENT);
	}
	EXPECT(tl_free_memory(a, NULL), TL_E_INVALID_ARGUMENT);
	char stack_buf[64];
	EXPECT(tl_free_memory(a, stack_buf), TL_E_INVALID_ARGUMENT);

	/* Put. */
	float src[256];
	for (int i = 0; i < 256; i++) src[i] = (float)i;
	int64_t shape[2] = {16, 16};
	uint8_t ref[1024];
	size_t ref_len = 0;
	EXPECT(tl_put(a, src, sizeof src, NULL, 2, shape, NULL, ref, sizeof ref, &ref_len), TL_E_INVALID_ARGUMENT);
	EXPECT(tl_put(a, src, sizeof src, "float32", -1, shape, NULL, ref, sizeof ref, &ref_len), TL_E_INVALID_ARGUMENT);
	EXPECT(tl_put(a, src, sizeof src, "float32", 17, shape, NULL, ref, sizeof ref, &ref_len), TL_E_INVALID_ARGUMENT);
	EXPECT(tl_put(a, src, sizeof src, "float32", 2, NULL, NULL, ref, sizeof ref, &ref_len), TL_E_INVALID_ARGUMENT);
	EXPECT(tl_put(a, src, -1, "float32", 2, shape, NULL, ref, sizeof ref, &ref_len), TL_E_INVALID_ARGUMENT);
	EXPECT(tl_put(a, src, INT64_MAX, "float32", 2, shape, NULL, ref, sizeof ref, &ref_len), TL_E_INVALID_ARGUMENT);
	EXPECT(tl_put(a, NULL, sizeof src, "float32", 2, shape, NULL, ref, sizeof ref, &ref_len), TL_E_INVALID_ARGUMENT);
	int64_t empty[2] = {0, 5}; /* no bytes: it used to panic inside */
	EXPECT(tl_put(a, src, sizeof src, "float32", 2, empty, NULL, ref, sizeof ref, &ref_len), TL_E_INVALID_ARGUMENT);
	int64_t negative[2] = {-16, 16};
	EXPECT(tl_put(a, src, sizeof src, "float32", 2, negative, NULL, ref, sizeof ref, &ref_len), TL_E_INVALID_ARGUMENT);
	int64_t giant[2] = {INT64_MAX, 16};
	EXPECT(tl_put(a, src, sizeof src, "float32", 2, giant, NULL, ref, sizeof ref, &ref_len), TL_E_INVALID_ARGUMENT);
	int64_t bad_strides[2] = {-1, 1};
	EXPECT(tl_put(a, src, sizeof src, "float32", 2, shape, bad_strides, ref, sizeof ref, &ref_len), TL_E_INVALID_ARGUMENT);
	EXPECT(tl_put(a, src, sizeof src, "float32", 2, shape, NULL, NULL, sizeof ref, &ref_len), TL_E_TOO_SMALL);
	EXPECT(tl_put(a, src, sizeof src, "float32", 2, shape, NULL, ref, 0, &ref_len), TL_E_TOO_SMALL);
	CHECK(ref_len > 0, "too small a ref buffer says how much is needed");
	EXPECT(tl_put(a, src, sizeof src, "float32", 2, shape, NULL, ref, sizeof ref, &ref_len), TL_OK);

	/* Reads with hostile ref lengths: refused before anything is read
	 * (2^32+5 used to be read as 5 bytes, 2^31 to panic inside). */
	char dst[1024];
	for (size_t i = 0; i < sizeof huge_sizes / sizeof huge_sizes[0]; i++) {
		EXPECT(tl_get_into(b, ref, huge_sizes[i], dst, sizeof dst, 0, 1000), TL_E_INVALID_ARGUMENT);
		EXPECT(tl_release(b, ref, huge_sizes[i]), TL_E_INVALID_ARGUMENT);
		EXPECT(tl_free(a, ref, huge_sizes[i], 1000), TL_E_INVALID_ARGUMENT);
		char out[256];
		size_t n = 0;
		EXPECT(tl_ref_info(ref, huge_sizes[i], out, sizeof out, &n), TL_E_INVALID_ARGUMENT);
		EXPECT(tl_explain(a, ref, huge_sizes[i], out, sizeof out, &n), TL_E_INVALID_ARGUMENT);
		EXPECT(tl_view(b, ref, huge_sizes[i], 0, 0, 1000, &(uint64_t){0}, &p, &(int64_t){0}), TL_E_INVALID_ARGUMENT);
		EXPECT(tl_get(b, ref, huge_sizes[i], 0, 1000, &p, &(int64_t){0}), TL_E_INVALID_ARGUMENT);
	}
	EXPECT(tl_get_into(b, NULL, 5, dst, sizeof dst, 0, 1000), TL_E_INVALID_ARGUMENT);
	EXPECT(tl_get_into(b, NULL, 0, dst, sizeof dst, 0, 1000), TL_E_MALFORMED_REF);
	EXPECT(tl_get_into(b, ref, ref_len, NULL, sizeof dst, 0, 1000), TL_E_INVALID_ARGUMENT);
	EXPECT(tl_get_into(b, ref, ref_len, dst, -1, 0, 1000), TL_E_INVALID_ARGUMENT);
	EXPECT(tl_get_into(b, ref, ref_len, dst, INT64_MAX, 0, 1000), TL_E_INVALID_ARGUMENT);
	EXPECT(tl_get_into(b, ref, ref_len, dst, 16, 0, 1000), TL_E_TOO_SMALL);
	EXPECT(tl_get_into(b, ref, ref_len, dst, sizeof dst, 0, -1), TL_E_INVALID_ARGUMENT);
	EXPECT(tl_get(b, ref, ref_len, 0, 1000, NULL, &(int64_t){0}), TL_E_INVALID_ARGUMENT);
	EXPECT(tl_get(b, ref, ref_len, 0, 1000, &p, NULL), TL_E_INVALID_ARGUMENT);
	EXPECT(tl_view(b, ref, ref_len, 0, 0, 1000, NULL, &p, &(int64_t){0}), TL_E_INVALID_ARGUMENT);
	EXPECT(tl_view(b, ref, ref_len, 0xffffffffu, 0, 1000, &(uint64_t){0}, &p, &(int64_t){0}), TL_E_INVALID_ARGUMENT);
	/* A forged shape: refused by the owner before the reader allocates. */
	uint8_t forged[1024];
	memcpy(forged, ref, ref_len);
	char info[2048];
	size_t info_len = 0;
	EXPECT(tl_ref_info(ref, ref_len, info, sizeof info, &info_len), TL_OK);
	EXPECT(tl_ref_info(ref, ref_len, NULL, 4096, &info_len), TL_E_TOO_SMALL);
	CHECK(info_len > 1, "ref info into NULL says how much is needed");
	EXPECT(tl_stats(a, NULL, (size_t)-1, &info_len), TL_E_TOO_SMALL);
	/* Handles: unknown, closed, another runtime's view. */
	for (size_t i = 0; i < sizeof bad_handles / sizeof bad_handles[0]; i++) {
		uint64_t h = bad_handles[i];
		EXPECT(tl_put(h, src, sizeof src, "float32", 2, shape, NULL, forged, sizeof forged, &(size_t){0}), TL_E_INVALID_ARGUMENT);
		EXPECT(tl_get_into(h, ref, ref_len, dst, sizeof dst, 0, 1000), TL_E_INVALID_ARGUMENT);
		EXPECT(tl_get(h, ref, ref_len, 0, 1000, &p, &(int64_t){0}), TL_E_INVALID_ARGUMENT);
		EXPECT(tl_view(h, ref, ref_len, 0, 0, 1000, &(uint64_t){0}, &p, &(int64_t){0}), TL_E_INVALID_ARGUMENT);
		EXPECT(tl_view_release(h, 1), h == closed ? TL_OK : TL_E_INVALID_ARGUMENT); /* idempotent after close too */
		EXPECT(tl_cancel(h, 1), TL_E_INVALID_ARGUMENT);
		EXPECT(tl_release(h, ref, ref_len), TL_E_INVALID_ARGUMENT);
		EXPECT(tl_hold(h, ref, ref_len, 1000), TL_E_INVALID_ARGUMENT);
		EXPECT(tl_free(h, ref, ref_len, 1000), TL_E_INVALID_ARGUMENT);
		EXPECT(tl_explain(h, ref, ref_len, info, sizeof info, &info_len), TL_E_INVALID_ARGUMENT);
		EXPECT(tl_stats(h, info, sizeof info, &info_len), TL_E_INVALID_ARGUMENT);
	}
	uint64_t view = 0;
	int64_t vn = 0;
	EXPECT(tl_view(b, ref, ref_len, 0, 0, 5000, &view, &p, &vn), TL_OK);
	EXPECT(tl_view_release(a, view), TL_OK); /* a's: nothing of b's goes */
	CHECK(memcmp(p, src, sizeof src) == 0, "b's view after a released its handle");
	EXPECT(tl_view_release(b, view), TL_OK);
	EXPECT(tl_view_release(b, view), TL_OK);
	EXPECT(tl_view(a, ref, ref_len, 0, 0, 5000, &view, &p, &vn), TL_E_NO_ZERO_COPY); /* its own object */

	/* A seeded random walk over the same values. */
	const int64_t lens64[] = {-1, 0, 1, 16, (int64_t)sizeof src, INT64_MAX, INT64_MIN, ((int64_t)1 << 47) + 1};
	const size_t ref_lens[] = {0, 1, 3, 16, 0 /* ref_len */, (size_t)1 << 31, ((size_t)1 << 32) + 5, (size_t)-1};
	const int64_t timeouts[] = {-1, 1, 100, 1000};
	const int32_t ndims[] = {-1, 0, 1, 2, 17};
	const char *dtypes[] = {"float32", "uint8", "", "complex64", "float8_e4m3fn"};
	uint64_t handles[] = {a, b, 0, closed, 0xdeadbeefULL};
	for (int it = 0; it < 3000; it++) {
		uint64_t h = PICK(handles);
		size_t rl = PICK(ref_lens);
		if (rl == 0 && next() % 2) rl = ref_len;
		const uint8_t *rp = next() % 8 ? ref : NULL;
		int64_t l = PICK(lens64);
		if (l > (int64_t)sizeof src && l < ((int64_t)1 << 47)) l = sizeof src; /* no library can check a lying length */
		char out[512];
		size_t n = 0;
		switch (next() % 12) {
		case 0: ok_kind(tl_put(h, next() % 4 ? (void *)src : NULL, l, PICK(dtypes), PICK(ndims), next() % 4 ? shape : NULL, NULL, forged, next() % 2 ? sizeof forged : 3, &n), "put"); break;
		case 1: ok_kind(tl_get_into(h, rp, rl, next() % 4 ? (void *)dst : NULL, l > (int64_t)sizeof dst && l < ((int64_t)1 << 47) ? (int64_t)sizeof dst : l, 0, PICK(timeouts)), "get_into"); break;
		case 2: if (ok_kind(tl_get(h, rp, rl, 0, PICK(timeouts), &p, &vn), "get") == TL_OK) EXPECT(tl_free_memory(h, p), TL_OK); break;
		case 3: if (ok_kind(tl_view(h, rp, rl, (uint32_t)(next() % 3), 0, PICK(timeouts), &view, &p, &vn), "view") == TL_OK) EXPECT(tl_view_release(h, view), TL_OK); break;
		case 4: ok_kind(tl_view_release(h, next() % 64), "view_release"); break;
		case 5: ok_kind(tl_cancel(h, next() % 4), "cancel"); break;
		case 6: ok_kind(tl_explain(h, rp, rl, next() % 4 ? out : NULL, next() % 2 ? sizeof out : 2, &n), "explain"); break;
		case 7: ok_kind(tl_ref_info(rp, rl, out, next() % 2 ? sizeof out : 0, next() % 2 ? &n : NULL), "ref_info"); break;
		case 8: ok_kind(tl_stats(h, next() % 4 ? out : NULL, next() % 2 ? sizeof out : 1, &n), "stats"); break;
		case 9: if (ok_kind(tl_alloc(h, l, next() % 8 ? &p : NULL), "alloc") == TL_OK) EXPECT(tl_free_memory(h, p), TL_OK); break;
		case 10: ok_kind(tl_free_memory(h, next() % 2 ? NULL : (void *)out), "free_memory"); break;
		case 11: /* a NULL buffer with any capacity; a real one with its own */
			if (next() % 2) ok_kind(tl_last_error(NULL, PICK(ref_lens), next() % 2 ? &n : NULL), "last_error");
			else ok_kind(tl_last_error(out, next() % sizeof out, next() % 2 ? &n : NULL), "last_error");
			break;
		}
	}
	/* The ref still reads after all that, then goes. */
	EXPECT(tl_get_into(b, ref, ref_len, dst, sizeof dst, 0, 5000), TL_OK);
	CHECK(memcmp(dst, src, sizeof src) == 0, "bytes after the walk");
	EXPECT(tl_free(a, ref, ref_len, 5000), TL_OK);
	EXPECT(tl_free(a, ref, ref_len, 5000), TL_OK);
	EXPECT(tl_shutdown_all(), TL_OK);
	EXPECT(tl_shutdown_all(), TL_OK);
	if (failures) {
		fprintf(stderr, "%d of %d checks failed\n", failures, calls);
		return 1;
	}
	printf("libtensorlane C ABI abuse: %d calls, all checks passed\n", calls);
	return 0;
}
