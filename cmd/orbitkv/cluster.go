package main

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"google.golang.org/grpc"

	"github.com/orbitkv/orbitkv/internal/pki"
	pb "github.com/orbitkv/orbitkv/proto/orbitkv/v1"
)

// runPeers lists the cluster's members as the local peer sees them.
func runPeers(ctx context.Context, args []string, out io.Writer) error {
	var d dialFlags
	fs := flag.NewFlagSet("peers", flag.ContinueOnError)
	d.register(fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	c, cctx, done, err := d.admin(ctx)
	if err != nil {
		return err
	}
	defer done()
	resp, err := c.Peers(cctx, &pb.PeersRequest{}, grpc.WaitForReady(true))
	if err != nil {
		return fmt.Errorf("peers of %s: %w", d.socket, err)
	}
	if !resp.Clustered {
		fmt.Fprintln(out, "standalone (no --cluster-addr)")
		return nil
	}
	fmt.Fprintf(out, "%-28s %-7s %10s  %-22s %-22s %-25s %s\n", "NAME", "STATE", "PAGES", "GOSSIP", "DATA", "SYNCED", "TRANSPORT")
	for _, p := range resp.Peers {
		name, synced := p.Name, "-"
		if p.Self {
			name += " (self)"
		}
		if p.SyncedUnixMs > 0 {
			synced = time.UnixMilli(p.SyncedUnixMs).Format(time.RFC3339)
		}
		fmt.Fprintf(out, "%-28s %-7s %10d  %-22s %-22s %-25s %s\n", name, p.State, p.Pages, p.GossipAddr, p.DataAddr, synced, transportOf(p))
	}
	return nil
}

// transportOf is a member's data plane as peers prints it: "rdma", or
// "tcp (why)".
func transportOf(p *pb.PeerInfo) string {
	if p.TransportReason == "" {
		return p.Transport
	}
	return p.Transport + " (" + p.TransportReason + ")"
}

// runPKI makes the cluster's credentials: `pki init` a CA and a gossip key,
// `pki issue` a peer certificate signed by that CA.
func runPKI(ctx context.Context, args []string, out io.Writer) error {
	return subcommand(ctx, "pki", args, out, map[string]func(context.Context, []string, io.Writer) error{
		"init":  runPKIInit,
		"issue": runPKIIssue,
	})
}

func runPKIInit(_ context.Context, args []string, out io.Writer) error {
	fs := flag.NewFlagSet("pki init", flag.ContinueOnError)
	dir := fs.String("dir", "certs", "directory for ca.pem, ca-key.pem and gossip.key")
	days := fs.Int("days", 3650, "CA validity in days")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if err := os.MkdirAll(*dir, 0o700); err != nil {
		return err
	}
	ca, err := pki.NewCA("orbitkv cluster CA", time.Duration(*days)*24*time.Hour)
	if err != nil {
		return err
	}
	key := make([]byte, 32)
	if _, err := rand.Read(key); err != nil {
		return err
	}
	files := []struct {
		name string
		data []byte
	}{{"ca.pem", ca.CertPEM}, {"ca-key.pem", ca.KeyPEM}, {"gossip.key", []byte(base64.StdEncoding.EncodeToString(key) + "\n")}}
	for _, f := range files {
		if err := writeNew(filepath.Join(*dir, f.name), f.data); err != nil {
			return err
		}
	}
	fmt.Fprintf(out, "wrote %s/{ca.pem,ca-key.pem,gossip.key}; keep ca-key.pem off the peers\n", *dir)
	return nil
}

func runPKIIssue(_ context.Context, args []string, out io.Writer) error {
	fs := flag.NewFlagSet("pki issue", flag.ContinueOnError)
	dir := fs.String("dir", "certs", "directory holding ca.pem and ca-key.pem; the certificate is written there")
	name := fs.String("name", "", "peer name (file names NAME.pem, NAME-key.pem)")
	hosts := fs.String("hosts", "", "comma-separated IPs or names of the peer, for its SANs")
	days := fs.Int("days", 365, "validity in days")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *name == "" || strings.ContainsAny(*name, "/\\") {
		return errors.New("pki issue: --name is required and may not contain a path separator")
	}
	caCert, err := os.ReadFile(filepath.Join(*dir, "ca.pem"))
	if err != nil {
		return fmt.Errorf("pki issue: %w (run orbitkv pki init first)", err)
	}
	caKey, err := os.ReadFile(filepath.Join(*dir, "ca-key.pem"))
	if err != nil {
		return fmt.Errorf("pki issue: %w", err)
	}
	var hs []string
	for _, h := range strings.Split(*hosts, ",") {
		if h = strings.TrimSpace(h); h != "" {
			hs = append(hs, h)
		}
	}
	p, err := pki.Issue(pki.Pair{CertPEM: caCert, KeyPEM: caKey}, *name, hs, time.Duration(*days)*24*time.Hour)
	if err != nil {
		return fmt.Errorf("pki issue: %w", err)
	}
	if err := writeNew(filepath.Join(*dir, *name+".pem"), p.CertPEM); err != nil {
		return err
	}
	if err := writeNew(filepath.Join(*dir, *name+"-key.pem"), p.KeyPEM); err != nil {
		return err
	}
	fmt.Fprintf(out, "wrote %s/%s.pem and %s-key.pem: serve with --tls-cert, --tls-key and --tls-ca %s/ca.pem\n", *dir, *name, *name, *dir)
	return nil
}

// writeNew writes a file readable by its owner only and never overwrites
// one: credentials are not replaced by accident.
func writeNew(path string, data []byte) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	return f.Close()
}
