// Memory ownership: declarations only. This header owns nothing.
//
// The few libibverbs structures the shim reads or fills, declared here with
// the layout of <infiniband/verbs.h> (rdma-core; the application ABI these
// follow has been frozen since libibverbs 1.1) so that building OrbitKV
// needs no libibverbs-dev. abi_test.go compiles them against the real
// header, when one is installed, and checks every offset and size.
// Everything is prefixed okv_ so both can be included in one file.

#ifndef ORBITKV_RDMA_VERBS_ABI_H
#define ORBITKV_RDMA_VERBS_ABI_H

#include <stdint.h>
#include <stddef.h>

union okv_ibv_gid {
	uint8_t raw[16];
	struct {
		uint64_t subnet_prefix;
		uint64_t interface_id;
	} global;
};

// struct ibv_context: the device pointer, then the ops table (only
// poll_cq and post_send are called through it: they are static inline
// functions in verbs.h, not exported symbols).
struct okv_ibv_context_ops {
	void *compat0[11];
	int (*poll_cq)(void *cq, int num_entries, void *wc);
	void *compat1[13];
	int (*post_send)(void *qp, void *wr, void **bad_wr);
	void *post_recv;
};

struct okv_ibv_context {
	void *device;
	struct okv_ibv_context_ops ops;
};

struct okv_ibv_cq {
	struct okv_ibv_context *context;
};

struct okv_ibv_qp {
	struct okv_ibv_context *context;
	void *qp_context;
	void *pd;
	void *send_cq;
	void *recv_cq;
	void *srq;
	uint32_t handle;
	uint32_t qp_num;
};

struct okv_ibv_mr {
	void *context;
	void *pd;
	void *addr;
	size_t length;
	uint32_t handle;
	uint32_t lkey;
	uint32_t rkey;
};

struct okv_ibv_port_attr {
	int state;
	int max_mtu;
	int active_mtu;
	int gid_tbl_len;
	uint32_t port_cap_flags;
	uint32_t max_msg_sz;
	uint32_t bad_pkey_cntr;
	uint32_t qkey_viol_cntr;
	uint16_t pkey_tbl_len;
	uint16_t lid;
	uint16_t sm_lid;
	uint8_t lmc;
	uint8_t max_vl_num;
	uint8_t sm_sl;
	uint8_t subnet_timeout;
	uint8_t init_type_reply;
	uint8_t active_width;
	uint8_t active_speed;
	uint8_t phys_state;
	uint8_t link_layer;
	uint8_t flags;
	uint16_t port_cap_flags2;
};

struct okv_ibv_qp_cap {
	uint32_t max_send_wr;
	uint32_t max_recv_wr;
	uint32_t max_send_sge;
	uint32_t max_recv_sge;
	uint32_t max_inline_data;
};

struct okv_ibv_qp_init_attr {
	void *qp_context;
	void *send_cq;
	void *recv_cq;
	void *srq;
	struct okv_ibv_qp_cap cap;
	int qp_type;
	int sq_sig_all;
};

struct okv_ibv_global_route {
	union okv_ibv_gid dgid;
	uint32_t flow_label;
	uint8_t sgid_index;
	uint8_t hop_limit;
	uint8_t traffic_class;
};

struct okv_ibv_ah_attr {
	struct okv_ibv_global_route grh;
	uint16_t dlid;
	uint8_t sl;
	uint8_t src_path_bits;
	uint8_t static_rate;
	uint8_t is_global;
	uint8_t port_num;
};

struct okv_ibv_qp_attr {
	int qp_state;
	int cur_qp_state;
	int path_mtu;
	int path_mig_state;
	uint32_t qkey;
	uint32_t rq_psn;
	uint32_t sq_psn;
	uint32_t dest_qp_num;
	unsigned int qp_access_flags;
	struct okv_ibv_qp_cap cap;
	struct okv_ibv_ah_attr ah_attr;
	struct okv_ibv_ah_attr alt_ah_attr;
	uint16_t pkey_index;
	uint16_t alt_pkey_index;
	uint8_t en_sqd_async_notify;
	uint8_t sq_draining;
	uint8_t max_rd_atomic;
	uint8_t max_dest_rd_atomic;
	uint8_t min_rnr_timer;
	uint8_t port_num;
	uint8_t timeout;
	uint8_t retry_cnt;
	uint8_t rnr_retry;
	uint8_t alt_port_num;
	uint8_t alt_timeout;
	uint32_t rate_limit;
};

struct okv_ibv_sge {
	uint64_t addr;
	uint32_t length;
	uint32_t lkey;
};

struct okv_ibv_mw_bind_info {
	void *mr;
	uint64_t addr;
	uint64_t length;
	unsigned int mw_access_flags;
};

struct okv_ibv_send_wr {
	uint64_t wr_id;
	struct okv_ibv_send_wr *next;
	struct okv_ibv_sge *sg_list;
	int num_sge;
	int opcode;
	unsigned int send_flags;
	union {
		uint32_t imm_data;
		uint32_t invalidate_rkey;
	};
	union {
		struct {
			uint64_t remote_addr;
			uint32_t rkey;
		} rdma;
		struct {
			uint64_t remote_addr;
			uint64_t compare_add;
			uint64_t swap;
			uint32_t rkey;
		} atomic;
		struct {
			void *ah;
			uint32_t remote_qpn;
			uint32_t remote_qkey;
		} ud;
	} wr;
	union {
		struct {
			uint32_t remote_srqn;
		} xrc;
	} qp_type;
	union {
		struct {
			void *mw;
			uint32_t rkey;
			struct okv_ibv_mw_bind_info bind_info;
		} bind_mw;
		struct {
			void *hdr;
			uint16_t hdr_sz;
			uint16_t mss;
		} tso;
	};
};

struct okv_ibv_wc {
	uint64_t wr_id;
	int status;
	int opcode;
	uint32_t vendor_err;
	uint32_t byte_len;
	union {
		uint32_t imm_data;
		uint32_t invalidated_rkey;
	};
	uint32_t qp_num;
	uint32_t src_qp;
	unsigned int wc_flags;
	uint16_t pkey_index;
	uint16_t slid;
	uint8_t sl;
	uint8_t dlid_path_bits;
};

#endif
