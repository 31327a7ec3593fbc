//go:build !cgo || !linux

package rdma

import "fmt"

// Without cgo (or off Linux) there is no verbs binding: Open returns an
// error wrapping ErrNotSupported and ErrNoDevice, so the peer builds and
// falls back to TCP.

func loadVerbs(string) (verbs, error) {
	return nil, fmt.Errorf("%w: %w (built without cgo)", ErrNoDevice, ErrNotSupported)
}
