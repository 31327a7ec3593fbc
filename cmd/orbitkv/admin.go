package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"google.golang.org/grpc"

	"github.com/orbitkv/orbitkv/fabric"
	"github.com/orbitkv/orbitkv/internal/bytesize"
	"github.com/orbitkv/orbitkv/internal/engineclient"
	pb "github.com/orbitkv/orbitkv/proto/orbitkv/v1"
)

// dialFlags are the flags every admin command shares.
type dialFlags struct {
	socket, dataDir string
	timeout         time.Duration
}

func (d *dialFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&d.socket, "socket", "", "the peer's Unix socket (default: $ORBITKV_SOCKET, else DATA-DIR/orbitkv.sock)")
	fs.StringVar(&d.dataDir, "data-dir", fabric.DefaultConfig().DataDir, "the peer's data dir, whose socket is dialled when neither --socket nor $ORBITKV_SOCKET is set")
	fs.DurationVar(&d.timeout, "timeout", 5*time.Second, "deadline of the call")
}

// socketPath is the socket to dial: --socket, else $ORBITKV_SOCKET, else the
// socket a peer started with the same --data-dir (absolute) listens on.
func (d *dialFlags) socketPath() string {
	if d.socket != "" {
		return d.socket
	}
	if s := os.Getenv("ORBITKV_SOCKET"); s != "" {
		return s
	}
	cfg := fabric.DefaultConfig()
	cfg.DataDir = d.dataDir
	_ = cfg.Validate() // fills the socket; what it refuses does not matter here
	return cfg.Socket
}

func (d *dialFlags) admin(ctx context.Context) (pb.AdminServiceClient, context.Context, func(), error) {
	d.socket = d.socketPath()
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
	printStatus(out, health, st)
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

// printStatus writes a Status answer for people: sizes in binary units,
// tiers by name.
func printStatus(out io.Writer, health string, st *pb.StatusResponse) {
	fmt.Fprintf(out, "%s\nversion %s, up %s\nsessions %d, leases %d, catalog entries %d, operations in flight %d\n",
		health, st.Version, (time.Duration(st.UptimeMs) * time.Millisecond).Round(time.Second), st.Sessions, st.Leases, st.CatalogEntries, st.InflightOps)
	for _, t := range st.Tiers {
		pct := 0.0
		if t.CapacityBytes > 0 {
			pct = 100 * float64(t.UsedBytes) / float64(t.CapacityBytes)
		}
		fmt.Fprintf(out, "%-6s %8d pages  %10s used of %-10s (%.1f%%)\n", tierName(t.Tier), t.Pages,
			bytesize.Size(t.UsedBytes).Human(), bytesize.Size(t.CapacityBytes).Human(), pct)
	}
}

// tierName is the tier as the docs and metrics name it: dram, ssd, remote.
func tierName(t pb.Tier) string {
	return strings.ToLower(strings.TrimPrefix(t.String(), "TIER_"))
}
