//go:build cgo && linux

// Memory ownership: the shim holds the dlopen handle of libibverbs and a
// table of function pointers for the life of the process (never dlclosed,
// so no pointer into the library can dangle). It allocates one scratch
// array per okv_ibv_post_send and frees it before returning; everything
// else it creates (contexts, PDs, MRs, CQs, QPs) belongs to a Go value and
// is released through the matching okv_ibv_* call. No verbs header is
// included: verbs_abi.h declares the layouts (abi_test.go checks them).

#define _GNU_SOURCE
#include "shim.h"
#include "verbs_abi.h"

#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void *lib;

#define P(h) ((void *)(uintptr_t)(h))
#define H(p) ((okv_h)(uintptr_t)(p))

#define OKV_FN(ret, name, args) typedef ret(*name##_fn) args; static name##_fn p_##name;
OKV_FN(void **, ibv_get_device_list, (int *))
OKV_FN(void, ibv_free_device_list, (void **))
OKV_FN(const char *, ibv_get_device_name, (void *))
OKV_FN(uint64_t, ibv_get_device_guid, (void *))
OKV_FN(void *, ibv_open_device, (void *))
OKV_FN(int, ibv_close_device, (void *))
OKV_FN(int, ibv_query_port, (void *, uint8_t, struct okv_ibv_port_attr *))
OKV_FN(int, ibv_query_gid, (void *, uint8_t, int, union okv_ibv_gid *))
OKV_FN(void *, ibv_alloc_pd, (void *))
OKV_FN(int, ibv_dealloc_pd, (void *))
OKV_FN(struct okv_ibv_mr *, ibv_reg_mr, (void *, void *, size_t, int))
OKV_FN(struct okv_ibv_mr *, ibv_reg_dmabuf_mr, (void *, uint64_t, size_t, uint64_t, int, int))
OKV_FN(int, ibv_dereg_mr, (void *))
OKV_FN(void *, ibv_create_cq, (void *, int, void *, void *, int))
OKV_FN(int, ibv_destroy_cq, (void *))
OKV_FN(struct okv_ibv_qp *, ibv_create_qp, (void *, struct okv_ibv_qp_init_attr *))
OKV_FN(int, ibv_destroy_qp, (void *))
OKV_FN(int, ibv_modify_qp, (void *, struct okv_ibv_qp_attr *, int))
#undef OKV_FN

// sym resolves the IBVERBS_1.1 version of name (several entry points also
// export an IBVERBS_1.0 compat version with other structures), falling
// back to the default version.
static void *sym(const char *name, const char *version) {
	void *p = version ? dlvsym(lib, name, version) : NULL;
	return p ? p : dlsym(lib, name);
}

int okv_ibv_load(const char *path, char *err, size_t errlen) {
	if (lib) return 0;
	void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	if (!h) {
		snprintf(err, errlen, "%s", dlerror());
		return -1;
	}
	lib = h;
#define LOAD(name, ver) \
	if (!(p_##name = (name##_fn)sym(#name, ver))) { snprintf(err, errlen, "%s: no symbol %s", path, #name); lib = NULL; dlclose(h); return -1; }
	LOAD(ibv_get_device_list, "IBVERBS_1.1")
	LOAD(ibv_free_device_list, "IBVERBS_1.1")
	LOAD(ibv_get_device_name, "IBVERBS_1.1")
	LOAD(ibv_get_device_guid, "IBVERBS_1.1")
	LOAD(ibv_open_device, "IBVERBS_1.1")
	LOAD(ibv_close_device, "IBVERBS_1.1")
	LOAD(ibv_query_port, "IBVERBS_1.1")
	LOAD(ibv_query_gid, "IBVERBS_1.1")
	LOAD(ibv_alloc_pd, "IBVERBS_1.1")
	LOAD(ibv_dealloc_pd, "IBVERBS_1.1")
	LOAD(ibv_reg_mr, "IBVERBS_1.1")
	LOAD(ibv_dereg_mr, "IBVERBS_1.1")
	LOAD(ibv_create_cq, "IBVERBS_1.1")
	LOAD(ibv_destroy_cq, "IBVERBS_1.1")
	LOAD(ibv_create_qp, "IBVERBS_1.1")
	LOAD(ibv_destroy_qp, "IBVERBS_1.1")
	LOAD(ibv_modify_qp, "IBVERBS_1.1")
#undef LOAD
	p_ibv_reg_dmabuf_mr = (ibv_reg_dmabuf_mr_fn)sym("ibv_reg_dmabuf_mr", NULL);
	return 0;
}

int okv_ibv_probe(const char *path, char *err, size_t errlen) {
	void *h = dlopen(path, RTLD_LAZY | RTLD_LOCAL);
	if (!h) {
		snprintf(err, errlen, "%s", dlerror());
		return -1;
	}
	dlclose(h);
	return 0;
}

int okv_ibv_has_dmabuf(void) { return p_ibv_reg_dmabuf_mr != NULL; }

static int fail(void) { return errno ? errno : EIO; }

int okv_ibv_devices(okv_dev *out, int max, int *n) {
	int num = 0;
	errno = 0;
	void **list = p_ibv_get_device_list(&num);
	if (!list) return fail();
	*n = 0;
	for (int i = 0; i < num && i < max; i++) {
		snprintf(out[i].name, sizeof out[i].name, "%s", p_ibv_get_device_name(list[i]));
		out[i].guid = p_ibv_get_device_guid(list[i]);
		(*n)++;
	}
	p_ibv_free_device_list(list);
	return 0;
}

int okv_ibv_open(const char *name, okv_h *ctx) {
	int num = 0;
	errno = 0;
	void **list = p_ibv_get_device_list(&num);
	if (!list) return fail();
	int rc = ENODEV;
	for (int i = 0; i < num; i++) {
		if (strcmp(p_ibv_get_device_name(list[i]), name) != 0) continue;
		errno = 0;
		void *c = p_ibv_open_device(list[i]);
		*ctx = H(c);
		rc = c ? 0 : fail();
		break;
	}
	p_ibv_free_device_list(list);
	return rc;
}

int okv_ibv_close(okv_h ctx) { return p_ibv_close_device(P(ctx)) ? fail() : 0; }

int okv_ibv_query_port(okv_h ctx, uint8_t port, okv_port *out) {
	// The library may write a newer, longer ibv_port_attr: give it room.
	union { struct okv_ibv_port_attr a; char room[512]; } u;
	memset(&u, 0, sizeof u);
	int rc = p_ibv_query_port(P(ctx), port, &u.a);
	if (rc) return rc > 0 ? rc : fail();
	out->state = u.a.state;
	out->active_mtu = u.a.active_mtu;
	out->link_layer = u.a.link_layer;
	out->lid = u.a.lid;
	out->gid_tbl_len = u.a.gid_tbl_len;
	return 0;
}

int okv_ibv_query_gid(okv_h ctx, uint8_t port, int index, uint8_t gid[16]) {
	union okv_ibv_gid g;
	if (p_ibv_query_gid(P(ctx), port, index, &g)) return fail();
	memcpy(gid, g.raw, 16);
	return 0;
}

int okv_ibv_alloc_pd(okv_h ctx, okv_h *pd) {
	errno = 0;
	void *p = p_ibv_alloc_pd(P(ctx));
	*pd = H(p);
	return p ? 0 : fail();
}

int okv_ibv_dealloc_pd(okv_h pd) { return p_ibv_dealloc_pd(P(pd)) ? fail() : 0; }

static int mr_out(struct okv_ibv_mr *m, okv_h *mr, uint32_t *lkey, uint32_t *rkey) {
	if (!m) return fail();
	*mr = H(m);
	*lkey = m->lkey;
	*rkey = m->rkey;
	return 0;
}

int okv_ibv_reg_mr(okv_h pd, uint64_t addr, uint64_t len, int access, okv_h *mr, uint32_t *lkey, uint32_t *rkey) {
	errno = 0;
	return mr_out(p_ibv_reg_mr(P(pd), (void *)(uintptr_t)addr, len, access), mr, lkey, rkey);
}

int okv_ibv_reg_dmabuf_mr(okv_h pd, uint64_t offset, uint64_t len, uint64_t iova, int fd, int access, okv_h *mr, uint32_t *lkey, uint32_t *rkey) {
	if (!p_ibv_reg_dmabuf_mr) return EOPNOTSUPP;
	errno = 0;
	return mr_out(p_ibv_reg_dmabuf_mr(P(pd), offset, len, iova, fd, access), mr, lkey, rkey);
}

int okv_ibv_dereg_mr(okv_h mr) { return p_ibv_dereg_mr(P(mr)) ? fail() : 0; }

int okv_ibv_create_cq(okv_h ctx, int depth, okv_h *cq) {
	errno = 0;
	void *c = p_ibv_create_cq(P(ctx), depth, NULL, NULL, 0);
	*cq = H(c);
	return c ? 0 : fail();
}

int okv_ibv_destroy_cq(okv_h cq) { return p_ibv_destroy_cq(P(cq)) ? fail() : 0; }

int okv_ibv_create_qp(okv_h pd, okv_h cq, uint32_t max_send_wr, uint32_t max_sge, okv_h *qp, uint32_t *qpn) {
	struct okv_ibv_qp_init_attr a;
	memset(&a, 0, sizeof a);
	a.send_cq = P(cq);
	a.recv_cq = P(cq);
	a.cap.max_send_wr = max_send_wr;
	a.cap.max_recv_wr = 1;
	a.cap.max_send_sge = max_sge;
	a.cap.max_recv_sge = 1;
	a.qp_type = 2; // IBV_QPT_RC
	errno = 0;
	struct okv_ibv_qp *q = p_ibv_create_qp(P(pd), &a);
	if (!q) return fail();
	*qp = H(q);
	*qpn = q->qp_num;
	return 0;
}

int okv_ibv_destroy_qp(okv_h qp) { return p_ibv_destroy_qp(P(qp)) ? fail() : 0; }

enum {
	M_STATE = 1 << 0, M_ACCESS = 1 << 3, M_PKEY = 1 << 4, M_PORT = 1 << 5, M_AV = 1 << 7,
	M_MTU = 1 << 8, M_TIMEOUT = 1 << 9, M_RETRY = 1 << 10, M_RNR_RETRY = 1 << 11, M_RQ_PSN = 1 << 12,
	M_RD_ATOMIC = 1 << 13, M_MIN_RNR = 1 << 15, M_SQ_PSN = 1 << 16, M_DEST_RD_ATOMIC = 1 << 17,
	M_DEST_QPN = 1 << 20,
};

int okv_ibv_modify_qp(okv_h qp, const okv_qp_attr *g) {
	struct okv_ibv_qp_attr a;
	memset(&a, 0, sizeof a);
	a.qp_state = g->state;
	int mask = M_STATE;
	switch (g->state) {
	case 1: // INIT
		a.port_num = g->port;
		a.qp_access_flags = g->access;
		mask |= M_PKEY | M_PORT | M_ACCESS;
		break;
	case 2: // RTR
		a.path_mtu = g->mtu;
		a.dest_qp_num = g->dest_qpn;
		a.rq_psn = g->rq_psn;
		a.max_dest_rd_atomic = g->max_dest_rd_atomic;
		a.min_rnr_timer = g->min_rnr_timer;
		a.ah_attr.dlid = g->dlid;
		a.ah_attr.port_num = g->port;
		a.ah_attr.is_global = g->is_global;
		if (g->is_global) {
			memcpy(a.ah_attr.grh.dgid.raw, g->dgid, 16);
			a.ah_attr.grh.sgid_index = g->sgid_index;
			a.ah_attr.grh.hop_limit = 64;
		}
		mask |= M_AV | M_MTU | M_DEST_QPN | M_RQ_PSN | M_DEST_RD_ATOMIC | M_MIN_RNR;
		break;
	case 3: // RTS
		a.sq_psn = g->sq_psn;
		a.timeout = g->timeout;
		a.retry_cnt = g->retry_cnt;
		a.rnr_retry = g->rnr_retry;
		a.max_rd_atomic = g->max_rd_atomic;
		mask |= M_SQ_PSN | M_TIMEOUT | M_RETRY | M_RNR_RETRY | M_RD_ATOMIC;
		break;
	}
	int rc = p_ibv_modify_qp(P(qp), &a, mask);
	return rc ? (rc > 0 ? rc : fail()) : 0;
}

// post_send and poll_cq are static inline in verbs.h: call through the
// context's ops table, as they do.
int okv_ibv_post_send(okv_h qp, const okv_wr *wrs, int n, const okv_sge *sges, int *posted) {
	*posted = 0;
	if (n <= 0) return 0;
	int nsge = 0;
	for (int i = 0; i < n; i++) nsge += wrs[i].num_sge;
	struct okv_ibv_send_wr *w = calloc(n, sizeof *w);
	struct okv_ibv_sge *s = calloc(nsge ? nsge : 1, sizeof *s);
	if (!w || !s) {
		free(w);
		free(s);
		return ENOMEM;
	}
	for (int i = 0, k = 0; i < n; i++) {
		w[i].wr_id = wrs[i].id;
		w[i].next = i + 1 < n ? &w[i + 1] : NULL;
		w[i].sg_list = &s[k];
		w[i].num_sge = wrs[i].num_sge;
		w[i].opcode = wrs[i].opcode;
		w[i].send_flags = 2; // IBV_SEND_SIGNALED
		w[i].wr.rdma.remote_addr = wrs[i].remote_addr;
		w[i].wr.rdma.rkey = wrs[i].rkey;
		for (uint32_t j = 0; j < wrs[i].num_sge; j++, k++) {
			const okv_sge *g = &sges[wrs[i].first_sge + j];
			s[k].addr = g->addr;
			s[k].length = g->length;
			s[k].lkey = g->lkey;
		}
	}
	struct okv_ibv_qp *q = P(qp);
	struct okv_ibv_send_wr *bad = NULL;
	int rc = q->context->ops.post_send(q, w, (void **)&bad);
	*posted = rc == 0 ? n : (bad ? (int)(bad - w) : 0);
	free(w);
	free(s);
	return rc;
}

int okv_ibv_poll_cq(okv_h cq, okv_wc *out, int max) {
	struct okv_ibv_wc wc[64];
	if (max > 64) max = 64;
	struct okv_ibv_cq *c = P(cq);
	int n = c->context->ops.poll_cq(c, max, wc);
	if (n < 0) return -EIO;
	for (int i = 0; i < n; i++) {
		out[i].id = wc[i].wr_id;
		out[i].status = wc[i].status;
		out[i].vendor_err = wc[i].vendor_err;
	}
	return n;
}
