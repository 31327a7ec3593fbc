package engineapi

import (
	"bufio"
	"net"
	"path/filepath"
	"testing"
	"time"

	"github.com/orbitkv/orbitkv/internal/lane"
)

// connPair returns the two ends of a Unix stream connection.
func connPair(t *testing.T) (client, server net.Conn) {
	t.Helper()
	lis, err := net.Listen("unix", filepath.Join(t.TempDir(), "s"))
	if err != nil {
		t.Fatal(err)
	}
	defer lis.Close()
	client, err = net.Dial("unix", lis.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	if server, err = lis.Accept(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close(); server.Close() })
	return client, server
}

// TestHungUp: a request whose caller closed its end before the peer read it
// (queued while the peer was paused) is seen as hung up; a caller that
// waits is not, whether or not it sent more.
func TestHungUp(t *testing.T) {
	for _, tc := range []struct {
		name  string
		after func(client net.Conn)
		want  bool
	}{
		{"waiting", func(net.Conn) {}, false},
		{"closed", func(c net.Conn) { c.Close() }, true},
		{"sent more", func(c net.Conn) { c.Write([]byte{0}) }, false},
	} {
		client, server := connPair(t)
		client.Write(lane.AppendRequest(nil, lane.Request{Method: "Lookup", Body: []byte{1}}))
		tc.after(client)
		if _, err := lane.ReadRequest(bufio.NewReader(server), func() {}); err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if got := hungUp(server); got != tc.want {
			t.Errorf("%s: hungUp %v, want %v", tc.name, got, tc.want)
		}
	}
}

// TestWatchCaller: a caller that hangs up mid-call cancels the call's
// context; one that waits does not, and after stop the connection reads
// its next request.
func TestWatchCaller(t *testing.T) {
	client, server := connPair(t)
	r := bufio.NewReader(server)
	ctx, stop := watchCaller(t.Context(), server, r)
	select {
	case <-ctx.Done():
		t.Fatal("cancelled while the caller waits")
	default:
	}
	stop()
	server.SetReadDeadline(time.Time{})
	client.Write(lane.AppendRequest(nil, lane.Request{Method: "Wait", Body: []byte{7}}))
	if req, err := lane.ReadRequest(r, func() {}); err != nil || req.Method != "Wait" || req.Body[0] != 7 {
		t.Fatalf("next request after the watch: %+v %v", req, err)
	}
	ctx, stop = watchCaller(t.Context(), server, r)
	defer stop()
	client.Close()
	select {
	case <-ctx.Done():
	case <-time.After(20 * time.Second):
		t.Fatal("the call was not cancelled when its caller hung up")
	}
}
