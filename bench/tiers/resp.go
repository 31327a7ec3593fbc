package tiers

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"strconv"
	"time"
)

// respConn is a minimal Redis client (RESP2 SET/GET/PING) for the Redis
// baseline of `bench tiers`: enough to move page blobs, nothing more.
type respConn struct {
	c net.Conn
	r *bufio.Reader
	w *bufio.Writer
}

func dialRedis(addr string, timeout time.Duration) (*respConn, error) {
	c, err := net.DialTimeout("tcp", addr, timeout)
	if err != nil {
		return nil, err
	}
	return &respConn{c: c, r: bufio.NewReaderSize(c, 1<<20), w: bufio.NewWriterSize(c, 1<<20)}, nil
}

func (r *respConn) Close() error { return r.c.Close() }

func (r *respConn) command(args ...[]byte) error {
	_ = r.c.SetDeadline(time.Now().Add(30 * time.Second))
	fmt.Fprintf(r.w, "*%d\r\n", len(args))
	for _, a := range args {
		fmt.Fprintf(r.w, "$%d\r\n", len(a))
		r.w.Write(a)
		r.w.WriteString("\r\n")
	}
	return r.w.Flush()
}

func (r *respConn) line() (string, error) {
	s, err := r.r.ReadString('\n')
	if err != nil {
		return "", err
	}
	if len(s) < 3 {
		return "", fmt.Errorf("redis: short reply %q", s)
	}
	if s[0] == '-' {
		return "", fmt.Errorf("redis: %s", s[1:len(s)-2])
	}
	return s[:len(s)-2], nil
}

// set stores val under key.
func (r *respConn) set(key, val []byte) error {
	if err := r.command([]byte("SET"), key, val); err != nil {
		return err
	}
	s, err := r.line()
	if err == nil && s != "+OK" {
		err = fmt.Errorf("redis SET: %q", s)
	}
	return err
}

// get reads key's value into dst, which must have the value's length.
func (r *respConn) get(key, dst []byte) error {
	if err := r.command([]byte("GET"), key); err != nil {
		return err
	}
	s, err := r.line()
	if err != nil {
		return err
	}
	if s[0] != '$' {
		return fmt.Errorf("redis GET: %q", s)
	}
	n, err := strconv.Atoi(s[1:])
	if err != nil || n != len(dst) {
		return fmt.Errorf("redis GET: value of %s bytes, want %d", s[1:], len(dst))
	}
	if _, err := io.ReadFull(r.r, dst); err != nil {
		return err
	}
	_, err = r.r.Discard(2)
	return err
}

func (r *respConn) ping() error {
	if err := r.command([]byte("PING")); err != nil {
		return err
	}
	_, err := r.line()
	return err
}
