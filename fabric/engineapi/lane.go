package engineapi

// The engine lane: the engine service's unary methods over the plain
// frames of internal/lane on a second Unix socket. The same handlers, the
// same interceptor (metrics) and the same errors as over gRPC; only the
// transport differs (a Python engine's Lookup: 2x faster after an idle
// spell, 4-5x hot; orbitkv.bench.rpc on the H100 host, 2026-12-06).

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/orbitkv/orbitkv/internal/lane"
	pb "github.com/orbitkv/orbitkv/proto/orbitkv/v1"
)

const (
	// laneTransit bounds reading the rest of a frame once its length came,
	// and writing an answer: a client that stalls mid-frame is dropped.
	laneTransit = 10 * time.Second
	// laneDefaultDeadline is a call's deadline when its frame gives none.
	laneDefaultDeadline = 30 * time.Second
)

// Lane serves the engine service's unary methods over lane frames. Close
// stops it and waits for its connections.
type Lane struct {
	srv         *engineServer
	methods     map[string]grpc.MethodDesc
	interceptor grpc.UnaryServerInterceptor
	ctx         context.Context
	cancel      context.CancelFunc
	wg          sync.WaitGroup
	mu          struct {
		sync.Mutex
		conns  map[net.Conn]struct{}
		closed bool
	}
}

// NewLane returns the lane of this API; interceptor (nil: none) wraps
// every call, as it wraps the gRPC server's.
func (p *API) NewLane(interceptor grpc.UnaryServerInterceptor) *Lane {
	l := &Lane{srv: &engineServer{p: p}, methods: map[string]grpc.MethodDesc{}, interceptor: interceptor}
	for _, md := range pb.EngineService_ServiceDesc.Methods {
		l.methods[md.MethodName] = md
	}
	l.ctx, l.cancel = context.WithCancel(context.Background())
	l.mu.conns = map[net.Conn]struct{}{}
	return l
}

// Serve accepts connections on lis until Close (nil) or an accept error
// that is not temporary (returned: the lane stops, gRPC serves on).
func (l *Lane) Serve(lis net.Listener) error {
	defer lis.Close()
	go func() { <-l.ctx.Done(); lis.Close() }()
	backoff := time.Duration(0)
	for {
		c, err := lis.Accept()
		if err != nil {
			if l.ctx.Err() != nil {
				return nil
			}
			var te interface{ Temporary() bool }
			if !errors.As(err, &te) || !te.Temporary() { // EMFILE and its kind are temporary: wait, as gRPC does
				return fmt.Errorf("lane accept: %w", err)
			}
			backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
			select {
			case <-time.After(backoff):
			case <-l.ctx.Done():
				return nil
			}
			continue
		}
		backoff = 0
		if !l.track(c) {
			c.Close()
			return nil
		}
		go func() { defer l.wg.Done(); defer l.untrack(c); l.serveConn(c) }()
	}
}

// Close stops accepting, closes every connection (a call in progress is
// cancelled) and waits for their goroutines. Idempotent.
func (l *Lane) Close() {
	l.mu.Lock()
	l.mu.closed = true
	for c := range l.mu.conns {
		c.Close()
	}
	l.mu.Unlock()
	l.cancel()
	l.wg.Wait()
}

// track adds c to the connections Close closes and waits for.
func (l *Lane) track(c net.Conn) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.mu.closed {
		return false
	}
	l.mu.conns[c] = struct{}{}
	l.wg.Add(1)
	return true
}

func (l *Lane) untrack(c net.Conn) {
	l.mu.Lock()
	delete(l.mu.conns, c)
	l.mu.Unlock()
	c.Close()
}

// serveConn answers one connection's calls in order until it closes or
// sends a malformed frame.
func (l *Lane) serveConn(c net.Conn) {
	r := bufio.NewReaderSize(c, 64<<10)
	for {
		c.SetReadDeadline(time.Time{}) // an idle connection waits for its next call
		req, err := lane.ReadRequest(r, func() { c.SetReadDeadline(time.Now().Add(laneTransit)) })
		if err != nil {
			if errors.Is(err, lane.ErrFrame) || errors.Is(err, io.ErrUnexpectedEOF) {
				l.srv.p.log.Warn().Err(err).Msg("engine lane: closing a connection")
			}
			return
		}
		c.SetReadDeadline(time.Time{})
		if hungUp(c) { // queued while the peer was paused, say; its caller gave up
			return
		}
		ctx, stop := watchCaller(l.ctx, c, r)
		code, out := l.call(ctx, req.Method, req.Deadline, req.Body)
		stop()
		c.SetWriteDeadline(time.Now().Add(laneTransit))
		if _, err := c.Write(lane.AppendResponse(nil, code, out)); err != nil {
			return
		}
	}
}

// call runs one method's handler; it returns the gRPC code and the
// marshalled response or the error's message.
func (l *Lane) call(ctx context.Context, method string, deadline time.Duration, body []byte) (codes.Code, []byte) {
	md, ok := l.methods[method]
	if !ok {
		return codes.Unimplemented, []byte(fmt.Sprintf("lane: unknown method %q", method))
	}
	if deadline <= 0 {
		deadline = laneDefaultDeadline
	}
	ctx, cancel := context.WithTimeout(ctx, deadline)
	defer cancel()
	dec := func(m any) error {
		if err := proto.Unmarshal(body, m.(proto.Message)); err != nil {
			return status.Errorf(codes.InvalidArgument, "lane: decode %s request: %v", method, err)
		}
		return nil
	}
	resp, err := md.Handler(l.srv, ctx, dec, l.interceptor)
	if err != nil {
		st := status.Convert(err)
		return st.Code(), []byte(st.Message())
	}
	out, err := proto.Marshal(resp.(proto.Message))
	if err != nil {
		return codes.Internal, []byte(fmt.Sprintf("lane: encode %s response: %v", method, err))
	}
	return codes.OK, out
}

// watchCaller returns a context cancelled when the caller hangs up while
// its call runs (as gRPC cancels a call whose client went away: a waiting
// Save or Load ends early), and stop, which ends the watch and leaves the
// reader ready for the next request. A caller sends nothing while it
// waits, so whatever ends the watch's read early is a hang-up.
func watchCaller(parent context.Context, c net.Conn, r *bufio.Reader) (context.Context, func()) {
	ctx, cancel := context.WithCancel(parent)
	done := make(chan struct{})
	go func() {
		defer close(done)
		if _, err := r.Peek(1); err != nil && !errors.Is(err, os.ErrDeadlineExceeded) {
			cancel()
		}
	}()
	return ctx, func() {
		c.SetReadDeadline(time.Now()) // ends the Peek
		<-done
		cancel()
	}
}

// hungUp reports whether c's caller has closed its end already (an end of
// file waits to be read), without blocking.
func hungUp(c net.Conn) bool {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return false
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return false
	}
	gone := false
	rc.Read(func(fd uintptr) bool {
		var b [1]byte
		n, _, err := unix.Recvfrom(int(fd), b[:], unix.MSG_PEEK|unix.MSG_DONTWAIT)
		gone = n == 0 && err == nil
		return true
	})
	return gone
}
