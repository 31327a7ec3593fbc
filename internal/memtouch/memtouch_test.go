package memtouch

import (
	"sync"
	"syscall"
	"testing"
)

// The sum is of the first byte of every line: the loads land where they
// should and stop at the end, for lengths around a line.
func TestLinesSumsOneByteALine(t *testing.T) {
	if !Supported {
		t.Skip("no assembly version on this architecture: Lines loads nothing")
	}
	buf := make([]byte, 4*Line+Line)
	for i := range buf {
		buf[i] = byte(i%Line + 1) // first byte of a line is 1, the rest more
	}
	for _, n := range []int{1, Line - 1, Line, Line + 1, 3 * Line, 4*Line + 7} {
		want := byte((n + Line - 1) / Line) // lines started within n bytes
		if got := Lines(buf[:n]); got != want {
			t.Errorf("Lines(%d bytes) = %d, want %d", n, got, want)
		}
	}
	if got := Lines(nil); got != 0 {
		t.Errorf("Lines(nil) = %d", got)
	}
}

// A buffer the kernel is filling may be touched beside it: under -race this
// fails if the loads were Go code.
func TestLinesBesideAKernelWrite(t *testing.T) {
	var fds [2]int
	if err := syscall.Pipe(fds[:]); err != nil {
		t.Fatal(err)
	}
	defer syscall.Close(fds[0])
	defer syscall.Close(fds[1])
	buf := make([]byte, 1<<16)
	var wg sync.WaitGroup
	var sum byte
	wg.Go(func() {
		for range 100 {
			sum += Lines(buf)
		}
	})
	src := make([]byte, len(buf))
	for i := range src {
		src[i] = byte(i)
	}
	for range 20 {
		if _, err := syscall.Write(fds[1], src[:4096]); err != nil {
			t.Fatal(err)
		}
		if _, err := syscall.Read(fds[0], buf[:4096]); err != nil {
			t.Fatal(err)
		}
	}
	wg.Wait()
	t.Logf("sum %d", sum)
	for i := range 4096 {
		if buf[i] != byte(i) {
			t.Fatalf("byte %d = %d after the read", i, buf[i])
		}
	}
}
