// Package lane is the engine lane's wire format and its Go client: the
// engine service's unary calls as plain length-prefixed frames on a Unix
// socket beside the gRPC one (the server is fabric/engineapi/lane.go; the
// Python client orbitkv/lane.py). It exists for latency: a Python gRPC
// unary call on a Unix socket costs 0.3 ms hot and 1.0-1.9 ms after an
// idle spell, a Lookup over the lane 0.06 and 0.4-0.5 ms (a bare socket
// round trip 0.01 and 0.15-0.2 ms; orbitkv.bench.rpc, H100 host).
//
// A request frame: u32 length of the rest, u8 length of the method name,
// the name (EngineService's, e.g. "Lookup"), u32 deadline in ms (0: the
// server's default), the protobuf request. A response frame: u32 length
// of the rest, u8 gRPC code, then the protobuf response (code 0) or the
// error's message. Integers are big-endian. A connection carries one call
// at a time, answered in order.
package lane

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// MaxFrame bounds a frame, as the gRPC server's MaxRecvMsgSize does.
const MaxFrame = 16 << 20

// ErrFrame is a malformed frame.
var ErrFrame = errors.New("lane: malformed frame")

// Request is one decoded request frame.
type Request struct {
	Method   string
	Deadline time.Duration // 0: the server's default
	Body     []byte
}

// AppendRequest appends r's frame to b.
func AppendRequest(b []byte, r Request) []byte {
	start := len(b)
	b = append(b, 0, 0, 0, 0, byte(len(r.Method)))
	b = append(b, r.Method...)
	b = binary.BigEndian.AppendUint32(b, uint32(min(r.Deadline/time.Millisecond, math.MaxUint32)))
	b = append(b, r.Body...)
	binary.BigEndian.PutUint32(b[start:], uint32(len(b)-start-4))
	return b
}

// ReadRequest reads one request frame; arrived is called once its length
// has come (the caller bounds the rest with a deadline there).
func ReadRequest(r io.Reader, arrived func()) (Request, error) {
	buf, err := readFrame(r, arrived)
	if err != nil {
		return Request{}, err
	}
	return ParseRequest(buf)
}

// ParseRequest decodes a request frame after its length.
func ParseRequest(buf []byte) (Request, error) {
	if len(buf) < 1 {
		return Request{}, fmt.Errorf("%w: empty request", ErrFrame)
	}
	k := int(buf[0])
	if k == 0 || 1+k+4 > len(buf) {
		return Request{}, fmt.Errorf("%w: method name of %d bytes in a %d-byte request", ErrFrame, k, len(buf))
	}
	ms := binary.BigEndian.Uint32(buf[1+k:])
	return Request{Method: string(buf[1 : 1+k]), Deadline: time.Duration(ms) * time.Millisecond, Body: buf[1+k+4:]}, nil
}

// AppendResponse appends a response frame: code, then body (the response
// for codes.OK, the error's message otherwise).
func AppendResponse(b []byte, code codes.Code, body []byte) []byte {
	start := len(b)
	b = append(b, 0, 0, 0, 0, byte(code))
	b = append(b, body...)
	binary.BigEndian.PutUint32(b[start:], uint32(len(b)-start-4))
	return b
}

// ReadResponse reads one response frame.
func ReadResponse(r io.Reader) (codes.Code, []byte, error) {
	buf, err := readFrame(r, func() {})
	if err != nil {
		return 0, nil, err
	}
	if len(buf) < 1 {
		return 0, nil, fmt.Errorf("%w: empty response", ErrFrame)
	}
	return codes.Code(buf[0]), buf[1:], nil
}

func readFrame(r io.Reader, arrived func()) ([]byte, error) {
	var hdr [4]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return nil, err
	}
	arrived()
	n := binary.BigEndian.Uint32(hdr[:])
	if n > MaxFrame {
		return nil, fmt.Errorf("%w: %d bytes, over %d", ErrFrame, n, MaxFrame)
	}
	buf := make([]byte, n)
	if _, err := io.ReadFull(r, buf); err != nil {
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		return nil, err
	}
	return buf, nil
}

// Client is one lane connection; a call at a time (not safe for
// concurrent use). After a transport error it refuses further calls (a
// late answer must not be read as the next call's): dial again.
type Client struct {
	c      net.Conn
	r      *bufio.Reader
	broken error
}

// Dial connects to the lane socket at path within timeout.
func Dial(path string, timeout time.Duration) (*Client, error) {
	c, err := net.DialTimeout("unix", path, timeout)
	if err != nil {
		return nil, fmt.Errorf("lane dial %s: %w", path, err)
	}
	return &Client{c: c, r: bufio.NewReader(c)}, nil
}

// Call invokes method with req and decodes the answer into resp; a peer's
// error comes back as a gRPC status error, as over gRPC. ctx's deadline
// bounds the call (the connection is unusable after a transport error).
func (c *Client) Call(ctx context.Context, method string, req, resp proto.Message) error {
	if c.broken != nil {
		return fmt.Errorf("lane %s: connection unusable after %w", method, c.broken)
	}
	err := c.call(ctx, method, req, resp)
	var st interface{ GRPCStatus() *status.Status }
	if err != nil && !errors.As(err, &st) {
		c.broken = err
	}
	return err
}

func (c *Client) call(ctx context.Context, method string, req, resp proto.Message) error {
	body, err := proto.Marshal(req)
	if err != nil {
		return fmt.Errorf("lane %s: encode: %w", method, err)
	}
	var d time.Duration
	if dl, ok := ctx.Deadline(); ok {
		d = max(time.Until(dl), time.Millisecond)
		c.c.SetDeadline(dl)
	} else {
		c.c.SetDeadline(time.Time{})
	}
	if _, err := c.c.Write(AppendRequest(nil, Request{Method: method, Deadline: d, Body: body})); err != nil {
		return fmt.Errorf("lane %s: send: %w", method, err)
	}
	code, out, err := ReadResponse(c.r)
	if err != nil {
		return fmt.Errorf("lane %s: answer: %w", method, err)
	}
	if code != codes.OK {
		return status.Error(code, string(out))
	}
	if err := proto.Unmarshal(out, resp); err != nil {
		return status.Errorf(codes.Internal, "lane %s: decode the answer: %v", method, err)
	}
	return nil
}

// Close closes the connection.
func (c *Client) Close() error { return c.c.Close() }
