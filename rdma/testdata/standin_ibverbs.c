// A STAND-IN for libibverbs.so.1, for TestBindingAgainstStandInLibrary
// only. It is compiled against the real <infiniband/verbs.h>, so it lays
// out every structure as libibverbs does, and exports the entry points the
// shim resolves. One device, "standin0", with one active RoCE port; QPs of
// one process connect to each other; RDMA READ and WRITE are memcpy between
// registered ranges, after the checks a NIC makes (state, masks, keys,
// bounds, access). Memory ownership: every object is malloc'd here and
// freed by its destroy call; nothing outlives the process.

#include <infiniband/verbs.h>
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#undef ibv_get_device_list
#undef ibv_query_port
#undef ibv_reg_mr

#define MAXOBJ 256

// One lock for the whole stand-in: several connections post and poll from
// several threads.
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
#define LOCKED(ret_type, body) do { pthread_mutex_lock(&mu); ret_type r_ = body; pthread_mutex_unlock(&mu); return r_; } while (0)

static struct ibv_device dev;
static struct ibv_mr *mrs[MAXOBJ];
static struct sqp {
	struct ibv_qp qp;
	int state;
	uint32_t dest_qpn, rq_psn, sq_psn, max_wr, max_sge, outstanding;
	int mtu;
} *qps[MAXOBJ];
static struct scq {
	struct ibv_cq cq;
	struct ibv_wc ring[4096];
	int head, tail;
} *cqs[MAXOBJ];
static uint32_t next_qpn = 0x40, next_key = 0x1000;

struct ibv_device **ibv_get_device_list(int *n) {
	struct ibv_device **l = calloc(2, sizeof *l);
	strcpy(dev.name, "standin0");
	l[0] = &dev;
	*n = 1;
	return l;
}
void ibv_free_device_list(struct ibv_device **l) { free(l); }
const char *ibv_get_device_name(struct ibv_device *d) { return d->name; }
__be64 ibv_get_device_guid(struct ibv_device *d) { (void)d; return 0x1122334455667788ull; }

static int poll_cq(struct ibv_cq *cq, int n, struct ibv_wc *wc);
static int post_send(struct ibv_qp *qp, struct ibv_send_wr *wr, struct ibv_send_wr **bad);

struct ibv_context *ibv_open_device(struct ibv_device *d) {
	struct ibv_context *c = calloc(1, sizeof *c);
	c->device = d;
	c->ops.poll_cq = poll_cq;
	c->ops.post_send = post_send;
	return c;
}
int ibv_close_device(struct ibv_context *c) { free(c); return 0; }

int ibv_query_port(struct ibv_context *c, uint8_t port, struct _compat_ibv_port_attr *out) {
	(void)c;
	if (port != 1) return EINVAL;
	struct ibv_port_attr *a = (struct ibv_port_attr *)out;
	memset(a, 0, sizeof *a);
	a->state = IBV_PORT_ACTIVE;
	a->max_mtu = a->active_mtu = IBV_MTU_4096;
	a->gid_tbl_len = 4;
	a->link_layer = IBV_LINK_LAYER_ETHERNET;
	return 0;
}

int ibv_query_gid(struct ibv_context *c, uint8_t port, int index, union ibv_gid *gid) {
	(void)c;
	if (port != 1 || index < 0 || index >= 4) { errno = EINVAL; return -1; }
	memset(gid, 0, sizeof *gid);
	if (index == 1) { gid->raw[10] = gid->raw[11] = 0xff; gid->raw[12] = 10; gid->raw[15] = 7; }
	return 0;
}

struct ibv_pd *ibv_alloc_pd(struct ibv_context *c) {
	struct ibv_pd *pd = calloc(1, sizeof *pd);
	pd->context = c;
	return pd;
}
int ibv_dealloc_pd(struct ibv_pd *pd) { free(pd); return 0; }

static int slot(void **tab) {
	for (int i = 0; i < MAXOBJ; i++) if (!tab[i]) return i;
	return -1;
}

static struct ibv_mr *ibv_reg_mr_locked(struct ibv_pd *pd, void *addr, size_t len, int access) {
	int i = slot((void **)mrs);
	if (i < 0 || !addr || !len) { errno = EINVAL; return NULL; }
	struct ibv_mr *m = calloc(1, sizeof *m);
	m->context = pd->context; m->pd = pd; m->addr = addr; m->length = len;
	m->lkey = next_key++; m->rkey = next_key++;
	m->handle = (uint32_t)access; // the access flags, for the checks below
	mrs[i] = m;
	return m;
}
static int ibv_dereg_mr_locked(struct ibv_mr *m) {
	for (int i = 0; i < MAXOBJ; i++) if (mrs[i] == m) { mrs[i] = NULL; free(m); return 0; }
	return EINVAL;
}

static struct ibv_cq *ibv_create_cq_locked(struct ibv_context *c, int cqe, void *ctx, struct ibv_comp_channel *ch, int vec) {
	(void)ctx; (void)ch; (void)vec;
	int i = slot((void **)cqs);
	if (i < 0 || cqe < 1 || cqe > 4096) { errno = EINVAL; return NULL; }
	struct scq *q = calloc(1, sizeof *q);
	q->cq.context = c; q->cq.cqe = cqe;
	cqs[i] = q;
	return &q->cq;
}
static int ibv_destroy_cq_locked(struct ibv_cq *cq) {
	for (int i = 0; i < MAXOBJ; i++) if (cqs[i] && &cqs[i]->cq == cq) { free(cqs[i]); cqs[i] = NULL; return 0; }
	return EINVAL;
}

static struct ibv_qp *ibv_create_qp_locked(struct ibv_pd *pd, struct ibv_qp_init_attr *a) {
	int i = slot((void **)qps);
	if (i < 0 || a->qp_type != IBV_QPT_RC || !a->send_cq || a->cap.max_send_wr == 0) { errno = EINVAL; return NULL; }
	struct sqp *q = calloc(1, sizeof *q);
	q->qp.context = pd->context; q->qp.pd = pd; q->qp.send_cq = a->send_cq; q->qp.recv_cq = a->recv_cq;
	q->qp.qp_num = next_qpn++; q->qp.qp_type = IBV_QPT_RC; q->state = IBV_QPS_RESET;
	q->max_wr = a->cap.max_send_wr; q->max_sge = a->cap.max_send_sge;
	qps[i] = q;
	return &q->qp;
}
static int ibv_destroy_qp_locked(struct ibv_qp *qp) {
	for (int i = 0; i < MAXOBJ; i++) if (qps[i] && &qps[i]->qp == qp) { free(qps[i]); qps[i] = NULL; return 0; }
	return EINVAL;
}

static struct scq *cq_of(struct ibv_cq *cq) { return (struct scq *)cq; }
static struct sqp *qp_by_num(uint32_t n) {
	for (int i = 0; i < MAXOBJ; i++) if (qps[i] && qps[i]->qp.qp_num == n) return qps[i];
	return NULL;
}

static void push(struct sqp *q, uint64_t id, enum ibv_wc_status st) {
	struct scq *c = cq_of(q->qp.send_cq);
	struct ibv_wc *w = &c->ring[c->tail++ % 4096];
	memset(w, 0, sizeof *w);
	w->wr_id = id; w->status = st; w->qp_num = q->qp.qp_num;
	w->opcode = IBV_WC_RDMA_READ;
	if (st != IBV_WC_SUCCESS && st != IBV_WC_WR_FLUSH_ERR) { w->vendor_err = 0x99; q->state = IBV_QPS_ERR; }
}

// The masks the IB spec requires for each RC transition.
#define INIT_MASK (IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS)
#define RTR_MASK (IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN | \
                  IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER)
#define RTS_MASK (IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN | \
                  IBV_QP_MAX_QP_RD_ATOMIC)

static int ibv_modify_qp_locked(struct ibv_qp *qp, struct ibv_qp_attr *a, int mask) {
	struct sqp *q = (struct sqp *)qp;
	int to = a->qp_state;
	switch (to) {
	case IBV_QPS_RESET:
	case IBV_QPS_ERR:
		if (mask != IBV_QP_STATE) return EINVAL;
		break;
	case IBV_QPS_INIT:
		if (q->state != IBV_QPS_RESET || mask != INIT_MASK || a->port_num != 1) return EINVAL;
		break;
	case IBV_QPS_RTR:
		if (q->state != IBV_QPS_INIT || mask != RTR_MASK || a->path_mtu < IBV_MTU_256 || a->path_mtu > IBV_MTU_4096 ||
		    !a->ah_attr.is_global || a->ah_attr.grh.sgid_index != 1 || a->ah_attr.port_num != 1 || a->dest_qp_num == 0)
			return EINVAL;
		q->dest_qpn = a->dest_qp_num; q->rq_psn = a->rq_psn; q->mtu = a->path_mtu;
		break;
	case IBV_QPS_RTS:
		if (q->state != IBV_QPS_RTR || mask != RTS_MASK || a->timeout == 0) return EINVAL;
		q->sq_psn = a->sq_psn;
		break;
	default:
		return EINVAL;
	}
	q->state = to;
	if (to == IBV_QPS_RESET) q->outstanding = 0;
	return 0;
}

static struct ibv_mr *mr_for(struct ibv_pd *pd, uint32_t key, int remote, uint64_t addr, uint64_t len, int need) {
	for (int i = 0; i < MAXOBJ; i++) {
		struct ibv_mr *m = mrs[i];
		if (!m || m->pd != pd || (remote ? m->rkey : m->lkey) != key) continue;
		uint64_t base = (uint64_t)(uintptr_t)m->addr;
		if (addr < base || addr + len > base + m->length || addr + len < addr) return NULL;
		if (need && !((int)m->handle & need)) return NULL;
		return m;
	}
	return NULL;
}

static enum ibv_wc_status execute(struct sqp *q, struct ibv_send_wr *w) {
	struct sqp *p = qp_by_num(q->dest_qpn);
	if (!p || (p->state != IBV_QPS_RTR && p->state != IBV_QPS_RTS) || p->dest_qpn != q->qp.qp_num || p->rq_psn != q->sq_psn)
		return IBV_WC_RETRY_EXC_ERR;
	uint64_t total = 0;
	for (int i = 0; i < w->num_sge; i++) {
		if (!mr_for(q->qp.pd, w->sg_list[i].lkey, 0, w->sg_list[i].addr, w->sg_list[i].length, 0)) return IBV_WC_LOC_PROT_ERR;
		total += w->sg_list[i].length;
	}
	int need = w->opcode == IBV_WR_RDMA_READ ? IBV_ACCESS_REMOTE_READ : IBV_ACCESS_REMOTE_WRITE;
	if (!mr_for(p->qp.pd, w->wr.rdma.rkey, 1, w->wr.rdma.remote_addr, total, need)) return IBV_WC_REM_ACCESS_ERR;
	char *r = (char *)(uintptr_t)w->wr.rdma.remote_addr;
	for (int i = 0; i < w->num_sge; i++) {
		char *l = (char *)(uintptr_t)w->sg_list[i].addr;
		if (w->opcode == IBV_WR_RDMA_READ) memcpy(l, r, w->sg_list[i].length);
		else memcpy(r, l, w->sg_list[i].length);
		r += w->sg_list[i].length;
	}
	return IBV_WC_SUCCESS;
}

static int post_send_locked(struct ibv_qp *qp, struct ibv_send_wr *wr, struct ibv_send_wr **bad) {
	struct sqp *q = (struct sqp *)qp;
	for (; wr; wr = wr->next) {
		if ((q->state != IBV_QPS_RTS && q->state != IBV_QPS_ERR) || q->outstanding >= q->max_wr ||
		    wr->num_sge > (int)q->max_sge || !(wr->send_flags & IBV_SEND_SIGNALED) ||
		    (wr->opcode != IBV_WR_RDMA_READ && wr->opcode != IBV_WR_RDMA_WRITE)) {
			*bad = wr;
			return q->outstanding >= q->max_wr ? ENOMEM : EINVAL;
		}
		q->outstanding++;
		push(q, wr->wr_id, q->state == IBV_QPS_ERR ? IBV_WC_WR_FLUSH_ERR : execute(q, wr));
	}
	return 0;
}

static int poll_cq_locked(struct ibv_cq *cq, int n, struct ibv_wc *wc) {
	struct scq *c = cq_of(cq);
	int k = 0;
	for (; k < n && c->head != c->tail; k++) {
		wc[k] = c->ring[c->head++ % 4096];
		struct sqp *q = qp_by_num(wc[k].qp_num);
		if (q && q->outstanding) q->outstanding--;
	}
	return k;
}

struct ibv_mr *ibv_reg_mr(struct ibv_pd *pd, void *addr, size_t len, int access) { LOCKED(struct ibv_mr *, ibv_reg_mr_locked(pd, addr, len, access)); }

int ibv_dereg_mr(struct ibv_mr *m) { LOCKED(int, ibv_dereg_mr_locked(m)); }

struct ibv_cq *ibv_create_cq(struct ibv_context *c, int cqe, void *ctx, struct ibv_comp_channel *ch, int vec) { LOCKED(struct ibv_cq *, ibv_create_cq_locked(c, cqe, ctx, ch, vec)); }

int ibv_destroy_cq(struct ibv_cq *cq) { LOCKED(int, ibv_destroy_cq_locked(cq)); }

struct ibv_qp *ibv_create_qp(struct ibv_pd *pd, struct ibv_qp_init_attr *a) { LOCKED(struct ibv_qp *, ibv_create_qp_locked(pd, a)); }

int ibv_destroy_qp(struct ibv_qp *qp) { LOCKED(int, ibv_destroy_qp_locked(qp)); }

int ibv_modify_qp(struct ibv_qp *qp, struct ibv_qp_attr *a, int mask) { LOCKED(int, ibv_modify_qp_locked(qp, a, mask)); }

static int post_send(struct ibv_qp *qp, struct ibv_send_wr *wr, struct ibv_send_wr **bad) { LOCKED(int, post_send_locked(qp, wr, bad)); }
static int poll_cq(struct ibv_cq *cq, int n, struct ibv_wc *wc) { LOCKED(int, poll_cq_locked(cq, n, wc)); }
