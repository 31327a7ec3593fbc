package transfer

// Memory ownership: a CUDA transport owns its copiers (package cuda keeps
// their descriptor buffers, streams and events off the Go heap) and closes
// them in Close. It borrows the registered host region (the DRAM pool,
// pinned and mapped by the peer) and the device regions named by
// descriptors; it never returns from a copy while the device may still
// touch them.

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/orbitkv/orbitkv/cuda"
)

// CUDAConfig configures a CUDA transport.
type CUDAConfig struct {
	// Copiers is how many operations copy at once on the device (each holds
	// one cuda.Copier; more wait for one). Default 4.
	Copiers int
	// Copier configures every copier; MethodAuto (the zero value) picks the
	// gather/scatter kernel where it runs. MaxSegments defaults to 65536
	// here: a batch with more descriptors is split and copied in turn.
	Copier cuda.CopierConfig
	// NoLayerGates turns gated layer-wise loads off (gates.go): marks are
	// then recorded by the copies themselves, as before.
	NoLayerGates bool
}

func (c *CUDAConfig) setDefaults() {
	if c.Copiers == 0 {
		c.Copiers = 4
	}
	if c.Copier.MaxSegments == 0 {
		c.Copier.MaxSegments = 1 << 16
	}
}

// Validate checks the config after defaults are applied.
func (c CUDAConfig) Validate() error {
	c.setDefaults()
	if c.Copiers < 1 || c.Copiers > 64 {
		return fmt.Errorf("cuda transport: %d copiers, want 1..64", c.Copiers)
	}
	return c.Copier.Validate()
}

// finishTimeout bounds how long a copy already handed to the device is
// waited for after the caller's context ended: the transport must not return
// while the device may still write memory the caller is about to reuse.
var finishTimeout = 30 * time.Second // a var so a GPU test can make a copy outlast it

// CUDA moves descriptors between one registered host region (the peer's DRAM
// pool, pinned and mapped into the device) and device memory of one GPU.
// Every descriptor of a batch goes into one copier batch (split only past
// the copier's descriptor limit), so an operation of many pages costs one
// kernel launch, a few pitched copies (a page's planes each) or one
// cuMemcpyBatchAsync, not one copy per block; Begin feeds one copier batch
// in parts (stream.go).
type CUDA struct {
	dev     *cuda.Device
	host    *cuda.HostRegion
	hostR   *Region
	copiers chan *copierSlot
	all     []*cuda.Copier
	maxSegs int
	method  cuda.Method
	noGates bool
	closed  atomic.Bool

	bytes, batches, waits atomic.Uint64
	waitNanos, copyNanos  atomic.Int64
	byMethod              [nMethods]atomic.Uint64 // device batches by the method they went by
}

// nMethods bounds cuda.Method's values (MethodPitched is the last).
const nMethods = int(cuda.MethodPitched) + 1

// started counts a device batch under the method it went by (MethodAuto
// resolves per batch: pitched copies or cuMemcpyBatchAsync).
func (c *CUDA) started(p *cuda.Pending) {
	c.batches.Add(1)
	if m := int(p.Method()); m >= 0 && m < nMethods {
		c.byMethod[m].Add(1)
	}
}

// NewCUDA creates a transport between hostR (whose bytes host registered)
// and device d.
func NewCUDA(d *cuda.Device, host *cuda.HostRegion, hostR *Region, cfg CUDAConfig) (*CUDA, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if hostR == nil || hostR.Kind != Host || hostR.Size != host.Len() {
		return nil, fmt.Errorf("cuda transport: host region does not match the registered memory")
	}
	c := &CUDA{dev: d, host: host, hostR: hostR, copiers: make(chan *copierSlot, cfg.Copiers), maxSegs: cfg.Copier.MaxSegments, noGates: cfg.NoLayerGates}
	for range cfg.Copiers {
		cp, err := d.NewCopier(cfg.Copier)
		if err != nil {
			return nil, errors.Join(fmt.Errorf("cuda transport: %w", err), c.Close())
		}
		c.all = append(c.all, cp)
		c.copiers <- &copierSlot{cp: cp}
		c.method = cp.Method()
	}
	return c, nil
}

// copierSlot is a copier and the segment list its batches are lowered into
// (reused: an 8K-token restore is 9,216 segments).
type copierSlot struct {
	cp   *cuda.Copier
	segs []cuda.Segment
}

// Name implements Copier.
func (c *CUDA) Name() string { return "cuda/" + c.method.String() }

// Method is the copy method the copiers resolved to.
func (c *CUDA) Method() cuda.Method { return c.method }

// Copy implements Copier: the whole batch in one copier batch.
func (c *CUDA) Copy(ctx context.Context, batch []Desc) error {
	return c.CopyGroups(ctx, [][]Desc{batch}, nil)
}

// CopyGroups copies the groups in order on one copier and calls done(g) on
// the calling goroutine once group g's bytes are in place, while the next
// group is already copying: a save checksums the pages it has while the
// device moves the next ones. done may be nil. On error, groups whose done
// was not called are not known to be complete.
func (c *CUDA) CopyGroups(ctx context.Context, groups [][]Desc, done func(g int)) (err error) {
	slot, err := c.acquire(ctx)
	if err != nil {
		return err
	}
	cp := slot.cp
	start := time.Now()
	defer func() { c.copyNanos.Add(int64(time.Since(start))) }()
	ok := true
	defer func() {
		if ok {
			c.copiers <- slot
		}
	}()
	type flight struct {
		p     *cuda.Pending
		group int
		last  bool
	}
	var cur *flight
	var ready []int
	finish := func() error {
		if cur == nil {
			return nil
		}
		f := cur
		cur = nil
		if err := c.wait(ctx, f.p); err != nil {
			ok = !errors.Is(err, ErrStuck)
			return err
		}
		if f.last {
			ready = append(ready, f.group)
		}
		return nil
	}
	// A batch still in flight when the loop returns early is waited for here,
	// and its error (ErrStuck above all: the caller must not reuse the
	// memory) joins the one returned.
	defer func() { err = errors.Join(err, finish()) }()
	runDone := func() {
		for _, g := range ready {
			if done != nil {
				done(g)
			}
		}
		ready = ready[:0]
	}
	for g, batch := range groups {
		dir, segs, err := c.lower(slot.segs[:0], batch)
		if err != nil {
			return err
		}
		slot.segs = segs // Start has copied them by the time they are reused
		if len(segs) == 0 {
			ready = append(ready, g)
		}
		for i := 0; i < len(segs); i += c.maxSegs {
			chunk := segs[i:min(i+c.maxSegs, len(segs))]
			if err := finish(); err != nil {
				return err
			}
			p, err := cp.Start(dir, c.host, chunk)
			if err != nil {
				return fmt.Errorf("cuda %s of %d descriptors: %w", dir, len(chunk), err)
			}
			cur = &flight{p: p, group: g, last: i+c.maxSegs >= len(segs)}
			c.started(p)
			runDone()
		}
	}
	if err := finish(); err != nil {
		return err
	}
	runDone()
	return nil
}

// ErrStuck reports a device copy that did not finish within finishTimeout
// after its caller gave up: the device may still read or write the memory
// the copy names, at any later time. A caller must never reuse that memory
// (the peer quarantines it), and the copier that ran it is retired.
var ErrStuck = errors.New("cuda copy did not finish")

// wait waits for a batch; after the context ends it still waits (bounded)
// for the device to finish before returning the context's error.
func (c *CUDA) wait(ctx context.Context, p *cuda.Pending) error {
	err := p.Wait(ctx)
	if err == nil || ctx.Err() == nil {
		return err
	}
	fctx, cancel := context.WithTimeout(context.Background(), finishTimeout)
	defer cancel()
	if ferr := p.Wait(fctx); ferr != nil {
		return fmt.Errorf("%w after %v (%v): copier retired: %w", ErrStuck, finishTimeout, ferr, err)
	}
	return err
}

func (c *CUDA) acquire(ctx context.Context) (*copierSlot, error) {
	if c.closed.Load() {
		return nil, fmt.Errorf("cuda transport: %w", cuda.ErrClosed)
	}
	select {
	case cp := <-c.copiers:
		return cp, nil
	default:
	}
	start := time.Now()
	c.waits.Add(1)
	defer func() { c.waitNanos.Add(int64(time.Since(start))) }()
	select {
	case cp := <-c.copiers:
		return cp, nil
	case <-ctx.Done():
		return nil, fmt.Errorf("waiting for a cuda copier: %w", ctx.Err())
	}
}

// lower turns descriptors into copier segments, appended to dst.
func (c *CUDA) lower(dst []cuda.Segment, batch []Desc) (cuda.Direction, []cuda.Segment, error) {
	dir, segs, n, err := lowerCUDA(dst, batch, c.hostR, c.dev.Ordinal())
	if err == nil {
		c.bytes.Add(n)
	}
	return dir, segs, err
}

// lowerCUDA turns descriptors into copier segments appended to dst and
// counts their bytes; every descriptor of a batch must move the same way
// between host region hostR and device memory of GPU ordinal.
func lowerCUDA(dst []cuda.Segment, batch []Desc, hostR *Region, ordinal int) (cuda.Direction, []cuda.Segment, uint64, error) {
	var dir cuda.Direction
	var bytes uint64
	for i := range batch {
		d := &batch[i]
		var h, dv *Region
		var hOff, dOff uint64
		var di cuda.Direction
		switch {
		case d.Src.Kind == Host && d.Dst.Kind == Device:
			h, hOff, dv, dOff, di = d.Src, d.SrcOff, d.Dst, d.DstOff, cuda.HostToDevice
		case d.Src.Kind == Device && d.Dst.Kind == Host:
			h, hOff, dv, dOff, di = d.Dst, d.DstOff, d.Src, d.SrcOff, cuda.DeviceToHost
		default:
			return 0, dst, bytes, fmt.Errorf("descriptor %d (%s -> %s): %w", i, d.Src.Name, d.Dst.Name, ErrUnsupported)
		}
		if h != hostR || dv.Ordinal != ordinal {
			return 0, dst, bytes, fmt.Errorf("descriptor %d (%s -> %s): not this transport's host region or device %d: %w",
				i, d.Src.Name, d.Dst.Name, ordinal, ErrUnsupported)
		}
		if i > 0 && di != dir {
			return 0, dst, bytes, fmt.Errorf("descriptor %d: batch mixes directions: %w", i, ErrUnsupported)
		}
		dir = di
		if err := d.check(); err != nil {
			return 0, dst, bytes, err
		}
		if d.Len == 0 {
			continue
		}
		dst = append(dst, cuda.Segment{HostOff: hOff, Dev: cuda.DevicePtr(dv.Device + dOff), Len: d.Len})
		bytes += d.Len
	}
	return dir, dst, bytes, nil
}

// CUDAStats counts a transport's work since it was created.
type CUDAStats struct {
	Bytes, Batches uint64
	ByMethod       map[string]uint64 // device batches by the copy method they went by
	CopierWaits    uint64            // operations that waited for a free copier
	CopierWait     time.Duration     // total time they waited
	CopyTime       time.Duration     // total time from a copier in hand to the last group done (CopyGroups)
}

// Stats returns the counters.
func (c *CUDA) Stats() CUDAStats {
	by := map[string]uint64{}
	for m := range nMethods {
		if n := c.byMethod[m].Load(); n > 0 {
			by[cuda.Method(m).String()] = n
		}
	}
	return CUDAStats{Bytes: c.bytes.Load(), Batches: c.batches.Load(), ByMethod: by, CopierWaits: c.waits.Load(),
		CopierWait: time.Duration(c.waitNanos.Load()), CopyTime: time.Duration(c.copyNanos.Load())}
}

// Close closes every copier; no copy may be in progress. Idempotent.
func (c *CUDA) Close() error {
	if c.closed.Swap(true) {
		return nil
	}
	var errs []error
	for _, cp := range c.all {
		errs = append(errs, cp.Close())
	}
	return errors.Join(errs...)
}
