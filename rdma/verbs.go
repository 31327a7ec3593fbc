package rdma

import (
	"fmt"
	"syscall"
)

// The verbs seam. Everything in this package above the verbs calls (the QP
// state machine, connection exchange, striping, completion handling, error
// recovery) talks to libibverbs through the verbs interface: verbs_cgo.go is
// the real binding (dlopen), fakeverbs_test.go an in-memory FAKE used by the
// tests (it moves bytes between fake devices and can fail any call, reorder
// completions, return error completions or never complete).

// handle is an opaque verbs object: a C pointer in the binding, an index in
// the fake. Zero is never a valid handle.
type handle uint64

// deviceInfo is one entry of ibv_get_device_list.
type deviceInfo struct {
	Name string
	GUID uint64
}

// portInfo is the part of ibv_port_attr the engine reads.
type portInfo struct {
	State     uint8 // portActive when usable
	ActiveMTU MTU
	LID       uint16
	LinkLayer uint8 // linkIB or linkEthernet
	GIDs      int   // gid_tbl_len
}

const (
	portActive   = 4 // IBV_PORT_ACTIVE
	linkIB       = 1 // IBV_LINK_LAYER_INFINIBAND
	linkEthernet = 2 // IBV_LINK_LAYER_ETHERNET
)

// mrInfo is a registered memory region on one NIC.
type mrInfo struct {
	mr         handle
	LKey, RKey uint32
}

// Access flags of a memory region and of a QP (enum ibv_access_flags).
const (
	accessLocalWrite  = 1
	accessRemoteWrite = 2
	accessRemoteRead  = 4
	accessAll         = accessLocalWrite | accessRemoteWrite | accessRemoteRead
)

// qpCaps sizes a QP's send queue.
type qpCaps struct {
	SendWR uint32 // max outstanding send work requests
	SGE    uint32 // max scatter/gather entries per request
}

// QPState is a queue pair's state (enum ibv_qp_state).
type QPState uint8

const (
	QPReset QPState = 0
	QPInit  QPState = 1
	QPRTR   QPState = 2
	QPRTS   QPState = 3
	QPErr   QPState = 6
)

func (s QPState) String() string {
	switch s {
	case QPReset:
		return "RESET"
	case QPInit:
		return "INIT"
	case QPRTR:
		return "RTR"
	case QPRTS:
		return "RTS"
	case QPErr:
		return "ERR"
	}
	return fmt.Sprintf("state(%d)", uint8(s))
}

// qpAttr is one ibv_modify_qp call: the target state and the attributes
// that transition needs (qpstate.go builds them; the binding derives the
// attribute mask from State).
type qpAttr struct {
	State     QPState
	Port      uint8
	Access    uint32
	MTU       MTU
	DestQPN   uint32
	RQPSN     uint32
	SQPSN     uint32
	DGID      GID
	DLID      uint16
	SGIDIndex uint8
	Global    bool // a GRH is needed (RoCE, or IB across subnets)
	// Reads in flight: this QP's as initiator (RTS) and as target (RTR).
	MaxRdAtomic, MaxDestRdAtomic uint8
	MinRNRTimer, Timeout         uint8
	RetryCnt, RNRRetry           uint8
}

type opcode uint8

const (
	opWrite opcode = 0 // IBV_WR_RDMA_WRITE
	opRead  opcode = 4 // IBV_WR_RDMA_READ
)

func (o opcode) String() string {
	if o == opRead {
		return "READ"
	}
	return "WRITE"
}

// sge is one scatter/gather entry (struct ibv_sge).
type sge struct {
	Addr uint64
	Len  uint32
	LKey uint32
}

// sendWR is one signalled RDMA READ or WRITE (struct ibv_send_wr).
type sendWR struct {
	ID         uint64
	Op         opcode
	SGEs       []sge
	RemoteAddr uint64
	RKey       uint32
}

// completion is one work completion (struct ibv_wc).
type completion struct {
	ID        uint64
	Status    WCStatus
	VendorErr uint32
}

// WCStatus is a work completion's status (enum ibv_wc_status).
type WCStatus uint32

const (
	WCSuccess      WCStatus = 0
	WCLocLenErr    WCStatus = 1
	WCLocProtErr   WCStatus = 4
	WCFlushErr     WCStatus = 5
	WCRemAccessErr WCStatus = 10
	WCRetryExcErr  WCStatus = 12
)

var wcNames = map[WCStatus]string{
	0: "success", 1: "local length error", 2: "local QP operation error",
	4: "local protection error", 5: "work request flushed", 7: "bad response",
	8: "local access error", 9: "remote invalid request", 10: "remote access error",
	11: "remote operation error", 12: "transport retry counter exceeded",
	13: "RNR retry counter exceeded", 21: "general error",
}

func (s WCStatus) String() string {
	if n, ok := wcNames[s]; ok {
		return n
	}
	return fmt.Sprintf("status %d", uint32(s))
}

// verbs is the seam: one method per verbs call the engine makes. Methods
// return a *VerbsError on failure. Implementations must be safe for
// concurrent use on different objects; the engine serialises use of one QP
// and its CQ (one batch per Conn at a time).
type verbs interface {
	deviceList() ([]deviceInfo, error)
	openDevice(name string) (handle, error)
	closeDevice(ctx handle) error
	queryPort(ctx handle, port uint8) (portInfo, error)
	queryGID(ctx handle, port uint8, index int) (GID, error)
	// gidType is the type of GID index of device dev's port (sysfs in the
	// binding); GIDTypeUnknown when it cannot be read.
	gidType(dev string, port uint8, index int) GIDType
	allocPD(ctx handle) (handle, error)
	deallocPD(pd handle) error
	regMR(pd handle, addr uintptr, length uint64, access uint32) (mrInfo, error)
	// regDmabufMR registers length bytes at offset in a dmabuf fd (device
	// memory exported by the GPU driver), addressed by iova in work requests.
	regDmabufMR(pd handle, offset, length, iova uint64, fd int, access uint32) (mrInfo, error)
	deregMR(mr handle) error
	createCQ(ctx handle, depth int) (handle, error)
	destroyCQ(cq handle) error
	createQP(pd, cq handle, caps qpCaps) (qp handle, qpn uint32, err error)
	modifyQP(qp handle, a qpAttr) error
	destroyQP(qp handle) error
	// postSend posts wrs in order and returns how many were accepted: on an
	// error, wrs[posted:] were not posted (ibv_post_send's bad_wr).
	postSend(qp handle, wrs []sendWR) (posted int, err error)
	// pollCQ fills out with up to len(out) completions without blocking.
	pollCQ(cq handle, out []completion) (int, error)
}

func errnoName(n int) string {
	if n <= 0 {
		return "unknown"
	}
	return syscall.Errno(n).Error()
}
