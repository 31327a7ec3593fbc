package tcp

import (
	"bytes"
	"net"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// acceptedConns is a listener that hands each accepted connection to got.
type acceptedConns struct {
	net.Listener
	got chan net.Conn
}

func (l acceptedConns) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		l.got <- c
	}
	return c, err
}

// sendBufferOf reads SO_SNDBUF of a TCP connection.
func sendBufferOf(t *testing.T, c net.Conn) int {
	t.Helper()
	rc, err := c.(*net.TCPConn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var n int
	var serr error
	if err := rc.Control(func(fd uintptr) { n, serr = unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_SNDBUF) }); err != nil || serr != nil {
		t.Fatalf("getsockopt SO_SNDBUF: %v %v", err, serr)
	}
	return n
}

// TestServerSetsItsSendBuffer: each connection a server accepts asks for
// its SendBuffer (the kernel keeps twice the bytes asked for), the pages
// still arrive whole and verified; SendBuffer 0 leaves the kernel's own.
func TestServerSetsItsSendBuffer(t *testing.T) {
	for _, c := range []struct {
		name string
		set  int
		want func(got int) bool
	}{
		{"default", DefaultSendBuffer, func(got int) bool { return got == 2*DefaultSendBuffer }},
		{"autotuned", 0, func(got int) bool { return got != 2*DefaultSendBuffer && got > 0 }},
	} {
		t.Run(c.name, func(t *testing.T) {
			src := newMemSource()
			w := src.add(1, 256<<10)
			lis, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			acc := acceptedConns{Listener: lis, got: make(chan net.Conn, 1)}
			s := NewServer(src, nil)
			if s.SendBuffer != DefaultSendBuffer {
				t.Fatalf("NewServer's SendBuffer %d, want DefaultSendBuffer %d", s.SendBuffer, DefaultSendBuffer)
			}
			s.SendBuffer = c.set
			go s.Serve(acc)
			t.Cleanup(func() { s.Close() })
			cl := NewClient(nil)
			defer cl.Close()
			dst := buffers([]Want{w})
			if r := cl.Fetch(ctxFor(t, 10*time.Second), lis.Addr().String(), []Want{w}, dst)[0]; r.Err != nil || !bytes.Equal(dst[0], src.pages[w.Key].Data) {
				t.Fatalf("fetch: %v (bytes equal %v)", r.Err, bytes.Equal(dst[0], src.pages[w.Key].Data))
			}
			if got := sendBufferOf(t, <-acc.got); !c.want(got) {
				t.Errorf("SendBuffer %d: the connection's SO_SNDBUF is %d", c.set, got)
			}
		})
	}
}
