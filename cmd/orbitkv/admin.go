package main

import (
	"context"
	"encoding/hex"
	"flag"
	"fmt"
	"io"
	"path/filepath"
	"time"

	"google.golang.org/grpc"

	"github.com/orbitkv/orbitkv/internal/engineclient"
	pb "github.com/orbitkv/orbitkv/proto/orbitkv/v1"
)

// dialFlags are the flags every admin command shares.
type dialFlags struct {
	socket  string
	timeout time.Duration
}

func (d *dialFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&d.socket, "socket", filepath.Join("data", "orbitkv.sock"), "the peer's Unix socket")
	fs.DurationVar(&d.timeout, "timeout", 5*time.Second, "deadline of the call")
}

func (d *dialFlags) admin(ctx context.Context) (pb.AdminServiceClient, context.Context, func(), error) {
	conn, err := engineclient.Dial(d.socket)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("dial %s: %w", d.socket, err)
	}
	cctx, cancel := context.WithTimeout(ctx, d.timeout)
	return pb.NewAdminServiceClient(conn), cctx, func() { cancel(); conn.Close() }, nil
}

func runStatus(ctx context.Context, args []string, out io.Writer) error {
	var d dialFlags
	fs := flag.NewFlagSet("status", flag.ContinueOnError)
	d.register(fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	c, cctx, done, err := d.admin(ctx)
	if err != nil {
		return err
	}
	defer done()
	st, err := c.Status(cctx, &pb.StatusRequest{}, grpc.WaitForReady(true))
	if err != nil {
		return fmt.Errorf("status of %s: %w", d.socket, err)
	}
	health := "healthy"
	if !st.Healthy {
		health = "unhealthy: " + st.Problem
	}
	fmt.Fprintf(out, "%s\nversion %s, up %s\nsessions %d, leases %d, catalog entries %d, operations in flight %d\n",
		health, st.Version, time.Duration(st.UptimeMs)*time.Millisecond, st.Sessions, st.Leases, st.CatalogEntries, st.InflightOps)
	for _, t := range st.Tiers {
		fmt.Fprintf(out, "%-10s %8d pages %14d / %d bytes\n", t.Tier, t.Pages, t.UsedBytes, t.CapacityBytes)
	}
	if st.StartRepair != "" {
		fmt.Fprintln(out, st.StartRepair)
	}
	if !st.Healthy {
		return fmt.Errorf("peer unhealthy")
	}
	return nil
}

func runCatalog(ctx context.Context, args []string, out io.Writer) error {
	return subcommand(ctx, "catalog", args, out, map[string]func(context.Context, []string, io.Writer) error{
		"lookup": runCatalogLookup,
	})
}

func runCatalogLookup(ctx context.Context, args []string, out io.Writer) error {
	var d dialFlags
	fs := flag.NewFlagSet("catalog lookup", flag.ContinueOnError)
	d.register(fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	var keys [][]byte
	for _, a := range fs.Args() {
		k, err := hex.DecodeString(a)
		if err != nil || len(k) != 16 {
			return fmt.Errorf("key %q: want 32 hex digits", a)
		}
		keys = append(keys, k)
	}
	if len(keys) == 0 {
		return fmt.Errorf("catalog lookup needs at least one key (32 hex digits each, in chain order)")
	}
	c, cctx, done, err := d.admin(ctx)
	if err != nil {
		return err
	}
	defer done()
	res, err := c.CatalogLookup(cctx, &pb.CatalogLookupRequest{Keys: keys})
	if err != nil {
		return fmt.Errorf("lookup: %w", err)
	}
	fmt.Fprintf(out, "hit %d of %d pages\n", res.HitPages, len(keys))
	for i, t := range res.Tiers {
		fmt.Fprintf(out, "%4d %x %s\n", i, keys[i], t)
	}
	return nil
}
