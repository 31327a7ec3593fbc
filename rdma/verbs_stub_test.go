//go:build !cgo || !linux

package rdma

import (
	"errors"
	"testing"
)

func TestStubReportsNotSupported(t *testing.T) {
	_, err := Open(Config{})
	if !errors.Is(err, ErrNotSupported) || !errors.Is(err, ErrNoDevice) {
		t.Fatalf("Open = %v, want ErrNotSupported and ErrNoDevice", err)
	}
}
