//go:build ofi

// Thin wrappers over libfabric's static inline calls, so each Go call is one
// cgo call and no Go pointer is kept by C.

#include "cfi.h"

#define TL_FI_VERSION FI_VERSION(1, 9)

// tl_getinfo asks for reliable-datagram (or, with msg set, connected)
// endpoints that do one-sided RMA. prov and domain may be NULL; node pins
// the source address (a NIC's IP) when set.
int tl_getinfo(const char *prov, const char *domain, const char *node, int msg, struct fi_info **out) {
	struct fi_info *hints = fi_allocinfo();
	if (!hints) return -FI_ENOMEM;
	hints->caps = FI_RMA | FI_READ | FI_WRITE | FI_REMOTE_READ | FI_REMOTE_WRITE;
	hints->ep_attr->type = msg ? FI_EP_MSG : FI_EP_RDM;
	hints->mode = FI_CONTEXT | FI_CONTEXT2;
	// What we can cope with: local descriptors, virtual addresses,
	// provider keys, registering only allocated memory. Providers that
	// need FI_MR_ENDPOINT (cxi) or FI_MR_HMEM are left out for now.
	hints->domain_attr->mr_mode = FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY;
	hints->domain_attr->threading = FI_THREAD_SAFE;
	// A WRITE's completion must mean the bytes are in the target's memory
	// (the reader then tells the owner "done"), not only that they left.
	hints->tx_attr->op_flags = FI_COMPLETION | FI_DELIVERY_COMPLETE;
	if (prov) hints->fabric_attr->prov_name = strdup(prov);
	if (domain) hints->domain_attr->name = strdup(domain);
	int rc = fi_getinfo(TL_FI_VERSION, node, node ? "0" : NULL, node ? FI_SOURCE : 0, hints, out);
	fi_freeinfo(hints);
	return rc;
}

// Accessors: cgo cannot reach into the nested attribute structs as easily.
const char *tl_prov(struct fi_info *i) { return i->fabric_attr->prov_name; }
const char *tl_fabric_name(struct fi_info *i) { return i->fabric_attr->name; }
const char *tl_domain_name(struct fi_info *i) { return i->domain_attr->name; }
int tl_ep_type(struct fi_info *i) { return i->ep_attr->type; }
uint64_t tl_mr_mode(struct fi_info *i) { return (uint64_t)i->domain_attr->mr_mode; }
size_t tl_mr_key_size(struct fi_info *i) { return i->domain_attr->mr_key_size; }
uint64_t tl_max_msg(struct fi_info *i) { return (uint64_t)i->ep_attr->max_msg_size; }
size_t tl_iov_limit(struct fi_info *i) { return i->tx_attr ? i->tx_attr->iov_limit : 1; }
uint64_t tl_mode(struct fi_info *i) { return i->mode; }
struct fi_info *tl_next(struct fi_info *i) { return i->next; }
int tl_addr_format(struct fi_info *i) { return i->addr_format; }
size_t tl_src_addrlen(struct fi_info *i) { return i->src_addrlen; }
void *tl_src_addr(struct fi_info *i) { return i->src_addr; }
uint64_t tl_link_speed(struct fi_info *i) {
	if (i->nic && i->nic->link_attr) return (uint64_t)i->nic->link_attr->speed;
	return 0;
}
const char *tl_nic_name(struct fi_info *i) {
	if (i->nic && i->nic->device_attr && i->nic->device_attr->name) return i->nic->device_attr->name;
	return NULL;
}

// tl_dom is an opened fabric and domain.

int tl_dom_open(struct fi_info *info, tl_dom **out) {
	tl_dom *d = calloc(1, sizeof(*d));
	if (!d) return -FI_ENOMEM;
	d->info = fi_dupinfo(info);
	int rc = fi_fabric(d->info->fabric_attr, &d->fabric, NULL);
	if (rc == 0) rc = fi_domain(d->fabric, d->info, &d->domain, NULL);
	if (rc) {
		if (d->fabric) fi_close(&d->fabric->fid);
		fi_freeinfo(d->info);
		free(d);
		return rc;
	}
	*out = d;
	return 0;
}

void tl_dom_close(tl_dom *d) {
	fi_close(&d->domain->fid);
	fi_close(&d->fabric->fid);
	fi_freeinfo(d->info);
	free(d);
}

// tl_cq_open opens a completion queue; with wait set it has a wait object
// (2: a file descriptor, 1: whatever the provider likes) so fi_cq_sread
// sleeps instead of spinning.
int tl_cq_open(tl_dom *d, int wait, struct fid_cq **out) {
	struct fi_cq_attr attr;
	memset(&attr, 0, sizeof(attr));
	attr.format = FI_CQ_FORMAT_DATA;
	attr.size = 4096;
	attr.wait_obj = wait == 2 ? FI_WAIT_FD : (wait ? FI_WAIT_UNSPEC : FI_WAIT_NONE);
	return fi_cq_open(d->domain, &attr, out, NULL);
}

int tl_cq_close(struct fid_cq *cq) { return fi_close(&cq->fid); }
int tl_cq_signal(struct fid_cq *cq) { return fi_cq_signal(cq); }

// tl_cq_read reads up to n completions (timeout_ms < 0: do not wait). It
// returns the count, 0 when none came, or a negative error; an error
// completion is returned as one entry in err with -FI_EAVAIL.
ssize_t tl_cq_read(struct fid_cq *cq, struct fi_cq_data_entry *buf, size_t n, int timeout_ms,
		struct fi_cq_err_entry *err) {
	ssize_t rc = timeout_ms < 0 ? fi_cq_read(cq, buf, n) : fi_cq_sread(cq, buf, n, NULL, timeout_ms);
	if (rc == -FI_EAGAIN) return 0;
	if (rc == -FI_EAVAIL) {
		memset(err, 0, sizeof(*err));
		ssize_t e = fi_cq_readerr(cq, err, 0);
		if (e == -FI_EAGAIN) return 0;
		if (e < 0) return e;
		return -FI_EAVAIL;
	}
	return rc;
}

const char *tl_cq_strerror(struct fid_cq *cq, struct fi_cq_err_entry *err) {
	return fi_cq_strerror(cq, err->prov_errno, err->err_data, NULL, 0);
}

// tl_ep is one endpoint with its own address vector, bound to a CQ.

int tl_ep_open(tl_dom *d, struct fid_cq *cq, tl_ep **out) {
	tl_ep *e = calloc(1, sizeof(*e));
	if (!e) return -FI_ENOMEM;
	e->peer = FI_ADDR_UNSPEC;
	struct fi_av_attr av;
	memset(&av, 0, sizeof(av));
	av.type = FI_AV_TABLE;
	int rc = fi_av_open(d->domain, &av, &e->av, NULL);
	if (rc == 0) rc = fi_endpoint(d->domain, d->info, &e->ep, NULL);
	if (rc == 0 && d->info->ep_attr->type == FI_EP_RDM) rc = fi_ep_bind(e->ep, &e->av->fid, 0);
	if (rc == 0) rc = fi_ep_bind(e->ep, &cq->fid, FI_TRANSMIT | FI_RECV);
	if (rc == 0) rc = fi_enable(e->ep);
	if (rc == 0) {
		e->namelen = sizeof(e->name);
		rc = fi_getname(&e->ep->fid, e->name, &e->namelen);
	}
	if (rc) {
		if (e->ep) fi_close(&e->ep->fid);
		if (e->av) fi_close(&e->av->fid);
		free(e);
		return rc;
	}
	*out = e;
	return 0;
}

int tl_ep_insert(tl_ep *e, const void *addr) {
	int n = fi_av_insert(e->av, addr, 1, &e->peer, 0, NULL);
	return n == 1 ? 0 : (n < 0 ? n : -FI_EINVAL);
}

void tl_ep_close(tl_ep *e) {
	fi_close(&e->ep->fid);
	fi_close(&e->av->fid);
	free(e);
}

// tl_post posts one RMA read (write = 0) or write. The context is C
// memory owned by the caller until its completion (or the endpoint's
// close). Returns 0, -FI_EAGAIN when the queue is full, or an error.
ssize_t tl_post(tl_ep *e, int write, uint64_t local, size_t len, void *desc,
		uint64_t raddr, uint64_t key, void *ctx) {
	if (write) {
		// FI_DELIVERY_COMPLETE: the completion means the bytes are in the
		// target's memory (the reader tells the owner "done" next), not
		// only that they left.
		struct iovec iov = { .iov_base = (void *)(uintptr_t)local, .iov_len = len };
		struct fi_rma_iov rma = { .addr = raddr, .len = len, .key = key };
		struct fi_msg_rma msg = { .msg_iov = &iov, .desc = &desc, .iov_count = 1, .addr = e->peer,
			.rma_iov = &rma, .rma_iov_count = 1, .context = ctx };
		return fi_writemsg(e->ep, &msg, FI_COMPLETION | FI_DELIVERY_COMPLETE);
	}
	return fi_read(e->ep, (void *)(uintptr_t)local, len, desc, e->peer, raddr, key, ctx);
}

// tl_postv posts one RMA write of count local segments (locals[i],
// lens[i], each with its registration's descriptor descs[i]) to the remote
// range of their total length at raddr: fi_writemsg with an iov. count is
// at most the endpoint's tx iov_limit (the caller checks).
ssize_t tl_postv(tl_ep *e, const uint64_t *locals, const uint64_t *lens, const uint64_t *descs, size_t count,
		uint64_t raddr, uint64_t key, void *ctx) {
	struct iovec iov[count];
	void *desc[count];
	size_t total = 0;
	for (size_t i = 0; i < count; i++) {
		iov[i].iov_base = (void *)(uintptr_t)locals[i];
		iov[i].iov_len = lens[i];
		desc[i] = (void *)(uintptr_t)descs[i];
		total += lens[i];
	}
	struct fi_rma_iov rma = { .addr = raddr, .len = total, .key = key };
	struct fi_msg_rma msg = { .msg_iov = iov, .desc = desc, .iov_count = count, .addr = e->peer,
		.rma_iov = &rma, .rma_iov_count = 1, .context = ctx };
	return fi_writemsg(e->ep, &msg, FI_COMPLETION | FI_DELIVERY_COMPLETE);
}

// tl_mr_reg registers [base, base+len). The base is pinned (runtime.Pinner)
// or C/mmap memory, passed as an integer so cgo does not check it.
int tl_mr_reg(tl_dom *d, uint64_t base, size_t len, uint64_t access, uint64_t key, struct fid_mr **out) {
	return fi_mr_reg(d->domain, (void *)(uintptr_t)base, len, access, 0, key, 0, out, NULL);
}
uint64_t tl_mr_key(struct fid_mr *mr) { return fi_mr_key(mr); }
void *tl_mr_desc(struct fid_mr *mr) { return fi_mr_desc(mr); }
int tl_mr_close(struct fid_mr *mr) { return fi_close(&mr->fid); }

// tl_ctx allocates one operation context; the id lets Go find the request.
tl_ctx *tl_ctx_new(uint64_t id) { tl_ctx *c = calloc(1, sizeof(*c)); if (c) c->id = id; return c; }
uint64_t tl_ctx_id(void *c) { return ((tl_ctx *)c)->id; }
void tl_ctx_free(void *c) { free(c); }
size_t tl_entry_size(void) { return sizeof(struct fi_cq_data_entry); }
void *tl_entry_ctx(struct fi_cq_data_entry *e, size_t i) { return e[i].op_context; }
uint64_t tl_entry_len(struct fi_cq_data_entry *e, size_t i) { return e[i].len; }
void *tl_err_ctx(struct fi_cq_err_entry *e) { return e->op_context; }
int tl_err_errno(struct fi_cq_err_entry *e) { return e->err; }
int tl_err_prov(struct fi_cq_err_entry *e) { return e->prov_errno; }

// tl_cq_waitfd returns the file descriptor a CQ's wait object signals on
// (FI_GETWAIT), or -1 when it has none.
int tl_cq_waitfd(struct fid_cq *cq) {
	int fd = -1;
	if (fi_control(&cq->fid, FI_GETWAIT, &fd)) return -1;
	return fd;
}

// tl_trywait returns 0 when the caller may sleep on the CQ's fd (nothing
// is pending), -FI_EAGAIN when it must read the CQ first.
int tl_trywait(tl_dom *d, struct fid_cq *cq) {
	struct fid *f = &cq->fid;
	return fi_trywait(d->fabric, &f, 1);
}

// tl_hmem_probe asks whether prov offers reliable-datagram RMA endpoints
// that register device memory: FI_HMEM in caps and FI_MR_HMEM accepted in
// mr_mode. 0: yes; a negative fi_errno otherwise (-FI_ENODATA: no such
// endpoint). *dmabuf says whether this libfabric takes dma-buf
// registrations (FI_MR_DMABUF, 1.20 and later, in the headers and at run
// time).
int tl_hmem_probe(const char *prov, int *dmabuf) {
	*dmabuf = 0;
	struct fi_info *hints = fi_allocinfo();
	if (!hints) return -FI_ENOMEM;
	hints->caps = FI_RMA | FI_READ | FI_WRITE | FI_REMOTE_READ | FI_REMOTE_WRITE | FI_HMEM;
	hints->ep_attr->type = FI_EP_RDM;
	hints->mode = FI_CONTEXT | FI_CONTEXT2;
	hints->domain_attr->mr_mode = FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY | FI_MR_HMEM;
	hints->domain_attr->threading = FI_THREAD_SAFE;
	if (prov && *prov) hints->fabric_attr->prov_name = strdup(prov);
	struct fi_info *out = NULL;
	// FI_HMEM came with API 1.10.
	int rc = fi_getinfo(FI_VERSION(1, 10), NULL, NULL, 0, hints, &out);
	fi_freeinfo(hints);
	if (rc) return rc;
	if (!(out->caps & FI_HMEM) || !(out->domain_attr->mr_mode & FI_MR_HMEM)) rc = -FI_ENODATA;
#ifdef FI_MR_DMABUF
	if (!rc && FI_VERSION_GE(fi_version(), FI_VERSION(1, 20))) *dmabuf = 1;
#endif
	fi_freeinfo(out);
	return rc;
}
