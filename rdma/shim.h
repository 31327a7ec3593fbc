// Memory ownership: this header declares the C side of package rdma. The
// shim owns the dlopen handle of libibverbs and its function table, both
// for the life of the process (never dlclosed). Verbs objects (contexts,
// PDs, MRs, CQs, QPs) are created on behalf of Go values that release them
// through the matching okv_ibv_* call. Arrays passed in (work requests,
// SGEs, completions, names) are Go memory without pointers, borrowed for
// one call.

#ifndef ORBITKV_RDMA_SHIM_H
#define ORBITKV_RDMA_SHIM_H

#include <stddef.h>
#include <stdint.h>

// A verbs object (ibv_context, ibv_pd, ibv_mr, ibv_cq, ibv_qp) as an
// integer: Go keeps it and never dereferences it.
typedef uint64_t okv_h;

typedef struct {
	char name[64];
	uint64_t guid;
} okv_dev;

typedef struct {
	uint8_t state;
	uint8_t active_mtu;
	uint8_t link_layer;
	uint16_t lid;
	int gid_tbl_len;
} okv_port;

// One ibv_modify_qp: the Go qpAttr, flat. The shim derives the attribute
// mask from state.
typedef struct {
	uint8_t state, port, mtu, sgid_index, is_global;
	uint8_t max_rd_atomic, max_dest_rd_atomic, min_rnr_timer, timeout, retry_cnt, rnr_retry;
	uint16_t dlid;
	uint32_t access, dest_qpn, rq_psn, sq_psn;
	uint8_t dgid[16];
} okv_qp_attr;

// One work request; its SGEs are sges[first_sge : first_sge+num_sge].
typedef struct {
	uint64_t id, remote_addr;
	uint32_t rkey, opcode, first_sge, num_sge;
} okv_wr;

typedef struct {
	uint64_t addr;
	uint32_t length, lkey;
} okv_sge;

typedef struct {
	uint64_t id;
	uint32_t status, vendor_err;
} okv_wc;

// okv_ibv_load dlopens path and resolves the table; 0 on success, else a
// message in err. ibv_reg_dmabuf_mr is optional (okv_ibv_has_dmabuf).
int okv_ibv_load(const char *path, char *err, size_t errlen);
int okv_ibv_has_dmabuf(void);
// okv_ibv_probe reports whether path can be dlopened (the table stays the
// first library's: one libibverbs per process).
int okv_ibv_probe(const char *path, char *err, size_t errlen);

// Each returns 0 or an errno.
int okv_ibv_devices(okv_dev *out, int max, int *n);
int okv_ibv_open(const char *name, okv_h *ctx);
int okv_ibv_close(okv_h ctx);
int okv_ibv_query_port(okv_h ctx, uint8_t port, okv_port *out);
int okv_ibv_query_gid(okv_h ctx, uint8_t port, int index, uint8_t gid[16]);
int okv_ibv_alloc_pd(okv_h ctx, okv_h *pd);
int okv_ibv_dealloc_pd(okv_h pd);
int okv_ibv_reg_mr(okv_h pd, uint64_t addr, uint64_t len, int access, okv_h *mr, uint32_t *lkey, uint32_t *rkey);
int okv_ibv_reg_dmabuf_mr(okv_h pd, uint64_t offset, uint64_t len, uint64_t iova, int fd, int access, okv_h *mr, uint32_t *lkey, uint32_t *rkey);
int okv_ibv_dereg_mr(okv_h mr);
int okv_ibv_create_cq(okv_h ctx, int depth, okv_h *cq);
int okv_ibv_destroy_cq(okv_h cq);
int okv_ibv_create_qp(okv_h pd, okv_h cq, uint32_t max_send_wr, uint32_t max_sge, okv_h *qp, uint32_t *qpn);
int okv_ibv_destroy_qp(okv_h qp);
int okv_ibv_modify_qp(okv_h qp, const okv_qp_attr *a);
int okv_ibv_post_send(okv_h qp, const okv_wr *wrs, int n, const okv_sge *sges, int *posted);
// okv_ibv_poll_cq returns the completions written (≥ 0) or -errno.
int okv_ibv_poll_cq(okv_h cq, okv_wc *out, int max);

#endif
