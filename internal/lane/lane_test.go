package lane

import (
	"bytes"
	"errors"
	"io"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
)

// TestFramesRoundTrip: a request and a response read back as written,
// one after another on one stream.
func TestFramesRoundTrip(t *testing.T) {
	want := Request{Method: "Lookup", Deadline: 1500 * time.Millisecond, Body: []byte("keys")}
	var buf bytes.Buffer
	buf.Write(AppendRequest(nil, want))
	buf.Write(AppendRequest(nil, Request{Method: "Wait"}))
	arrived := 0
	got, err := ReadRequest(&buf, func() { arrived++ })
	if err != nil || got.Method != want.Method || got.Deadline != want.Deadline || !bytes.Equal(got.Body, want.Body) || arrived != 1 {
		t.Fatalf("request %+v %v (arrived %d), want %+v", got, err, arrived, want)
	}
	if got, err = ReadRequest(&buf, func() {}); err != nil || got.Method != "Wait" || len(got.Body) != 0 {
		t.Fatalf("second request %+v %v", got, err)
	}
	buf.Write(AppendResponse(nil, codes.NotFound, []byte("no such lease")))
	code, body, err := ReadResponse(&buf)
	if err != nil || code != codes.NotFound || string(body) != "no such lease" {
		t.Fatalf("response %v %q %v", code, body, err)
	}
}

// TestMalformedFrames: each is refused with ErrFrame or a short read, and
// no frame longer than MaxFrame is allocated.
func TestMalformedFrames(t *testing.T) {
	for _, tc := range []struct {
		name  string
		frame []byte
		want  error
	}{
		{"over the limit", []byte{0x7f, 0xff, 0xff, 0xff}, ErrFrame},
		{"empty", []byte{0, 0, 0, 0}, ErrFrame},
		{"no method", []byte{0, 0, 0, 5, 0, 0, 0, 0, 0}, ErrFrame},
		{"name past the end", []byte{0, 0, 0, 3, 9, 'L', 'o'}, ErrFrame},
		{"cut short", []byte{0, 0, 0, 40, 6, 'L'}, io.ErrUnexpectedEOF},
	} {
		if _, err := ReadRequest(bytes.NewReader(tc.frame), func() {}); !errors.Is(err, tc.want) {
			t.Errorf("%s: %v, want %v", tc.name, err, tc.want)
		}
	}
}

func FuzzParseRequest(f *testing.F) {
	f.Add(AppendRequest(nil, Request{Method: "Lookup", Deadline: time.Second, Body: []byte{1, 2}})[4:])
	f.Add([]byte{})
	f.Add([]byte{255, 'x'})
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := ParseRequest(b)
		if err != nil {
			return
		}
		again, err := ParseRequest(AppendRequest(nil, r)[4:])
		if err != nil || again.Method != r.Method || again.Deadline != r.Deadline || !bytes.Equal(again.Body, r.Body) {
			t.Fatalf("%+v does not round-trip: %+v %v", r, again, err)
		}
	})
}
