// Declarations of cfi.c: thin wrappers over libfabric (see cfi.go).
#ifndef TL_CFI_H
#define TL_CFI_H
#include <stdlib.h>
#include <string.h>
#include <stdint.h>
#include <rdma/fabric.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_rma.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_errno.h>

typedef struct {
	struct fi_info *info;
	struct fid_fabric *fabric;
	struct fid_domain *domain;
} tl_dom;
typedef struct {
	struct fid_ep *ep;
	struct fid_av *av;
	fi_addr_t peer;
	char name[256];
	size_t namelen;
} tl_ep;
typedef struct { struct fi_context2 fi; uint64_t id; } tl_ctx;

int tl_getinfo(const char *prov, const char *domain, const char *node, int msg, struct fi_info **out);
const char *tl_prov(struct fi_info *i);
const char *tl_fabric_name(struct fi_info *i);
const char *tl_domain_name(struct fi_info *i);
int tl_ep_type(struct fi_info *i);
uint64_t tl_mr_mode(struct fi_info *i);
size_t tl_mr_key_size(struct fi_info *i);
uint64_t tl_max_msg(struct fi_info *i);
size_t tl_iov_limit(struct fi_info *i);
uint64_t tl_mode(struct fi_info *i);
struct fi_info *tl_next(struct fi_info *i);
int tl_addr_format(struct fi_info *i);
size_t tl_src_addrlen(struct fi_info *i);
void *tl_src_addr(struct fi_info *i);
uint64_t tl_link_speed(struct fi_info *i);
const char *tl_nic_name(struct fi_info *i);
int tl_hmem_probe(const char *prov, int *dmabuf);
int tl_dom_open(struct fi_info *info, tl_dom **out);
void tl_dom_close(tl_dom *d);
int tl_cq_open(tl_dom *d, int wait, struct fid_cq **out);
int tl_cq_close(struct fid_cq *cq);
int tl_cq_signal(struct fid_cq *cq);
const char *tl_cq_strerror(struct fid_cq *cq, struct fi_cq_err_entry *err);
int tl_ep_open(tl_dom *d, struct fid_cq *cq, tl_ep **out);
int tl_ep_insert(tl_ep *e, const void *addr);
void tl_ep_close(tl_ep *e);
int tl_mr_reg(tl_dom *d, uint64_t base, size_t len, uint64_t access, uint64_t key, struct fid_mr **out);
uint64_t tl_mr_key(struct fid_mr *mr);
void *tl_mr_desc(struct fid_mr *mr);
int tl_mr_close(struct fid_mr *mr);
tl_ctx *tl_ctx_new(uint64_t id);
uint64_t tl_ctx_id(void *c);
void tl_ctx_free(void *c);
size_t tl_entry_size(void);
void *tl_entry_ctx(struct fi_cq_data_entry *e, size_t i);
uint64_t tl_entry_len(struct fi_cq_data_entry *e, size_t i);
void *tl_err_ctx(struct fi_cq_err_entry *e);
int tl_err_errno(struct fi_cq_err_entry *e);
int tl_err_prov(struct fi_cq_err_entry *e);
ssize_t tl_cq_read(struct fid_cq *cq, struct fi_cq_data_entry *buf, size_t n, int timeout_ms, struct fi_cq_err_entry *err);
ssize_t tl_post(tl_ep *e, int write, uint64_t local, size_t len, void *desc, uint64_t raddr, uint64_t key, void *ctx);
ssize_t tl_postv(tl_ep *e, const uint64_t *locals, const uint64_t *lens, const uint64_t *descs, size_t count,
		uint64_t raddr, uint64_t key, void *ctx);
int tl_cq_waitfd(struct fid_cq *cq);
int tl_trywait(tl_dom *d, struct fid_cq *cq);
#endif

