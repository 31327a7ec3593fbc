package tcp

import (
	"fmt"
	"net"
)

// DefaultSendBuffer is the send buffer a server's connections ask for
// (SO_SNDBUF; the kernel keeps 1 MiB). Autotuned, the buffer may grow to
// tcp_wmem's maximum (4 MiB on the development machine): at the end of an
// answer the server has queued up to that much and sits idle while the
// client reads it, and the bytes it copied into the socket have left its
// caches by the time they are sent.
// With 1 MiB, one connection of 256 KiB pages between two namespaces, each
// on its own core, moved 110–114% of a bare TCP stream of the same pages
// round by round, against 74–77% autotuned (the serve side's CPU a byte
// down by a fifth; docs/journal/2026-12-05-tcp-bar.md). 1 MiB holds the
// bandwidth-delay product of 100 Gbit/s at 80 µs.
const DefaultSendBuffer = 512 << 10

// setSendBuffer asks for n bytes of send buffer on c if it is a TCP
// connection and n > 0.
func setSendBuffer(c net.Conn, n int) error {
	tc, ok := c.(*net.TCPConn)
	if !ok || n <= 0 {
		return nil
	}
	if err := tc.SetWriteBuffer(n); err != nil {
		return fmt.Errorf("set send buffer to %d bytes: %w", n, err)
	}
	return nil
}
