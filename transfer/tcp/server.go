package tcp

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/orbitkv/orbitkv/internal/page"
)

// Page is one page a Source serves: its header (checksum included) and its
// bytes. Data nil means the page is not held as asked.
type Page struct {
	Header page.Header
	Data   []byte
}

// Source is what a Server serves. Open returns one Page per want, in order,
// and a release function the server calls once the bytes have been written
// or the write failed (with Server.Splice, once the client has read them or
// the connection is dropped); until then the Data must stay valid and unchanged
// (the peer pins the pages). Open must return by ctx's deadline.
type Source interface {
	Open(ctx context.Context, wants []Want) ([]Page, func())
}

// IdleTimeout is how long a server keeps a connection that sends nothing.
const IdleTimeout = 2 * time.Minute

// handshakeTimeout bounds a TLS handshake.
const handshakeTimeout = 10 * time.Second

// ServerStats counts what a server sent.
type ServerStats struct {
	Requests, Pages, Missing, Bytes uint64
}

// Server answers fetch requests from a Source.
type Server struct {
	src Source
	tls *tls.Config
	// OnError, if set, is told about connections that ended with an error
	// other than the client going away.
	OnError func(remote string, err error)
	// PrefetchBytes, set before Serve, has a goroutine of each request's
	// read its pages' bytes that far ahead of the writer (prefetch.go); 0
	// writes each answer in one go. NewServer sets DefaultPrefetchBytes
	// where the process has cores to spare, else 0.
	PrefetchBytes int
	// Splice, set before Serve, writes the page bytes of answers on plain
	// TCP by reference, not by copy, each answer's pages leased until the
	// client's next request or the connection's end (splice.go); answers
	// over TLS are written as before. Off by default.
	Splice bool
	// SendBuffer, set before Serve, is the send buffer each connection
	// asks the kernel for (SO_SNDBUF, bytes; Linux keeps twice that for its
	// own bookkeeping); 0 leaves the kernel's autotuning. NewServer sets
	// DefaultSendBuffer (sndbuf.go).
	SendBuffer int

	requests, pages, missing, bytes atomic.Uint64

	mu     sync.Mutex
	lis    []net.Listener
	conns  map[net.Conn]struct{}
	closed bool
	wg     sync.WaitGroup
}

// NewServer returns a server of src; tlsCfg nil serves plain TCP.
func NewServer(src Source, tlsCfg *tls.Config) *Server {
	s := &Server{src: src, tls: tlsCfg, conns: map[net.Conn]struct{}{}, SendBuffer: DefaultSendBuffer}
	if spareCores() {
		s.PrefetchBytes = DefaultPrefetchBytes
	}
	return s
}

// ErrServerClosed is returned by Serve after Close.
var ErrServerClosed = errors.New("tcp data plane: server closed")

// Serve accepts connections on lis until Close; it always returns an error.
func (s *Server) Serve(lis net.Listener) error {
	if !s.track(lis) {
		lis.Close()
		return ErrServerClosed
	}
	backoff := time.Duration(0)
	for {
		c, err := lis.Accept()
		if err != nil {
			if s.isClosed() {
				return ErrServerClosed
			}
			// Out of descriptors, a transient network error: keep serving
			// (as net/http does), backing off up to a second.
			backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
			if s.OnError != nil {
				s.OnError(lis.Addr().String(), fmt.Errorf("accept: %w", err))
			}
			time.Sleep(backoff)
			continue
		}
		backoff = 0
		if !s.addConn(c) {
			c.Close()
			return ErrServerClosed
		}
		go func() {
			defer s.wg.Done()
			defer s.dropConn(c)
			s.serveConn(c)
		}()
	}
}

func (s *Server) track(lis net.Listener) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return false
	}
	s.lis = append(s.lis, lis)
	return true
}

func (s *Server) isClosed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closed
}

func (s *Server) addConn(c net.Conn) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return false
	}
	s.conns[c] = struct{}{}
	s.wg.Add(1) // under mu: Close's Wait sees every connection it did not refuse
	return true
}

func (s *Server) dropConn(c net.Conn) {
	c.Close()
	s.mu.Lock()
	delete(s.conns, c)
	s.mu.Unlock()
}

// Close stops the listeners, closes every connection and waits for their
// goroutines (and so for every Source release) to finish.
func (s *Server) Close() error {
	s.mu.Lock()
	s.closed = true
	for _, l := range s.lis {
		l.Close()
	}
	for c := range s.conns {
		if s.Splice {
			abort(c) // spliced pages may still be queued: drop them, not send them
		} else {
			c.Close()
		}
	}
	s.mu.Unlock()
	s.wg.Wait()
	return nil
}

// Stats returns the server's counters.
func (s *Server) Stats() ServerStats {
	return ServerStats{Requests: s.requests.Load(), Pages: s.pages.Load(), Missing: s.missing.Load(), Bytes: s.bytes.Load()}
}

func (s *Server) serveConn(raw net.Conn) {
	c := raw
	if err := setSendBuffer(raw, s.SendBuffer); err != nil {
		s.report(raw, err) // served anyway, with the kernel's buffer
	}
	if s.tls != nil {
		tc := tls.Server(raw, s.tls)
		raw.SetDeadline(time.Now().Add(handshakeTimeout))
		if err := tc.Handshake(); err != nil {
			s.report(raw, fmt.Errorf("tls handshake: %w", err))
			return
		}
		c = tc
	}
	var held func() // the last answer's release, if its pages went by reference
	defer func() {
		if held != nil {
			held()
		}
	}()
	for {
		if err := s.serveRequest(c, &held); err != nil {
			if !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) {
				s.report(raw, err)
			}
			return
		}
	}
}

func (s *Server) report(c net.Conn, err error) {
	if s.OnError != nil {
		s.OnError(c.RemoteAddr().String(), err)
	}
}

// serveRequest reads one request and writes its answer. *held, the
// previous answer's release when its pages were spliced, is called once
// the request's head has arrived (or the read failed): the client has read
// that answer by then. A spliced answer's release is left in *held.
func (s *Server) serveRequest(c net.Conn, held *func()) error {
	c.SetReadDeadline(time.Now().Add(IdleTimeout))
	var head [reqHeadSize]byte
	_, err := io.ReadFull(c, head[:])
	if *held != nil {
		if err != nil && !errors.Is(err, io.EOF) && !errors.Is(err, io.ErrUnexpectedEOF) {
			abort(c) // not a sign that the client read the answer
		}
		(*held)()
		*held = nil
	}
	if err != nil {
		return err
	}
	deadline, n, err := parseHead(head[:])
	if err != nil {
		return err
	}
	until := time.Now().Add(deadline)
	c.SetDeadline(until)
	body := make([]byte, n*wantSize)
	if _, err := io.ReadFull(c, body); err != nil {
		return fmt.Errorf("read request: %w", err)
	}
	wants, err := parseWants(body, n)
	if err != nil {
		return err
	}
	s.requests.Add(1)
	ctx, cancel := context.WithDeadline(context.Background(), until)
	defer cancel()
	pages, release := s.src.Open(ctx, wants)
	kept := false
	defer func() {
		if !kept {
			release()
		}
	}()
	if len(pages) != len(wants) {
		return fmt.Errorf("source answered %d pages for %d", len(pages), len(wants))
	}
	bufs, data := s.answer(wants, pages)
	tc, plain := c.(*net.TCPConn)
	switch {
	case s.Splice && plain:
		if err = writeSpliced(tc, bufs, data); err == nil {
			kept, *held = true, release
		} else {
			abort(c) // before the release: what was spliced is still queued
		}
	case s.PrefetchBytes > 0:
		err = writePrefetched(c, bufs, data, s.PrefetchBytes)
	default:
		_, err = bufs.WriteTo(c)
	}
	if err != nil {
		return fmt.Errorf("write answer: %w", err)
	}
	return nil
}

// answer lays out the response: a status byte and header per page, then its
// bytes straight from the Source's memory (writev on plain TCP); data
// holds the index in bufs of each page's bytes.
func (s *Server) answer(wants []Want, pages []Page) (net.Buffers, []int) {
	heads := make([]byte, len(pages)*(1+page.WireSize))
	bufs := make(net.Buffers, 0, 2*len(pages))
	var data []int
	off := 0
	for i, p := range pages {
		w := wants[i]
		if p.Data == nil || uint64(len(p.Data)) != w.Size || p.Header.Length != w.Size || p.Header.Key != w.Key || p.Header.Layout != w.Layout {
			heads[off] = statusNotFound
			bufs = append(bufs, heads[off:off+1])
			off++
			s.missing.Add(1)
			continue
		}
		heads[off] = statusOK
		p.Header.EncodeWire(heads[off+1:])
		bufs = append(bufs, heads[off:off+1+page.WireSize], p.Data)
		data = append(data, len(bufs)-1)
		off += 1 + page.WireSize
		s.pages.Add(1)
		s.bytes.Add(w.Size)
	}
	return bufs, data
}
