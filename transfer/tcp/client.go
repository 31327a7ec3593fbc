package tcp

import (
	"bufio"
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/orbitkv/orbitkv/internal/page"
)

// DefaultDeadline bounds a Fetch whose context has no deadline.
const DefaultDeadline = 30 * time.Second

// deadlineSlack is how close to its deadline a broken request counts as
// ended by the deadline.
const deadlineSlack = 20 * time.Millisecond

// maxIdle is how many idle connections the client keeps per address.
const maxIdle = 8

// headBuf is the size of a connection's read buffer. It holds a page's
// status and header; a page's bytes bypass it (a read at least this large
// into an empty buffer goes straight into the destination), so at most
// this much of each page is copied twice. (At 256 KiB, nearly every byte
// of a 256 KiB page went through it: the read of the status filled it.)
const headBuf = 4 << 10

// Client fetches pages from Servers. It keeps idle connections per address
// for reuse. It is safe for concurrent use; each Fetch uses a connection of
// its own.
type Client struct {
	tls *tls.Config

	// Verify, set before the first Fetch, is where each page is
	// checksummed (receive.go). NewClient sets VerifyAuto where the process
	// has cores to spare (spareCores), else VerifyInline.
	Verify Verify

	received      atomic.Uint64
	inFlight      atomic.Int32  // Fetches under way (VerifyAuto)
	checkedBehind atomic.Uint64 // Fetches that checked behind their reads

	mu     sync.Mutex
	idle   map[string][]*conn
	closed bool
}

// Verify is where a Client checksums the pages it receives (receive.go).
type Verify int

const (
	// VerifyInline sums each read's bytes on the reading goroutine, right
	// after the read, while they are in its core's cache.
	VerifyInline Verify = iota
	// VerifyBehind sums them on a goroutine of the Fetch's own, behind the
	// reads (summer).
	VerifyBehind
	// VerifyAuto sums behind the reads a Fetch that starts while another
	// Fetch of the client is under way, and inline one that starts alone.
	// On the GPU machine's 16 cores, in every call that measured both,
	// one connection moved more checking inline (75–92% of iperf3 against
	// 57–82% behind) and two checking behind (66–87% against 48–69%):
	// docs/journal/2026-11-30-tcp-data-plane.md, "A faster CRC-32C". On two
	// cores the summer
	// shares the reader's core and gains nothing.
	VerifyAuto
)

var verifyNames = [...]string{VerifyInline: "inline", VerifyBehind: "behind", VerifyAuto: "auto"}

func (v Verify) String() string {
	if v < 0 || int(v) >= len(verifyNames) {
		return fmt.Sprintf("Verify(%d)", int(v))
	}
	return verifyNames[v]
}

// ParseVerify returns the Verify named name (inline, behind, auto).
func ParseVerify(name string) (Verify, error) {
	for v, n := range verifyNames {
		if n == name {
			return Verify(v), nil
		}
	}
	return 0, fmt.Errorf("unknown verify mode %q (inline, behind, auto)", name)
}

// behind says whether a Fetch that starts with inFlight Fetches under way
// (itself included) checks behind its reads.
func (v Verify) behind(inFlight int32) bool {
	return v == VerifyBehind || v == VerifyAuto && inFlight > 1
}

// NewClient returns a client; tlsCfg nil dials plain TCP.
func NewClient(tlsCfg *tls.Config) *Client {
	c := &Client{tls: tlsCfg, idle: map[string][]*conn{}}
	if spareCores() {
		c.Verify = VerifyAuto
	}
	return c
}

// ReceivedBytes is the page bytes received and verified so far.
func (c *Client) ReceivedBytes() uint64 { return c.received.Load() }

type conn struct {
	net.Conn
	r    *bufio.Reader
	idle time.Time // when it was put back
}

// staleAfter is how long an idle connection is kept: less than the
// server's IdleTimeout, so a reused connection is not one it closed.
const staleAfter = IdleTimeout - 15*time.Second

// Result is one page's outcome of a Fetch.
type Result struct {
	// Header is the page's header as the server sent it (checksum
	// included); set when Err is nil.
	Header page.Header
	// Err nil means the destination holds the page's bytes, checked against
	// the header's checksum; else ErrNotFound, a *page.CorruptError or the
	// connection's error.
	Err error
}

// Fetch asks addr for wants and reads page i into dst[i], whose length must
// be wants[i].Size, returning one Result per page. It returns by ctx's
// deadline (DefaultDeadline without one).
func (c *Client) Fetch(ctx context.Context, addr string, wants []Want, dst [][]byte) []Result {
	res := make([]Result, len(wants))
	errs := make([]error, len(wants))
	defer func() {
		for i := range res {
			if res[i].Err = errs[i]; errs[i] != nil {
				res[i].Header = page.Header{}
			}
		}
	}()
	if err := checkFetch(wants, dst); err != nil {
		fill(errs, 0, err)
		return res
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, DefaultDeadline)
		defer cancel()
	}
	behind := c.Verify.behind(c.inFlight.Add(1))
	defer c.inFlight.Add(-1)
	if behind {
		c.checkedBehind.Add(1)
	}
	for attempt := 0; ; attempt++ {
		cn, reused, err := c.get(ctx, addr)
		if err != nil {
			fill(errs, 0, err)
			return res
		}
		got, err := c.exchange(ctx, cn, wants, dst, res, errs, behind)
		if err == nil {
			c.put(addr, cn)
			return res
		}
		cn.Close()
		// A reused connection the server closed while idle fails before any
		// answer: ask again once on a fresh one.
		if got == 0 && reused && attempt == 0 && ctx.Err() == nil {
			continue
		}
		// The server ends a request at the same deadline; whichever side
		// noticed first, the cause is the deadline.
		if cause := ctx.Err(); cause != nil {
			err = fmt.Errorf("%w (%w)", cause, err)
		} else if dl, _ := ctx.Deadline(); time.Until(dl) < deadlineSlack {
			err = fmt.Errorf("%w (%w)", context.DeadlineExceeded, err)
		}
		fill(errs, got, err)
		return res
	}
}

func checkFetch(wants []Want, dst [][]byte) error {
	if len(wants) == 0 || len(wants) > MaxPages || len(dst) != len(wants) {
		return fmt.Errorf("fetch of %d pages into %d buffers (1..%d)", len(wants), len(dst), MaxPages)
	}
	for i, w := range wants {
		if uint64(len(dst[i])) != w.Size || w.Size == 0 || w.Size > MaxPageBytes {
			return fmt.Errorf("page %s: %d bytes into a buffer of %d", w.Key, w.Size, len(dst[i]))
		}
	}
	return nil
}

// fill sets err on every page from on that has no error yet.
func fill(errs []error, from int, err error) {
	for i := from; i < len(errs); i++ {
		if errs[i] == nil {
			errs[i] = err
		}
	}
}

// exchange sends one request and reads its answer. It returns how many pages
// were received and the connection's error, if any; per-page errors go to
// errs, headers to res. Each page's bytes are checksummed as they are read,
// or behind the reads (receive.go).
func (c *Client) exchange(ctx context.Context, cn *conn, wants []Want, dst [][]byte, res []Result, errs []error, behind bool) (int, error) {
	deadline, _ := ctx.Deadline()
	cn.SetDeadline(deadline)
	stop := context.AfterFunc(ctx, func() { cn.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	if _, err := cn.Write(appendRequest(nil, time.Until(deadline), wants)); err != nil {
		return 0, fmt.Errorf("send request: %w", err)
	}
	var sums *summer
	if behind {
		sums = startSummer(&c.received)
		defer sums.wait() // before the caller reads errs: the summer sets them
	}
	for i, w := range wants {
		h, ok, err := readHead(cn.r, w)
		if err != nil {
			return i, err
		}
		if !ok {
			errs[i] = ErrNotFound
			continue
		}
		if sums != nil {
			if err := readPage(cn.r, dst[i], sums.add); err != nil {
				return i, fmt.Errorf("read page %s: %w", w.Key, err)
			}
			res[i].Header = h
			sums.end(h, &errs[i])
			continue
		}
		verr, err := readVerified(cn.r, dst[i], h)
		if err != nil {
			return i, fmt.Errorf("read page %s: %w", w.Key, err)
		}
		res[i].Header = h
		if errs[i] = verr; verr == nil {
			c.received.Add(h.Length)
		}
	}
	return len(wants), nil
}

// get returns an idle connection to addr or dials one.
func (c *Client) get(ctx context.Context, addr string) (*conn, bool, error) {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil, false, net.ErrClosed
	}
	var stale []*conn
	for l := c.idle[addr]; len(l) > 0; l = c.idle[addr] {
		cn := l[len(l)-1]
		c.idle[addr] = l[:len(l)-1]
		if time.Since(cn.idle) > staleAfter {
			stale = append(stale, cn)
			continue
		}
		c.mu.Unlock()
		closeAll(stale)
		return cn, true, nil
	}
	c.mu.Unlock()
	closeAll(stale)
	d := net.Dialer{KeepAlive: 30 * time.Second}
	raw, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, false, fmt.Errorf("dial %s: %w", addr, err)
	}
	if tc, ok := raw.(*net.TCPConn); ok {
		tc.SetNoDelay(true)
	}
	nc := raw
	if c.tls != nil {
		tc := tls.Client(raw, c.tls)
		if err := tc.HandshakeContext(ctx); err != nil {
			raw.Close()
			return nil, false, fmt.Errorf("tls handshake with %s: %w", addr, err)
		}
		nc = tc
	}
	return &conn{Conn: nc, r: bufio.NewReaderSize(nc, headBuf)}, false, nil
}

// put keeps a connection for reuse, or closes it.
func (c *Client) put(addr string, cn *conn) {
	cn.SetDeadline(time.Time{})
	cn.idle = time.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed || len(c.idle[addr]) >= maxIdle {
		cn.Close()
		return
	}
	c.idle[addr] = append(c.idle[addr], cn)
}

// Forget closes the idle connections to addr (a peer that left).
func (c *Client) Forget(addr string) {
	c.mu.Lock()
	l := c.idle[addr]
	delete(c.idle, addr)
	c.mu.Unlock()
	for _, cn := range l {
		cn.Close()
	}
}

// Close closes every idle connection; later Fetches fail.
func (c *Client) Close() error {
	c.mu.Lock()
	c.closed = true
	idle := c.idle
	c.idle = map[string][]*conn{}
	c.mu.Unlock()
	for _, l := range idle {
		for _, cn := range l {
			cn.Close()
		}
	}
	return nil
}

func closeAll(l []*conn) {
	for _, cn := range l {
		cn.Close()
	}
}
