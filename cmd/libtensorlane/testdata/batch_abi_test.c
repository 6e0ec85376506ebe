/* The batch entry points from C: a state dict published in one call, read
 * and mapped in one call each, and hostile counts, lengths and pointers.
 * Exits 0 when every check passed. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tensorlane.h"

static int failures;
#define CHECK(cond, ...) do { if (!(cond)) { failures++; fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__); fprintf(stderr, __VA_ARGS__); fprintf(stderr, "\n"); } } while (0)

static const char *last(void) {
	static char msg[1024];
	tl_last_error(msg, sizeof msg, NULL);
	return msg;
}

#define ITEMS 8
#define N 4096

int main(void) {
	uint64_t a, b;
	const char *cfg = "{\"allow\":[\"shm\"]}";
	CHECK(tl_runtime_new(cfg, &a) == TL_OK, "runtime a: %s", last());
	CHECK(tl_runtime_new(cfg, &b) == TL_OK, "runtime b: %s", last());

	float *src[ITEMS];
	void *ptrs[ITEMS];
	int64_t nbytes[ITEMS], shapes[ITEMS];
	const char *dtypes[ITEMS];
	int32_t ndims[ITEMS];
	for (int i = 0; i < ITEMS; i++) {
		src[i] = malloc(N * sizeof(float));
		for (int k = 0; k < N; k++) src[i][k] = (float)(i * N + k);
		ptrs[i] = src[i];
		nbytes[i] = N * sizeof(float);
		shapes[i] = N;
		dtypes[i] = "float32";
		ndims[i] = 1;
	}
	uint8_t refs[ITEMS * 1024];
	size_t lens[ITEMS], total = 0;

	/* Too small a buffer: TOO_SMALL with the size needed, nothing published. */
	int rc = tl_put_batch(a, ITEMS, ptrs, nbytes, dtypes, ndims, shapes, NULL, refs, 16, lens, &total);
	CHECK(rc == TL_E_TOO_SMALL && total > 16, "short buffer: rc %d total %zu", rc, total);
	CHECK(tl_put_batch(a, ITEMS, ptrs, nbytes, dtypes, ndims, shapes, NULL, refs, sizeof refs, lens, &total) == TL_OK,
	      "put batch: %s", last());

	void *got[ITEMS];
	int64_t got_n[ITEMS];
	int32_t codes[ITEMS];
	CHECK(tl_get_batch(b, ITEMS, refs, lens, 7, 10000, got, got_n, codes) == TL_OK, "get batch: %s", last());
	for (int i = 0; i < ITEMS; i++) {
		CHECK(codes[i] == 0 && got_n[i] == N * (int64_t)sizeof(float), "item %d: code %d, %lld bytes", i, codes[i], (long long)got_n[i]);
		if (codes[i] == 0) {
			CHECK(memcmp(got[i], src[i], N * sizeof(float)) == 0, "item %d: bytes differ", i);
			CHECK(tl_free_memory(b, got[i]) == TL_OK, "free memory: %s", last());
		}
	}
	uint64_t views[ITEMS];
	CHECK(tl_view_batch(b, ITEMS, refs, lens, TL_VIEW_POPULATE, 0, 10000, views, got, got_n, codes) == TL_OK,
	      "view batch: %s", last());
	for (int i = 0; i < ITEMS; i++) {
		CHECK(codes[i] == 0 && memcmp(got[i], src[i], N * sizeof(float)) == 0, "view %d", i);
		CHECK(tl_view_release(b, views[i]) == TL_OK, "view release: %s", last());
	}

	/* Hostile input: typed refusals, no crash. */
	CHECK(tl_get_batch(b, -1, refs, lens, 0, 1000, got, got_n, codes) == TL_E_INVALID_ARGUMENT, "n = -1");
	CHECK(tl_get_batch(b, 1 << 20, refs, lens, 0, 1000, got, got_n, codes) == TL_E_INVALID_ARGUMENT, "n too large");
	CHECK(tl_get_batch(b, ITEMS, NULL, lens, 0, 1000, got, got_n, codes) == TL_E_INVALID_ARGUMENT, "NULL refs");
	CHECK(tl_get_batch(b, ITEMS, refs, lens, 0, 1000, NULL, got_n, codes) == TL_E_INVALID_ARGUMENT, "NULL ptrs");
	CHECK(tl_view_batch(b, ITEMS, refs, lens, 0x80, 0, 1000, views, got, got_n, codes) == TL_E_INVALID_ARGUMENT, "bad flags");
	CHECK(tl_get_batch(b, ITEMS, refs, lens, 0, -5, got, got_n, codes) == TL_E_INVALID_ARGUMENT, "negative timeout");
	size_t bad_lens[2] = {0, 5};
	CHECK(tl_get_batch(b, 2, refs, bad_lens, 0, 1000, got, got_n, codes) == TL_E_INVALID_ARGUMENT, "zero ref length");
	size_t huge_lens[2] = {(size_t)1 << 40, 5};
	CHECK(tl_get_batch(b, 2, refs, huge_lens, 0, 1000, got, got_n, codes) == TL_E_INVALID_ARGUMENT, "huge ref length");
	CHECK(tl_get_batch(999, ITEMS, refs, lens, 0, 1000, got, got_n, codes) == TL_E_INVALID_ARGUMENT, "unknown runtime");
	/* A garbage ref among good ones fails alone, with its kind. */
	uint8_t mixed[2048];
	size_t mixed_lens[2] = {lens[0], 9};
	memcpy(mixed, refs, lens[0]);
	memcpy(mixed + lens[0], "not a ref", 9);
	rc = tl_get_batch(b, 2, mixed, mixed_lens, 0, 10000, got, got_n, codes);
	CHECK(rc == TL_E_MALFORMED_REF && codes[0] == 0 && codes[1] == TL_E_MALFORMED_REF, "mixed: rc %d codes %d %d", rc, codes[0], codes[1]);
	CHECK(strstr(last(), "item 1") != NULL, "the message names the item: %s", last());
	if (codes[0] == 0) tl_free_memory(b, got[0]);
	int32_t bad_ndims[2] = {1, 17};
	CHECK(tl_put_batch(a, 2, ptrs, nbytes, dtypes, bad_ndims, shapes, NULL, refs, sizeof refs, lens, &total) == TL_E_INVALID_ARGUMENT, "ndim 17");
	const char *bad_dtypes[2] = {"float32", "complex256"};
	CHECK(tl_put_batch(a, 2, ptrs, nbytes, bad_dtypes, ndims, shapes, NULL, refs, sizeof refs, lens, &total) == TL_E_INVALID_ARGUMENT, "bad dtype");
	int64_t bad_nbytes[2] = {N * sizeof(float), -1};
	CHECK(tl_put_batch(a, 2, ptrs, bad_nbytes, dtypes, ndims, shapes, NULL, refs, sizeof refs, lens, &total) == TL_E_INVALID_ARGUMENT, "negative length");
	CHECK(tl_put_batch(a, 0, NULL, NULL, NULL, NULL, NULL, NULL, NULL, 0, NULL, &total) == TL_OK && total == 0, "empty batch");

	/* A gathered put: the sources copied into one block at their offsets,
	 * published sealed; the reader gets every source where it was put. */
	{
		int64_t off[ITEMS], block_len = 0;
		for (int i = 0; i < ITEMS; i++) {
			off[i] = block_len;
			block_len += nbytes[i] + 64;
		}
		void *block = NULL;
		CHECK(tl_alloc(a, block_len, &block) == TL_OK, "alloc block: %s", last());
		uint8_t ref[1024];
		size_t ref_len = 0;
		CHECK(tl_put_gathered(a, block, block_len, ITEMS, ptrs, nbytes, off, 2, ref, sizeof ref, &ref_len) == TL_OK,
		      "put gathered: %s", last());
		void *got = NULL;
		int64_t got_n = 0;
		CHECK(tl_get(b, ref, ref_len, 0, 10000, &got, &got_n) == TL_OK && got_n == block_len, "get block: %s", last());
		for (int i = 0; got != NULL && i < ITEMS; i++)
			CHECK(memcmp((uint8_t *)got + off[i], src[i], N * sizeof(float)) == 0, "gathered part %d differs", i);
		if (got != NULL) CHECK(tl_free_memory(b, got) == TL_OK, "free got: %s", last());
		CHECK(tl_free(a, ref, ref_len, 5000) == TL_OK, "free gathered: %s", last());
		/* Hostile: NULL arrays, a part past the block, memory not from tl_alloc. */
		CHECK(tl_put_gathered(a, block, block_len, ITEMS, NULL, nbytes, off, 0, ref, sizeof ref, &ref_len) == TL_E_INVALID_ARGUMENT, "NULL srcs");
		int64_t far[1] = {block_len - 10};
		CHECK(tl_put_gathered(a, block, block_len, 1, ptrs, nbytes, far, 0, ref, sizeof ref, &ref_len) == TL_E_INVALID_ARGUMENT, "part past the block");
		CHECK(tl_put_gathered(a, src[0], N * sizeof(float), 0, NULL, NULL, NULL, 0, ref, sizeof ref, &ref_len) == TL_E_INVALID_ARGUMENT, "foreign block");
		CHECK(tl_put_gathered(a, block, block_len, -1, ptrs, nbytes, off, 0, ref, sizeof ref, &ref_len) == TL_E_INVALID_ARGUMENT, "n = -1");
		CHECK(tl_free_memory(a, block) == TL_OK, "free block: %s", last());
	}

	CHECK(tl_runtime_close(b) == TL_OK, "close b");
	CHECK(tl_runtime_close(a) == TL_OK, "close a");
	for (int i = 0; i < ITEMS; i++) free(src[i]);
	if (failures) {
		fprintf(stderr, "%d checks failed\n", failures);
		return 1;
	}
	printf("all batch checks passed\n");
	return 0;
}
