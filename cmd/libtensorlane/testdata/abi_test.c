/* A C program that uses libtensorlane the way a foreign caller would:
 * two runtimes, foreign and shareable memory, reads from several threads,
 * bad input, and the error kinds. Exits 0 when every check passed. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tensorlane.h"

static int failures;
#define CHECK(cond, ...) do { if (!(cond)) { failures++; fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__); fprintf(stderr, __VA_ARGS__); fprintf(stderr, "\n"); } } while (0)

static const char *last(void) {
	static __thread char msg[1024];
	tl_last_error(msg, sizeof msg, NULL);
	return msg;
}

static uint64_t a, b;

#define N (1 << 20)
#define THREADS 4

static void *reader(void *arg) {
	long id = (long)arg;
	float *src = malloc(N * sizeof(float));
	for (int i = 0; i < N; i++) src[i] = (float)(i + id);
	int64_t shape[1] = {N};
	uint8_t ref[1024];
	size_t ref_len = 0;
	int rc = tl_put(a, src, N * sizeof(float), "float32", 1, shape, NULL, ref, sizeof ref, &ref_len);
	CHECK(rc == TL_OK, "thread %ld put: %s", id, last());
	float *dst = malloc(N * sizeof(float));
	rc = tl_get_into(b, ref, ref_len, dst, N * sizeof(float), 100 + id, 10000);
	CHECK(rc == TL_OK, "thread %ld get: %s", id, last());
	CHECK(memcmp(src, dst, N * sizeof(float)) == 0, "thread %ld: bytes differ", id);
	CHECK(tl_release(b, ref, ref_len) == TL_OK, "release: %s", last());
	CHECK(tl_free(a, ref, ref_len, 5000) == TL_OK, "free: %s", last());
	free(src); /* safe: tl_free returned */
	free(dst);
	return NULL;
}

int main(void) {
	CHECK(tl_abi_version() == 1, "abi version %d", tl_abi_version());
	CHECK(strcmp(tl_kind_name(TL_E_OWNER_DIED), "owner_died") == 0, "kind name %s", tl_kind_name(TL_E_OWNER_DIED));
	CHECK(strcmp(tl_kind_name(TL_E_CANCELED), "canceled") == 0, "kind name");

	/* Two runtimes on one simulated host; in one process the local path
	 * would serve them, so allow only the cross-process one. */
	const char *cfg = "{\"allow\":[\"shm\"]}";
	CHECK(tl_runtime_new(cfg, &a) == TL_OK, "runtime a: %s", last());
	CHECK(tl_runtime_new(cfg, &b) == TL_OK, "runtime b: %s", last());

	/* Foreign memory from several threads at once. */
	pthread_t th[THREADS];
	for (long i = 0; i < THREADS; i++) pthread_create(&th[i], NULL, reader, (void *)i);
	for (int i = 0; i < THREADS; i++) pthread_join(th[i], NULL);

	/* Shareable memory: no copy; the reader gets new shareable memory. */
	void *mem = NULL;
	CHECK(tl_alloc(a, 4096, &mem) == TL_OK && mem != NULL, "alloc: %s", last());
	memset(mem, 0x5a, 4096);
	int64_t shape2[2] = {32, 32};
	uint8_t ref[1024];
	size_t ref_len = 0;
	CHECK(tl_put(a, mem, 4096, "int32", 2, shape2, NULL, ref, sizeof ref, &ref_len) == TL_OK, "put: %s", last());
	void *got = NULL;
	int64_t got_n = 0;
	CHECK(tl_get(b, ref, ref_len, 0, 5000, &got, &got_n) == TL_OK, "get: %s", last());
	CHECK(got_n == 4096 && memcmp(got, mem, 4096) == 0, "get delivered %lld bytes", (long long)got_n);
	char json[8192];
	size_t json_len = 0;
	CHECK(tl_explain(a, ref, ref_len, json, sizeof json, &json_len) == TL_OK, "explain: %s", last());
	CHECK(strstr(json, "\"memory\":\"shareable\"") != NULL, "explain says %s", json);
	CHECK(tl_ref_info(ref, ref_len, json, sizeof json, &json_len) == TL_OK, "ref info: %s", last());
	CHECK(strstr(json, "\"shape\":[32,32]") != NULL, "ref info says %s", json);
	/* Too small an output buffer says how much is needed. */
	char tiny[4];
	CHECK(tl_ref_info(ref, ref_len, tiny, sizeof tiny, &json_len) == TL_E_TOO_SMALL && json_len > 4, "tiny buffer");
	/* Zero-copy: a read-only view of the same object, valid after the
	 * owner frees it, until tl_view_release. */
	uint64_t view = 0;
	void *vp = NULL;
	int64_t vn = 0;
	CHECK(tl_view(b, ref, ref_len, TL_VIEW_POPULATE, 0, 5000, &view, &vp, &vn) == TL_OK, "view: %s", last());
	CHECK(vn == 4096 && vp != NULL && memcmp(vp, got, 4096) == 0, "view holds %lld bytes", (long long)vn);
	CHECK(tl_view(b, ref, ref_len, 0x80, 0, 5000, &view, &vp, &vn) == TL_E_INVALID_ARGUMENT, "unknown view flag");
	CHECK(tl_free_memory(b, got) == TL_OK, "free memory: %s", last());
	CHECK(tl_free(a, ref, ref_len, 5000) == TL_OK, "free: %s", last());
	CHECK(memcmp(vp, mem, 4096) == 0, "the view outlives the object");
	CHECK(tl_view_release(b, view) == TL_OK && tl_view_release(b, view) == TL_OK, "view release: %s", last());
	CHECK(tl_free_memory(a, mem) == TL_OK, "free memory: %s", last());

	/* Bad input: clear kinds and messages, no crash. */
	uint8_t bad[16] = {1, 2, 3};
	char buf[16];
	CHECK(tl_get_into(b, bad, sizeof bad, buf, sizeof buf, 0, 1000) == TL_E_MALFORMED_REF, "corrupt ref: %s", last());
	CHECK(strlen(last()) > 0, "a message for the corrupt ref");
	int64_t one[1] = {4};
	CHECK(tl_put(a, buf, 16, "complex64", 1, one, NULL, ref, sizeof ref, &ref_len) == TL_E_INVALID_ARGUMENT, "bad dtype: %s", last());
	CHECK(strstr(last(), "complex64") != NULL, "message names the dtype: %s", last());
	CHECK(tl_put(a, NULL, 16, "float32", 1, one, NULL, ref, sizeof ref, &ref_len) == TL_E_INVALID_ARGUMENT, "NULL pointer");
	CHECK(tl_put(a, buf, 8, "float32", 1, one, NULL, ref, sizeof ref, &ref_len) == TL_E_INVALID_ARGUMENT, "short region");
	CHECK(tl_put(999, buf, 16, "float32", 1, one, NULL, ref, sizeof ref, &ref_len) == TL_E_INVALID_ARGUMENT, "bad handle");
	CHECK(tl_runtime_new("{\"nope\":1}", &a) == TL_E_INVALID_ARGUMENT, "bad config");
	CHECK(tl_cancel(b, 12345) == TL_E_OBJECT_NOT_FOUND, "cancel of nothing");

	CHECK(tl_runtime_close(b) == TL_OK, "close: %s", last());
	CHECK(tl_runtime_close(b) == TL_OK, "close twice");
	CHECK(tl_shutdown_all() == TL_OK, "shutdown: %s", last());
	if (failures) {
		fprintf(stderr, "%d checks failed\n", failures);
		return 1;
	}
	printf("libtensorlane C ABI: all checks passed\n");
	return 0;
}
