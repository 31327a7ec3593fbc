package benchutil

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
)

// ServeEcho echoes every connection's bytes back on a Unix socket at path
// until ctx ends: a bare round trip, the baseline of an RPC benchmark.
func ServeEcho(ctx context.Context, path string) error {
	lis, err := net.Listen("unix", path)
	if err != nil {
		return fmt.Errorf("echo listen: %w", err)
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	go func() { <-ctx.Done(); lis.Close() }()
	for {
		c, err := lis.Accept()
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, net.ErrClosed) {
				return nil
			}
			return fmt.Errorf("echo accept: %w", err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer c.Close()
			go func() { <-ctx.Done(); c.Close() }()
			buf := make([]byte, 64<<10)
			for {
				n, err := c.Read(buf)
				if err != nil {
					return
				}
				if _, err := c.Write(buf[:n]); err != nil {
					return
				}
			}
		}()
	}
}
