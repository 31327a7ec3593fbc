package rdma

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/orbitkv/orbitkv/rdma/rdmatest"
)

// TestShimLayoutsMatchVerbsHeader compiles verbs_abi.h against the real
// <infiniband/verbs.h> and asserts, field by field, the same offsets and
// sizes: the shim declares these structures itself so that a build needs
// no libibverbs-dev, and this is what keeps the declarations honest.
// scripts/install-deps.sh installs libibverbs-dev; without the header (or a
// C compiler) the test skips and says so, or fails with
// ORBITKV_REQUIRE=verbs-headers.
func TestShimLayoutsMatchVerbsHeader(t *testing.T) {
	cc := rdmatest.Compiler(t, "layouts not checked")
	src := filepath.Join(t.TempDir(), "abi.c")
	if err := os.WriteFile(src, []byte(abiCheckSource()), 0o600); err != nil {
		t.Fatal(err)
	}
	wd, _ := os.Getwd()
	out, err := exec.Command(cc, "-fsyntax-only", "-I", wd, src).CombinedOutput()
	if err != nil {
		t.Fatalf("verbs_abi.h differs from verbs.h:\n%s", out)
	}
}

// abiFields lists, per structure, the fields whose offsets must agree.
var abiFields = map[string][]string{
	"ibv_context":      {"device", "ops", "ops.poll_cq", "ops.post_send", "ops.post_recv"},
	"ibv_cq":           {"context"},
	"ibv_qp":           {"context", "qp_context", "pd", "send_cq", "recv_cq", "srq", "handle", "qp_num"},
	"ibv_mr":           {"context", "pd", "addr", "length", "handle", "lkey", "rkey"},
	"ibv_port_attr":    {"state", "max_mtu", "active_mtu", "gid_tbl_len", "pkey_tbl_len", "lid", "sm_lid", "lmc", "link_layer", "flags", "port_cap_flags2"},
	"ibv_qp_cap":       {"max_send_wr", "max_recv_wr", "max_send_sge", "max_recv_sge", "max_inline_data"},
	"ibv_qp_init_attr": {"qp_context", "send_cq", "recv_cq", "srq", "cap", "qp_type", "sq_sig_all"},
	"ibv_global_route": {"dgid", "flow_label", "sgid_index", "hop_limit", "traffic_class"},
	"ibv_ah_attr":      {"grh", "dlid", "sl", "src_path_bits", "static_rate", "is_global", "port_num"},
	"ibv_qp_attr":      {"qp_state", "cur_qp_state", "path_mtu", "path_mig_state", "qkey", "rq_psn", "sq_psn", "dest_qp_num", "qp_access_flags", "cap", "ah_attr", "alt_ah_attr", "pkey_index", "alt_pkey_index", "en_sqd_async_notify", "sq_draining", "max_rd_atomic", "max_dest_rd_atomic", "min_rnr_timer", "port_num", "timeout", "retry_cnt", "rnr_retry", "alt_port_num", "alt_timeout", "rate_limit"},
	"ibv_sge":          {"addr", "length", "lkey"},
	"ibv_send_wr":      {"wr_id", "next", "sg_list", "num_sge", "opcode", "send_flags", "imm_data", "wr.rdma.remote_addr", "wr.rdma.rkey", "qp_type", "bind_mw", "tso"},
	"ibv_wc":           {"wr_id", "status", "opcode", "vendor_err", "byte_len", "imm_data", "qp_num", "src_qp", "wc_flags", "pkey_index", "slid", "sl", "dlid_path_bits"},
	"ibv_mw_bind_info": {"mr", "addr", "length", "mw_access_flags"},
}

// sizeOnly are structures whose size must agree but that the library may
// have grown past (the shim gives ibv_query_port room for a longer one).
var sizeExempt = map[string]bool{"ibv_context": true, "ibv_cq": true, "ibv_qp": true, "ibv_mr": true}

func abiCheckSource() string {
	var b strings.Builder
	b.WriteString("#include <stddef.h>\n#include <infiniband/verbs.h>\n#include \"verbs_abi.h\"\n")
	for s, fields := range abiFields {
		for _, f := range fields {
			fmt.Fprintf(&b, "_Static_assert(offsetof(struct %s, %s) == offsetof(struct okv_%s, %s), \"%s.%s\");\n", s, f, s, f, s, f)
		}
		if !sizeExempt[s] {
			fmt.Fprintf(&b, "_Static_assert(sizeof(struct %s) == sizeof(struct okv_%s), \"sizeof %s\");\n", s, s, s)
		}
	}
	// Constants the shim and verbs.go hard-code.
	for name, v := range map[string]int{
		"IBV_WR_RDMA_READ": int(opRead), "IBV_WR_RDMA_WRITE": int(opWrite), "IBV_SEND_SIGNALED": 2, "IBV_QPT_RC": 2,
		"IBV_ACCESS_LOCAL_WRITE": accessLocalWrite, "IBV_ACCESS_REMOTE_WRITE": accessRemoteWrite, "IBV_ACCESS_REMOTE_READ": accessRemoteRead,
		"IBV_QPS_RESET": int(QPReset), "IBV_QPS_INIT": int(QPInit), "IBV_QPS_RTR": int(QPRTR), "IBV_QPS_RTS": int(QPRTS), "IBV_QPS_ERR": int(QPErr),
		"IBV_WC_SUCCESS": int(WCSuccess), "IBV_WC_WR_FLUSH_ERR": int(WCFlushErr), "IBV_WC_REM_ACCESS_ERR": int(WCRemAccessErr),
		"IBV_WC_LOC_PROT_ERR": int(WCLocProtErr), "IBV_WC_RETRY_EXC_ERR": int(WCRetryExcErr), "IBV_WC_LOC_LEN_ERR": int(WCLocLenErr),
		"IBV_PORT_ACTIVE": portActive, "IBV_LINK_LAYER_ETHERNET": linkEthernet, "IBV_LINK_LAYER_INFINIBAND": linkIB,
		"IBV_QP_STATE": 1 << 0, "IBV_QP_ACCESS_FLAGS": 1 << 3, "IBV_QP_PKEY_INDEX": 1 << 4, "IBV_QP_PORT": 1 << 5, "IBV_QP_AV": 1 << 7,
		"IBV_QP_PATH_MTU": 1 << 8, "IBV_QP_TIMEOUT": 1 << 9, "IBV_QP_RETRY_CNT": 1 << 10, "IBV_QP_RNR_RETRY": 1 << 11, "IBV_QP_RQ_PSN": 1 << 12,
		"IBV_QP_MAX_QP_RD_ATOMIC": 1 << 13, "IBV_QP_MIN_RNR_TIMER": 1 << 15, "IBV_QP_SQ_PSN": 1 << 16, "IBV_QP_MAX_DEST_RD_ATOMIC": 1 << 17, "IBV_QP_DEST_QPN": 1 << 20,
		"IBV_MTU_4096": 5, "IBV_MTU_256": 1,
	} {
		fmt.Fprintf(&b, "_Static_assert(%s == %d, \"%s\");\n", name, v, name)
	}
	return b.String()
}
