package tcp

import (
	"errors"
	"fmt"
	"net"

	"golang.org/x/sys/unix"
)

// Splicing an answer (Server.Splice): the page bytes go into the socket by
// reference — vmsplice maps them into a pipe, splice moves them on — so
// the serve side never copies them; statuses and headers are written as
// before. The socket then refers to the Source's memory after the write
// returns: until the client's kernel acknowledges it across a NIC, until
// the client has read it across veth or loopback. So the answer's pages
// stay leased until the client's next request on the connection, or the
// connection's end (serveConn): the client sends it only after it has
// read the whole answer, and its segment acknowledges every byte before
// the server's read returns. On the development machine, as a scratch
// binary, this moved a fifth more with 256 KiB pages on one connection
// and nothing with 2 MiB (docs/journal/2026-11-30-tcp-data-plane.md, "… a
// splice send"); on the
// GPU machine's 16 cores it halved the sender's CPU a byte, moved about a
// fifth more with 2 MiB pages on one connection and less with 256 KiB
// ("The splice send on the GPU machine"). Off by default: a page stays
// leased while a connection is idle (up to IdleTimeout), where the tiers
// cannot evict it, and small pages lose.

// abort closes c dropping what its socket still has to send (an RST, not
// a FIN), so that no page spliced into it is sent after its release.
func abort(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		tc.SetLinger(0)
	}
	c.Close()
}

// splicePipeBytes is the pipe's size asked for (the most an unprivileged
// process may set by default); a smaller pipe only means more calls.
const splicePipeBytes = 1 << 20

// writeSpliced writes bufs to c, the page bytes (bufs[i] for i in data,
// ascending) spliced, everything else written. It waits no longer than
// c's write deadline.
func writeSpliced(c *net.TCPConn, bufs net.Buffers, data []int) error {
	var p [2]int
	if err := unix.Pipe2(p[:], unix.O_CLOEXEC); err != nil {
		return fmt.Errorf("splice: pipe: %w", err)
	}
	defer unix.Close(p[0])
	defer unix.Close(p[1])
	unix.FcntlInt(uintptr(p[1]), unix.F_SETPIPE_SZ, splicePipeBytes) // best effort
	var small net.Buffers
	for i, b := range bufs {
		if len(data) == 0 || data[0] != i {
			small = append(small, b)
			continue
		}
		data = data[1:]
		if _, err := small.WriteTo(c); err != nil {
			return err
		}
		small = nil
		if err := splicePage(c, p, b); err != nil {
			return err
		}
	}
	_, err := small.WriteTo(c)
	return err
}

// splicePage moves b into c through the empty pipe p, a pipe's worth at a
// time, and leaves the pipe empty.
func splicePage(c *net.TCPConn, p [2]int, b []byte) error {
	rc, err := c.SyscallConn()
	if err != nil {
		return err
	}
	for len(b) > 0 {
		iov := []unix.Iovec{{Base: &b[0]}}
		iov[0].SetLen(min(len(b), splicePipeBytes))
		n, err := unix.Vmsplice(p[1], iov, 0)
		switch {
		case err == unix.EINTR:
			continue
		case err != nil:
			return fmt.Errorf("splice: vmsplice: %w", err)
		case n == 0:
			return errors.New("splice: vmsplice took no bytes")
		}
		left := n
		var serr error
		werr := rc.Write(func(fd uintptr) bool {
			for left > 0 {
				k, err := unix.Splice(p[0], nil, int(fd), nil, left, unix.SPLICE_F_MOVE|unix.SPLICE_F_NONBLOCK)
				switch {
				case err == unix.EAGAIN:
					return false // the socket is full: wait, up to the deadline
				case err == unix.EINTR:
				case err != nil:
					serr = fmt.Errorf("splice: %w", err)
					return true
				case k == 0:
					serr = errors.New("splice: the socket took no bytes")
					return true
				default:
					left -= int(k)
				}
			}
			return true
		})
		if werr != nil {
			return werr
		}
		if serr != nil {
			return serr
		}
		b = b[n:]
	}
	return nil
}
