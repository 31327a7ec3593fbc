package rdma

import (
	"fmt"
	"math/rand/v2"
	"sync"
	"syscall"
)

// fakeVerbs is a FAKE of the verbs seam, for tests only: an in-memory
// fabric of fake devices. It is not a model of any NIC's timing; it is a
// strict model of the rules the engine must follow, and a fault injector:
//
//   - memory: regMR records ranges of buffers the test made with alloc; a
//     READ or WRITE really copies bytes between them, checking lkeys,
//     rkeys, bounds and access like a NIC (LOC_PROT_ERR, REM_ACCESS_ERR);
//   - the QP state machine: modifyQP refuses illegal transitions and RTR
//     without a destination; postSend refuses a QP that is not in RTS (or
//     ERR, where work is accepted and flushed) and a full send queue;
//   - a work request to a QP that is not connected back completes with
//     RETRY_EXC_ERR (the peer's QP reset, or never connected);
//   - an error completion moves the QP to ERR and flushes what it holds;
//   - faults: failCall fails the nth call of a method; wcFault gives a work
//     request an error status; hold keeps matching work requests from ever
//     completing (until their QP goes to ERR); reorder returns each poll's
//     completions shuffled.
type fakeVerbs struct {
	mu      sync.Mutex
	devices map[string]*fakeDev
	objs    map[handle]any
	next    handle
	mem     []fakeBuf

	calls    map[string]int
	failCall map[string]map[int]int                      // method → call number (1-based, 0 = every) → errno
	wcFault  func(dev string, w sendWR) (WCStatus, bool) // an error status for w posted on dev, or false
	hold     func(w sendWR) bool                         // never complete w while its QP is up
	reorder  *rand.Rand
	noise    bool   // every poll also returns a completion of no batch of ours
	onPoll   func() // called at every pollCQ (under the fake's lock)
	copied   uint64 // bytes moved by completed work requests
}

type fakeDev struct {
	name string
	gid  GID
	// gids, when set, is the port's GID table (index → entry) instead of
	// gid alone at index 1 with no type; gid must be one of its entries
	// (the one peers address) for connections to work.
	gids map[int]gidEntry
	port portInfo
	qps  map[uint32]*fakeQP
	qpn  uint32
}

type fakeBuf struct {
	addr uint64
	b    []byte
}

type fakeCtx struct{ dev *fakeDev }
type fakePD struct{ ctx *fakeCtx }
type fakeMR struct {
	pd         *fakePD
	addr, n    uint64
	lkey, rkey uint32
	access     uint32
	dmabuf     bool
}
type fakeCQ struct {
	ctx   *fakeCtx
	queue []completion
	depth int
}
type fakeQP struct {
	pd      *fakePD
	cq      *fakeCQ
	qpn     uint32
	state   QPState
	attr    qpAttr // RTR's
	sqPSN   uint32 // RTS's
	caps    qpCaps
	out     int      // posted, not yet completed
	done    int      // completed successfully
	held    []sendWR // held by the hold fault
	dev     *fakeDev
	destroy bool
}

// newFakeVerbs makes a fabric with the named devices, each with one active
// RoCE port (MTU 4096 unless mtus says otherwise).
func newFakeVerbs(names ...string) *fakeVerbs {
	f := &fakeVerbs{devices: map[string]*fakeDev{}, objs: map[handle]any{}, calls: map[string]int{}, failCall: map[string]map[int]int{}}
	for i, n := range names {
		d := &fakeDev{name: n, qps: map[uint32]*fakeQP{}, qpn: uint32(0x100 * (i + 1)),
			port: portInfo{State: portActive, ActiveMTU: 5, LinkLayer: linkEthernet, GIDs: 4}}
		d.gid[0], d.gid[15] = 0xfe, byte(i+1)
		f.devices[n] = d
	}
	return f
}

// alloc returns n bytes the fake can resolve addresses in (tests register
// these; the fake never turns an integer back into a pointer).
func (f *fakeVerbs) alloc(n int) []byte {
	b := make([]byte, n)
	f.mu.Lock()
	f.mem = append(f.mem, fakeBuf{addr: addrOf(b), b: b})
	f.mu.Unlock()
	return b
}

func (f *fakeVerbs) bytesAt(addr, n uint64) []byte {
	for _, m := range f.mem {
		if addr >= m.addr && addr+n <= m.addr+uint64(len(m.b)) {
			return m.b[addr-m.addr : addr-m.addr+n]
		}
	}
	return nil
}

// fail makes call number nth (1-based; 0 = every call) of method fail with
// errno.
func (f *fakeVerbs) fail(method string, nth int, errno syscall.Errno) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.failCall[method] == nil {
		f.failCall[method] = map[int]int{}
	}
	f.failCall[method][nth] = int(errno)
}

// enter counts a call and returns the injected error, if any. Locked.
func (f *fakeVerbs) enterLocked(method string) error {
	f.calls[method]++
	m := f.failCall[method]
	if e, ok := m[f.calls[method]]; ok {
		return &VerbsError{Op: "fake " + method, Errno: e}
	}
	if e, ok := m[0]; ok {
		return &VerbsError{Op: "fake " + method, Errno: e}
	}
	return nil
}

func (f *fakeVerbs) add(o any) handle {
	f.next++
	f.objs[f.next] = o
	return f.next
}

func get[T any](f *fakeVerbs, h handle) (T, error) {
	o, ok := f.objs[h].(T)
	if !ok {
		return o, &VerbsError{Op: fmt.Sprintf("fake: handle %d is not a %T", h, o), Errno: int(syscall.EINVAL)}
	}
	return o, nil
}

func (f *fakeVerbs) deviceList() ([]deviceInfo, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.enterLocked("deviceList"); err != nil {
		return nil, err
	}
	var out []deviceInfo
	for _, n := range sortedKeys(f.devices) {
		out = append(out, deviceInfo{Name: n, GUID: uint64(len(out) + 1)})
	}
	return out, nil
}

func (f *fakeVerbs) openDevice(name string) (handle, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.enterLocked("openDevice"); err != nil {
		return 0, err
	}
	d, ok := f.devices[name]
	if !ok {
		return 0, &VerbsError{Op: "fake openDevice " + name, Errno: int(syscall.ENODEV)}
	}
	return f.add(&fakeCtx{dev: d}), nil
}

func (f *fakeVerbs) closeDevice(h handle) error { return f.drop("closeDevice", h) }
func (f *fakeVerbs) deallocPD(h handle) error   { return f.drop("deallocPD", h) }
func (f *fakeVerbs) deregMR(h handle) error     { return f.drop("deregMR", h) }
func (f *fakeVerbs) destroyCQ(h handle) error   { return f.drop("destroyCQ", h) }

func (f *fakeVerbs) drop(method string, h handle) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.enterLocked(method); err != nil {
		return err
	}
	if _, ok := f.objs[h]; !ok {
		return &VerbsError{Op: fmt.Sprintf("fake %s of unknown handle %d", method, h), Errno: int(syscall.EINVAL)}
	}
	delete(f.objs, h)
	return nil
}

func (f *fakeVerbs) queryPort(h handle, port uint8) (portInfo, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.enterLocked("queryPort"); err != nil {
		return portInfo{}, err
	}
	c, err := get[*fakeCtx](f, h)
	if err != nil || port != 1 {
		return portInfo{}, &VerbsError{Op: "fake queryPort", Errno: int(syscall.EINVAL)}
	}
	return c.dev.port, nil
}

func (f *fakeVerbs) queryGID(h handle, port uint8, index int) (GID, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.enterLocked("queryGID"); err != nil {
		return GID{}, err
	}
	c, err := get[*fakeCtx](f, h)
	if err != nil {
		return GID{}, err
	}
	if c.dev.gids != nil {
		return c.dev.gids[index].GID, nil
	}
	if index != 1 { // only index 1 holds an address, like RoCE's IPv4 GID
		return GID{}, nil
	}
	return c.dev.gid, nil
}

func (f *fakeVerbs) gidType(dev string, port uint8, index int) GIDType {
	f.mu.Lock()
	defer f.mu.Unlock()
	if d := f.devices[dev]; d != nil && d.gids != nil && port == 1 {
		return d.gids[index].Type
	}
	return GIDTypeUnknown
}

func (f *fakeVerbs) allocPD(h handle) (handle, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.enterLocked("allocPD"); err != nil {
		return 0, err
	}
	c, err := get[*fakeCtx](f, h)
	if err != nil {
		return 0, err
	}
	return f.add(&fakePD{ctx: c}), nil
}

func (f *fakeVerbs) regMR(pd handle, addr uintptr, n uint64, access uint32) (mrInfo, error) {
	return f.reg("regMR", pd, uint64(addr), n, access, false)
}

func (f *fakeVerbs) regDmabufMR(pd handle, offset, n, iova uint64, fd int, access uint32) (mrInfo, error) {
	return f.reg("regDmabufMR", pd, iova, n, access, true)
}

func (f *fakeVerbs) reg(method string, pdh handle, addr, n uint64, access uint32, dmabuf bool) (mrInfo, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.enterLocked(method); err != nil {
		return mrInfo{}, err
	}
	pd, err := get[*fakePD](f, pdh)
	if err != nil {
		return mrInfo{}, err
	}
	if !dmabuf && f.bytesAt(addr, n) == nil {
		return mrInfo{}, &VerbsError{Op: "fake regMR of memory the test did not alloc", Errno: int(syscall.EFAULT)}
	}
	key := uint32(f.next+1)<<8 | 0x5a
	m := &fakeMR{pd: pd, addr: addr, n: n, lkey: key, rkey: key ^ 0xff0000, access: access, dmabuf: dmabuf}
	return mrInfo{mr: f.add(m), LKey: m.lkey, RKey: m.rkey}, nil
}

func (f *fakeVerbs) createCQ(h handle, depth int) (handle, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.enterLocked("createCQ"); err != nil {
		return 0, err
	}
	c, err := get[*fakeCtx](f, h)
	if err != nil {
		return 0, err
	}
	return f.add(&fakeCQ{ctx: c, depth: depth}), nil
}

func (f *fakeVerbs) createQP(pdh, cqh handle, caps qpCaps) (handle, uint32, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.enterLocked("createQP"); err != nil {
		return 0, 0, err
	}
	pd, err := get[*fakePD](f, pdh)
	if err != nil {
		return 0, 0, err
	}
	cq, err := get[*fakeCQ](f, cqh)
	if err != nil {
		return 0, 0, err
	}
	d := pd.ctx.dev
	d.qpn++
	q := &fakeQP{pd: pd, cq: cq, qpn: d.qpn, caps: caps, dev: d}
	d.qps[q.qpn] = q
	return f.add(q), q.qpn, nil
}

func (f *fakeVerbs) destroyQP(h handle) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.enterLocked("destroyQP"); err != nil {
		return err
	}
	q, err := get[*fakeQP](f, h)
	if err != nil {
		return err
	}
	delete(q.dev.qps, q.qpn)
	delete(f.objs, h)
	q.destroy, q.held = true, nil
	return nil
}

func (f *fakeVerbs) modifyQP(h handle, a qpAttr) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.enterLocked("modifyQP"); err != nil {
		return err
	}
	q, err := get[*fakeQP](f, h)
	if err != nil {
		return err
	}
	if !legalTransition(q.state, a.State) {
		return &VerbsError{Op: fmt.Sprintf("fake modifyQP %s→%s", q.state, a.State), Errno: int(syscall.EINVAL)}
	}
	if a.State == QPRTR && (a.DestQPN == 0 || a.MTU.Bytes() == 0 || a.MTU > q.dev.port.ActiveMTU) {
		return &VerbsError{Op: fmt.Sprintf("fake modifyQP RTR dest %#x mtu %d", a.DestQPN, a.MTU), Errno: int(syscall.EINVAL)}
	}
	switch a.State {
	case QPRTR:
		q.attr = a
	case QPRTS:
		q.sqPSN = a.SQPSN
	case QPReset:
		q.attr, q.sqPSN, q.out, q.held = qpAttr{}, 0, 0, nil // reset discards the queues, completions included
	case QPErr:
		f.flushLocked(q)
	}
	q.state = a.State
	return nil
}

// flushLocked completes everything q holds with WR_FLUSH_ERR.
func (f *fakeVerbs) flushLocked(q *fakeQP) {
	for _, w := range q.held {
		q.cq.queue = append(q.cq.queue, completion{ID: w.ID, Status: WCFlushErr})
	}
	q.held = nil
}

func (f *fakeVerbs) postSend(h handle, wrs []sendWR) (int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.enterLocked("postSend"); err != nil {
		return 0, err
	}
	q, err := get[*fakeQP](f, h)
	if err != nil {
		return 0, err
	}
	if q.state != QPRTS && q.state != QPErr {
		return 0, &VerbsError{Op: "fake postSend on a QP in " + q.state.String(), Errno: int(syscall.EINVAL)}
	}
	for i, w := range wrs {
		if q.out >= int(q.caps.SendWR) || len(w.SGEs) > int(q.caps.SGE) {
			return i, &VerbsError{Op: fmt.Sprintf("fake postSend: queue %d/%d, %d SGEs", q.out, q.caps.SendWR, len(w.SGEs)), Errno: int(syscall.ENOMEM)}
		}
		q.out++
		f.executeLocked(q, w)
	}
	return len(wrs), nil
}

// executeLocked runs one work request to completion (or holds it).
func (f *fakeVerbs) executeLocked(q *fakeQP, w sendWR) {
	switch {
	case q.state == QPErr:
		f.completeLocked(q, w, WCFlushErr)
	case f.hold != nil && f.hold(w):
		q.held = append(q.held, w)
	default:
		st := WCSuccess
		if f.wcFault != nil {
			if s, ok := f.wcFault(q.dev.name, w); ok {
				st = s
			}
		}
		if st == WCSuccess {
			st = f.transferLocked(q, w)
		}
		if st == WCSuccess {
			q.done++
		}
		f.completeLocked(q, w, st)
	}
}

func (f *fakeVerbs) completeLocked(q *fakeQP, w sendWR, st WCStatus) {
	q.cq.queue = append(q.cq.queue, completion{ID: w.ID, Status: st, VendorErr: uint32(st) << 8})
	if st != WCSuccess && q.state != QPErr {
		q.state = QPErr
		f.flushLocked(q)
	}
}

// transferLocked moves w's bytes, checking what a NIC checks.
func (f *fakeVerbs) transferLocked(q *fakeQP, w sendWR) WCStatus {
	peer := f.peerLocked(q)
	if peer == nil {
		return WCRetryExcErr
	}
	var total uint64
	local := make([][]byte, len(w.SGEs))
	for i, s := range w.SGEs {
		b := f.localLocked(q.pd, s)
		if b == nil {
			return WCLocProtErr
		}
		local[i] = b
		total += uint64(s.Len)
	}
	need := uint32(accessRemoteRead)
	if w.Op == opWrite {
		need = accessRemoteWrite
	}
	remote := f.remoteLocked(peer.pd, w.RKey, w.RemoteAddr, total, need)
	if remote == nil {
		return WCRemAccessErr
	}
	for _, b := range local {
		if w.Op == opRead {
			copy(b, remote[:len(b)])
		} else {
			copy(remote[:len(b)], b)
		}
		remote = remote[len(b):]
	}
	f.copied += total
	return WCSuccess
}

// peerLocked is the QP q is connected to, if that QP is connected back to q,
// able to respond (RTR or RTS) and expecting q's packet sequence numbers.
func (f *fakeVerbs) peerLocked(q *fakeQP) *fakeQP {
	for _, d := range f.devices {
		if d.gid != q.attr.DGID {
			continue
		}
		p := d.qps[q.attr.DestQPN]
		if p == nil || p.destroy || (p.state != QPRTR && p.state != QPRTS) || p.attr.DestQPN != q.qpn || p.attr.DGID != q.dev.gid || p.attr.RQPSN != q.sqPSN {
			return nil
		}
		if sgidType(q) != sgidType(p) { // RoCE v1 frames are not RoCE v2 packets
			return nil
		}
		return p
	}
	return nil
}

// sgidType is the type of the GID q sends from (unknown without a table).
func sgidType(q *fakeQP) GIDType {
	return q.dev.gids[int(q.attr.SGIDIndex)].Type
}

func (f *fakeVerbs) localLocked(pd *fakePD, s sge) []byte {
	for _, o := range f.objs {
		if m, ok := o.(*fakeMR); ok && m.pd == pd && m.lkey == s.LKey && s.Addr >= m.addr && s.Addr+uint64(s.Len) <= m.addr+m.n {
			return f.bytesAt(s.Addr, uint64(s.Len))
		}
	}
	return nil
}

func (f *fakeVerbs) remoteLocked(pd *fakePD, rkey uint32, addr, n uint64, need uint32) []byte {
	for _, o := range f.objs {
		if m, ok := o.(*fakeMR); ok && m.pd == pd && m.rkey == rkey && m.access&need != 0 && addr >= m.addr && addr+n <= m.addr+m.n {
			return f.bytesAt(addr, n)
		}
	}
	return nil
}

func (f *fakeVerbs) pollCQ(h handle, out []completion) (int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.enterLocked("pollCQ"); err != nil {
		return 0, err
	}
	if f.onPoll != nil {
		f.onPoll()
	}
	cq, err := get[*fakeCQ](f, h)
	if err != nil {
		return 0, err
	}
	if f.reorder != nil {
		f.reorder.Shuffle(len(cq.queue), func(i, j int) { cq.queue[i], cq.queue[j] = cq.queue[j], cq.queue[i] })
	}
	n := copy(out, cq.queue)
	cq.queue = cq.queue[n:]
	if f.noise && n < len(out) {
		out[n] = completion{ID: 0xdead << 32, Status: WCSuccess}
		n++
		// the noise completion belongs to no QP: not counted
		for _, w := range out[:n-1] {
			f.countLocked(cq, w)
		}
		return n, nil
	}
	for _, w := range out[:n] {
		f.countLocked(cq, w)
	}
	return n, nil
}

// countLocked takes a polled completion off its QP's outstanding count.
func (f *fakeVerbs) countLocked(cq *fakeCQ, w completion) {
	for _, o := range f.objs {
		if q, ok := o.(*fakeQP); ok && q.cq == cq && q.out > 0 && f.ownsLocked(q, w.ID) {
			q.out--
			return
		}
	}
}

// ownsLocked: with one QP per CQ (the engine's layout) every completion on
// the CQ is that QP's.
func (f *fakeVerbs) ownsLocked(q *fakeQP, id uint64) bool { return true }

// qpOf returns the fake QP behind a lane (tests inspect states).
func (f *fakeVerbs) qpOf(h handle) *fakeQP {
	f.mu.Lock()
	defer f.mu.Unlock()
	q, _ := f.objs[h].(*fakeQP)
	return q
}

func (f *fakeVerbs) count(method string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls[method]
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	for i := range out {
		for j := i + 1; j < len(out); j++ {
			if out[j] < out[i] {
				out[i], out[j] = out[j], out[i]
			}
		}
	}
	return out
}
