package rdma

import (
	"errors"
	"fmt"
	"sync"
	"syscall"
	"unsafe"
)

// Engine is the RDMA side of one peer: the NICs it opened (a verbs context
// and protection domain each, on one port), the memory it registered on all
// of them, and the connections made through it.
type Engine struct {
	v     verbs
	cfg   Config
	nics  []*nic
	stats counters

	mu struct {
		sync.Mutex
		closed  bool
		nextKey uint32
		regions map[uint32]*Region
		conns   map[uint64]*Conn // by ConnInfo.ID
	}
}

// nic is one opened device port.
type nic struct {
	info    NIC
	ctx, pd handle
	end     laneEnd // without PSN: port, GID index, link layer, MTU
}

// NIC describes one device port the engine uses.
type NIC struct {
	Name      string
	Port      uint8
	GUID      uint64
	GID       GID
	GIDIndex  int     // its index in the port's table (pickGID)
	GIDType   GIDType // RoCE v2 unless --rdma-gid-index forced another
	LID       uint16
	ActiveMTU int      // bytes
	Netdevs   []string // network interfaces of the device (rdmamap)
}

// Open loads libibverbs, opens every allowed device with an active port and
// allocates a protection domain on each. With no library it returns an
// error wrapping ErrNoLibrary, with no usable device one wrapping
// ErrNoDevice (errors.Is(err, ErrNoDevice) holds for both); with Config.Off
// it returns ErrDisabled (which wraps ErrNoDevice too) without loading
// anything.
func Open(cfg Config) (*Engine, error) {
	if cfg.Off {
		return nil, ErrDisabled
	}
	cfg.Defaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	v, err := loadVerbs(cfg.Library)
	if err != nil {
		return nil, err
	}
	return open(v, cfg, netdevsOf)
}

// open is Open over any verbs implementation (the tests pass the fake).
func open(v verbs, cfg Config, netdevs func(string) []string) (*Engine, error) {
	cfg.Defaults()
	devs, err := v.deviceList()
	if err != nil {
		hint := ""
		if ve, ok := errors.AsType[*VerbsError](err); ok && ve.Errno == int(syscall.ENOSYS) {
			hint = " (the kernel has no RDMA support)"
		}
		return nil, fmt.Errorf("%w%s: list devices: %w", ErrNoDevice, hint, err)
	}
	sel, err := selectPorts(devs, cfg.Devices)
	if err != nil {
		return nil, err
	}
	e := &Engine{v: v, cfg: cfg}
	e.mu.regions, e.mu.conns = map[uint32]*Region{}, map[uint64]*Conn{}
	var skipped []error
	for _, s := range sel {
		n, err := e.openNIC(s.dev, s.sel.Port)
		if err != nil {
			skipped = append(skipped, err)
			continue
		}
		n.info.Netdevs = netdevs(n.info.Name)
		e.nics = append(e.nics, n)
	}
	if len(e.nics) == 0 {
		return nil, fmt.Errorf("%w (of %d device(s): %w)", ErrNoDevice, len(devs), errors.Join(skipped...))
	}
	return e, nil
}

type portSel struct {
	dev deviceInfo
	sel DeviceSel
}

// selectPorts applies the allowlist: every listed device must exist (a
// typo is an error, not a silent fallback to TCP); an empty list takes port
// 1 of every device.
func selectPorts(devs []deviceInfo, allow []DeviceSel) ([]portSel, error) {
	if len(devs) == 0 {
		return nil, ErrNoDevice
	}
	if len(allow) == 0 {
		out := make([]portSel, len(devs))
		for i, d := range devs {
			out[i] = portSel{d, DeviceSel{Name: d.Name, Port: 1}}
		}
		return out, nil
	}
	byName := map[string]deviceInfo{}
	for _, d := range devs {
		byName[d.Name] = d
	}
	var out []portSel
	for _, a := range allow {
		d, ok := byName[a.Name]
		if !ok {
			return nil, fmt.Errorf("%w: %q is not among the %d device(s) present", ErrNoDevice, a.Name, len(devs))
		}
		out = append(out, portSel{d, a})
	}
	return out, nil
}

func (e *Engine) openNIC(d deviceInfo, port uint8) (n *nic, err error) {
	ctx, err := e.v.openDevice(d.Name)
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", d.Name, err)
	}
	defer func() {
		if err != nil {
			e.v.closeDevice(ctx)
		}
	}()
	pi, err := e.v.queryPort(ctx, port)
	if err != nil {
		return nil, fmt.Errorf("query %s port %d: %w", d.Name, port, err)
	}
	if pi.State != portActive {
		return nil, fmt.Errorf("%s port %d is not active (state %d)", d.Name, port, pi.State)
	}
	gid, err := e.pickGID(ctx, d.Name, port, pi)
	if err != nil {
		return nil, err
	}
	pd, err := e.v.allocPD(ctx)
	if err != nil {
		return nil, fmt.Errorf("alloc PD on %s: %w", d.Name, err)
	}
	mtu := min(pi.ActiveMTU, mtuFromBytes(e.cfg.MaxMTU))
	return &nic{
		info: NIC{Name: d.Name, Port: port, GUID: d.GUID, GID: gid.GID, GIDIndex: gid.Index, GIDType: gid.Type, LID: pi.LID, ActiveMTU: pi.ActiveMTU.Bytes()},
		ctx:  ctx, pd: pd,
		end: laneEnd{Port: port, GIDIndex: uint8(gid.Index), LinkLayer: pi.LinkLayer, MTU: mtu},
	}, nil
}

// live reports ErrClosed after Close. (Close must not race the calls that
// create verbs objects: it releases the protection domains they use.)
func (e *Engine) live() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.mu.closed {
		return ErrClosed
	}
	return nil
}

// NICs returns the device ports in use, in lane order.
func (e *Engine) NICs() []NIC {
	out := make([]NIC, len(e.nics))
	for i, n := range e.nics {
		out[i] = n.info
	}
	return out
}

// Config returns the effective configuration (defaults filled).
func (e *Engine) Config() Config { return e.cfg }

// Region is memory registered on every NIC of the engine.
type Region struct {
	e    *Engine
	Key  uint32 // names the region in ConnInfo and in Ops
	Name string
	Addr uint64 // address (IOVA) of byte 0 in work requests
	Len  uint64
	// Access is what peers may do; LocalOnly regions are not offered.
	Access Access
	mrs    []mrInfo // one per NIC, in NIC order
}

// Access says what peers may do to a region. Every region is a local
// source and destination of this side's own READs and WRITEs.
type Access uint8

const (
	// LocalOnly regions are not offered to peers (not in ConnInfo): the
	// destination slots of this side's READs, the engine HBM it loads.
	LocalOnly Access = 0
	// RemoteRead lets connected peers READ the region (the DRAM pool a
	// peer serves pages from).
	RemoteRead Access = 1
	// RemoteWrite lets connected peers WRITE into the region.
	RemoteWrite Access = 2
)

// mrAccess is the verbs access of a region: local write always (a READ's
// destination, and required with remote write), remote as asked.
func (a Access) mrAccess() uint32 {
	f := uint32(accessLocalWrite)
	if a&RemoteRead != 0 {
		f |= accessRemoteRead
	}
	if a&RemoteWrite != 0 {
		f |= accessRemoteWrite
	}
	return f
}

// RegisterHost registers host memory on every NIC, with access for peers.
// The memory must stay mapped until Deregister and must not be Go heap
// memory (the NIC reads and writes it behind Go's back): the DRAM pool's
// mmapped slabs are.
func (e *Engine) RegisterHost(name string, mem []byte, access Access) (*Region, error) {
	if len(mem) == 0 {
		return nil, fmt.Errorf("register %s: empty region", name)
	}
	addr := addrOf(mem)
	return e.register(name, addr, uint64(len(mem)), access, func(n *nic) (mrInfo, error) {
		return e.v.regMR(n.pd, uintptr(addr), uint64(len(mem)), access.mrAccess())
	})
}

// addrOf is the address of b's first byte, as work requests carry it.
func addrOf(b []byte) uint64 { return uint64(uintptr(unsafe.Pointer(unsafe.SliceData(b)))) }

func (e *Engine) register(name string, addr, length uint64, access Access, reg func(*nic) (mrInfo, error)) (*Region, error) {
	if err := e.live(); err != nil {
		return nil, err
	}
	r := &Region{e: e, Name: name, Addr: addr, Len: length, Access: access}
	for _, n := range e.nics {
		mr, err := reg(n)
		if err != nil {
			r.deregister()
			return nil, fmt.Errorf("register %s (%d bytes) on %s: %w", name, length, n.info.Name, err)
		}
		r.mrs = append(r.mrs, mr)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.mu.closed {
		r.deregister()
		return nil, ErrClosed
	}
	e.mu.nextKey++
	r.Key = e.mu.nextKey
	e.mu.regions[r.Key] = r
	return r, nil
}

func (r *Region) deregister() error {
	var errs []error
	for _, mr := range r.mrs {
		if err := r.e.v.deregMR(mr.mr); err != nil {
			errs = append(errs, err)
		}
	}
	r.mrs = nil
	return errors.Join(errs...)
}

// Deregister releases the region on every NIC. No batch using it may be in
// flight. Idempotent.
func (r *Region) Deregister() error {
	r.e.mu.Lock()
	_, ok := r.e.mu.regions[r.Key]
	delete(r.e.mu.regions, r.Key)
	r.e.mu.Unlock()
	if !ok {
		return nil
	}
	return r.deregister()
}

// Remote describes the region for the peer's ConnInfo (lane i uses the
// rkey of the NIC carrying it).
func (r *Region) remote(lanes []*lane) RemoteRegion {
	g := RemoteRegion{Key: r.Key, Addr: r.Addr, Len: r.Len, RKeys: make([]uint32, len(lanes))}
	for i, l := range lanes {
		g.RKeys[i] = r.mrs[l.nicIdx].RKey
	}
	return g
}

func (e *Engine) regionsLocked() []*Region {
	out := make([]*Region, 0, len(e.mu.regions))
	for k := uint32(1); k <= e.mu.nextKey; k++ {
		if r, ok := e.mu.regions[k]; ok {
			out = append(out, r)
		}
	}
	return out
}

// Close closes every connection, deregisters every region and releases the
// protection domains and devices. Idempotent.
func (e *Engine) Close() error {
	e.mu.Lock()
	if e.mu.closed {
		e.mu.Unlock()
		return nil
	}
	e.mu.closed = true
	conns, regions := e.mu.conns, e.regionsLocked()
	e.mu.conns, e.mu.regions = map[uint64]*Conn{}, map[uint32]*Region{}
	e.mu.Unlock()
	var errs []error
	for _, c := range conns {
		errs = append(errs, c.close())
	}
	for _, r := range regions {
		errs = append(errs, r.deregister())
	}
	for _, n := range e.nics {
		errs = append(errs, e.v.deallocPD(n.pd), e.v.closeDevice(n.ctx))
	}
	return errors.Join(errs...)
}
