// Command orbitkv is the OrbitKV peer and its admin and benchmark tools.
//
//	orbitkv serve            run the peer (flags: docs/configuration.md)
//	orbitkv status           report a running peer's health and tiers
//	orbitkv catalog lookup   look up a chain of page keys
//	orbitkv bench tiers      DRAM, SSD and Redis comparisons
//	orbitkv bench lookup     catalog lookup latency with many entries
//	orbitkv bench ssd        the SSD tier beside fio
//	orbitkv bench cluster    catalog convergence across peers (scripts/bench-cluster-netns.sh)
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
)

type command struct {
	name, summary string
	run           func(ctx context.Context, args []string, out io.Writer) error
}

func commands() []command {
	return []command{
		{"serve", "run the peer", runServe},
		{"status", "report a running peer's health and tiers", runStatus},
		{"catalog", "catalog lookup KEY...: look up a chain of page keys", runCatalog},
		{"peers", "list the cluster's members as the local peer sees them", runPeers},
		{"pki", "pki init | pki issue: make the cluster's CA, gossip key and peer certificates", runPKI},
		{"bench", "bench tiers|lookup|ssd: benchmarks with their baselines", runBench},
		{"sim", "sim --trace PATH: replay a request trace against the tiers in virtual time", runSim},
		{"version", "print the version", func(context.Context, []string, io.Writer) error { fmt.Println(version()); return nil }},
	}
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout); err != nil {
		if !errors.Is(err, flag.ErrHelp) {
			fmt.Fprintln(os.Stderr, "orbitkv:", err)
		}
		os.Exit(2)
	}
}

func run(ctx context.Context, args []string, out io.Writer) error {
	if len(args) == 0 || args[0] == "help" || args[0] == "-h" || args[0] == "--help" {
		usage(out)
		return nil
	}
	for _, c := range commands() {
		if c.name == args[0] {
			return c.run(ctx, args[1:], out)
		}
	}
	usage(os.Stderr)
	return fmt.Errorf("unknown command %q", args[0])
}

func usage(w io.Writer) {
	fmt.Fprintln(w, "usage: orbitkv <command> [flags]\n\ncommands:")
	for _, c := range commands() {
		fmt.Fprintf(w, "  %-8s %s\n", c.name, c.summary)
	}
}

// subcommand dispatches to one of subs by the first argument.
func subcommand(ctx context.Context, group string, args []string, out io.Writer, subs map[string]func(context.Context, []string, io.Writer) error) error {
	if len(args) == 0 {
		return fmt.Errorf("%s needs a subcommand", group)
	}
	f, ok := subs[args[0]]
	if !ok {
		return fmt.Errorf("unknown %s subcommand %q", group, args[0])
	}
	return f(ctx, args[1:], out)
}
