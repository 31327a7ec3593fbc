//go:build cgo && linux

// Memory ownership: this file turns Go calls into shim calls. Verbs objects
// are created here for Go values (Engine, Region, Conn) that own them and
// release them through the matching destroy/dereg/close; handles are the C
// pointers as integers and are never dereferenced in Go. Go memory passed
// to C (names, the flat work request, SGE and completion arrays) holds no
// Go pointers and is borrowed for one call (runtime.KeepAlive after it).
// Registered host memory is not Go heap memory (Engine.RegisterHost).

package rdma

/*
#cgo LDFLAGS: -ldl
#include <stdlib.h>
#include "shim.h"
*/
import "C"

import (
	"fmt"
	"os"
	"runtime"
	"sync"
	"unsafe"
)

// libraryName is what Open dlopens; Config.Library or ORBITKV_LIBIBVERBS
// override it.
const libraryName = "libibverbs.so.1"

var library struct {
	sync.Mutex
	loaded string // the path whose symbols the shim holds
}

// loadVerbs dlopens libibverbs (once per process; a failed load is retried
// by the next Open; a later Open naming another path only checks that it
// loads) and returns the binding.
func loadVerbs(path string) (verbs, error) {
	if p := os.Getenv("ORBITKV_LIBIBVERBS"); p != "" {
		path = p
	}
	if path == "" {
		path = libraryName
	}
	library.Lock()
	defer library.Unlock()
	cpath := C.CString(path)
	defer C.free(unsafe.Pointer(cpath))
	var buf [512]C.char
	switch {
	case library.loaded == path:
	case library.loaded != "": // another path: it must exist, the table stays
		if C.okv_ibv_probe(cpath, &buf[0], C.size_t(len(buf))) != 0 {
			return nil, fmt.Errorf("%w (%s)", ErrNoLibrary, C.GoString(&buf[0]))
		}
	default:
		if C.okv_ibv_load(cpath, &buf[0], C.size_t(len(buf))) != 0 {
			return nil, fmt.Errorf("%w (%s)", ErrNoLibrary, C.GoString(&buf[0]))
		}
		library.loaded = path
	}
	return cverbs{}, nil
}

// cverbs is the real binding.
type cverbs struct{}

func verr(op string, rc C.int) error {
	if rc == 0 {
		return nil
	}
	return &VerbsError{Op: op, Errno: int(rc)}
}

func ptr(h handle) C.okv_h { return C.okv_h(h) }

func (cverbs) deviceList() ([]deviceInfo, error) {
	var devs [64]C.okv_dev
	var n C.int
	if err := verr("ibv_get_device_list", C.okv_ibv_devices(&devs[0], C.int(len(devs)), &n)); err != nil {
		return nil, err
	}
	out := make([]deviceInfo, n)
	for i := range out {
		out[i] = deviceInfo{Name: C.GoString(&devs[i].name[0]), GUID: uint64(devs[i].guid)}
	}
	return out, nil
}

func (cverbs) openDevice(name string) (handle, error) {
	cname := C.CString(name)
	defer C.free(unsafe.Pointer(cname))
	var ctx C.okv_h
	err := verr("ibv_open_device "+name, C.okv_ibv_open(cname, &ctx))
	return handle(ctx), err
}

func (cverbs) closeDevice(ctx handle) error {
	return verr("ibv_close_device", C.okv_ibv_close(ptr(ctx)))
}

func (cverbs) queryPort(ctx handle, port uint8) (portInfo, error) {
	var p C.okv_port
	if err := verr(fmt.Sprintf("ibv_query_port %d", port), C.okv_ibv_query_port(ptr(ctx), C.uint8_t(port), &p)); err != nil {
		return portInfo{}, err
	}
	return portInfo{State: uint8(p.state), ActiveMTU: MTU(p.active_mtu), LID: uint16(p.lid), LinkLayer: uint8(p.link_layer), GIDs: int(p.gid_tbl_len)}, nil
}

func (cverbs) queryGID(ctx handle, port uint8, index int) (GID, error) {
	var g GID
	err := verr(fmt.Sprintf("ibv_query_gid %d/%d", port, index),
		C.okv_ibv_query_gid(ptr(ctx), C.uint8_t(port), C.int(index), (*C.uint8_t)(unsafe.Pointer(&g[0]))))
	return g, err
}

// sysfsInfiniband is where the kernel lists RDMA devices.
const sysfsInfiniband = "/sys/class/infiniband"

func (cverbs) gidType(dev string, port uint8, index int) GIDType {
	return gidTypeFromSysfs(sysfsInfiniband, dev, port, index)
}

func (cverbs) allocPD(ctx handle) (handle, error) {
	var pd C.okv_h
	err := verr("ibv_alloc_pd", C.okv_ibv_alloc_pd(ptr(ctx), &pd))
	return handle(pd), err
}

func (cverbs) deallocPD(pd handle) error {
	return verr("ibv_dealloc_pd", C.okv_ibv_dealloc_pd(ptr(pd)))
}

func (cverbs) regMR(pd handle, addr uintptr, length uint64, access uint32) (mrInfo, error) {
	var mr C.okv_h
	var l, r C.uint32_t
	err := verr(fmt.Sprintf("ibv_reg_mr %d bytes", length),
		C.okv_ibv_reg_mr(ptr(pd), C.uint64_t(addr), C.uint64_t(length), C.int(access), &mr, &l, &r))
	return mrInfo{mr: handle(mr), LKey: uint32(l), RKey: uint32(r)}, err
}

func (cverbs) regDmabufMR(pd handle, offset, length, iova uint64, fd int, access uint32) (mrInfo, error) {
	if C.okv_ibv_has_dmabuf() == 0 {
		return mrInfo{}, fmt.Errorf("%w: this libibverbs has no ibv_reg_dmabuf_mr (rdma-core 34+)", ErrNotSupported)
	}
	var mr C.okv_h
	var l, r C.uint32_t
	err := verr(fmt.Sprintf("ibv_reg_dmabuf_mr %d bytes", length),
		C.okv_ibv_reg_dmabuf_mr(ptr(pd), C.uint64_t(offset), C.uint64_t(length), C.uint64_t(iova), C.int(fd), C.int(access), &mr, &l, &r))
	return mrInfo{mr: handle(mr), LKey: uint32(l), RKey: uint32(r)}, err
}

func (cverbs) deregMR(mr handle) error { return verr("ibv_dereg_mr", C.okv_ibv_dereg_mr(ptr(mr))) }

func (cverbs) createCQ(ctx handle, depth int) (handle, error) {
	var cq C.okv_h
	err := verr(fmt.Sprintf("ibv_create_cq %d", depth), C.okv_ibv_create_cq(ptr(ctx), C.int(depth), &cq))
	return handle(cq), err
}

func (cverbs) destroyCQ(cq handle) error {
	return verr("ibv_destroy_cq", C.okv_ibv_destroy_cq(ptr(cq)))
}

func (cverbs) createQP(pd, cq handle, caps qpCaps) (handle, uint32, error) {
	var qp C.okv_h
	var qpn C.uint32_t
	err := verr("ibv_create_qp RC", C.okv_ibv_create_qp(ptr(pd), ptr(cq), C.uint32_t(caps.SendWR), C.uint32_t(caps.SGE), &qp, &qpn))
	return handle(qp), uint32(qpn), err
}

func (cverbs) destroyQP(qp handle) error {
	return verr("ibv_destroy_qp", C.okv_ibv_destroy_qp(ptr(qp)))
}

func (cverbs) modifyQP(qp handle, a qpAttr) error {
	c := C.okv_qp_attr{
		state: C.uint8_t(a.State), port: C.uint8_t(a.Port), mtu: C.uint8_t(a.MTU), sgid_index: C.uint8_t(a.SGIDIndex),
		max_rd_atomic: C.uint8_t(a.MaxRdAtomic), max_dest_rd_atomic: C.uint8_t(a.MaxDestRdAtomic),
		min_rnr_timer: C.uint8_t(a.MinRNRTimer), timeout: C.uint8_t(a.Timeout), retry_cnt: C.uint8_t(a.RetryCnt),
		rnr_retry: C.uint8_t(a.RNRRetry), dlid: C.uint16_t(a.DLID), access: C.uint32_t(a.Access),
		dest_qpn: C.uint32_t(a.DestQPN), rq_psn: C.uint32_t(a.RQPSN), sq_psn: C.uint32_t(a.SQPSN),
	}
	if a.Global {
		c.is_global = 1
	}
	for i, b := range a.DGID {
		c.dgid[i] = C.uint8_t(b)
	}
	return verr("ibv_modify_qp to "+a.State.String(), C.okv_ibv_modify_qp(ptr(qp), &c))
}

func (cverbs) postSend(qp handle, wrs []sendWR) (int, error) {
	if len(wrs) == 0 {
		return 0, nil
	}
	cw := make([]C.okv_wr, len(wrs))
	var cs []C.okv_sge
	for i, w := range wrs {
		cw[i] = C.okv_wr{id: C.uint64_t(w.ID), remote_addr: C.uint64_t(w.RemoteAddr), rkey: C.uint32_t(w.RKey),
			opcode: C.uint32_t(w.Op), first_sge: C.uint32_t(len(cs)), num_sge: C.uint32_t(len(w.SGEs))}
		for _, s := range w.SGEs {
			cs = append(cs, C.okv_sge{addr: C.uint64_t(s.Addr), length: C.uint32_t(s.Len), lkey: C.uint32_t(s.LKey)})
		}
	}
	if len(cs) == 0 {
		cs = make([]C.okv_sge, 1)
	}
	var posted C.int
	rc := C.okv_ibv_post_send(ptr(qp), &cw[0], C.int(len(cw)), &cs[0], &posted)
	runtime.KeepAlive(cw)
	runtime.KeepAlive(cs)
	return int(posted), verr(fmt.Sprintf("ibv_post_send %d requests", len(wrs)), rc)
}

func (cverbs) pollCQ(cq handle, out []completion) (int, error) {
	var wc [64]C.okv_wc
	n := C.okv_ibv_poll_cq(ptr(cq), &wc[0], C.int(min(len(out), len(wc))))
	if n < 0 {
		return 0, &VerbsError{Op: "ibv_poll_cq", Errno: int(-n)}
	}
	for i := range int(n) {
		out[i] = completion{ID: uint64(wc[i].id), Status: WCStatus(wc[i].status), VendorErr: uint32(wc[i].vendor_err)}
	}
	return int(n), nil
}
