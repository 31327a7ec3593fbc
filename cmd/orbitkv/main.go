// Command orbitkv is the OrbitKV peer and its admin and benchmark tools.
//
//	orbitkv serve            run the peer (flags and config file: docs/configuration.md)
//	orbitkv config print     the effective configuration and where each value came from
//	orbitkv status           report a running peer's health and tiers
//	orbitkv catalog lookup   look up a chain of page keys
//	orbitkv route            rank the hosts by the leading pages of a prompt they hold
//	orbitkv route-proxy      the reference router in front of several engines
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
	"sort"
	"strings"
	"syscall"
)

type command struct {
	name, summary string
	run           func(ctx context.Context, args []string, out io.Writer) error
}

func commands() []command {
	return []command{
		{"serve", "run the peer", runServe},
		{"config", "config print: the effective configuration of serve's flags and --config file, with each value's source", runConfig},
		{"status", "report a running peer's health and tiers", runStatus},
		{"catalog", "catalog lookup: would this prompt hit? (page keys, or token ids and a layout)", runCatalog},
		{"peers", "list the cluster's members as the local peer sees them", runPeers},
		{"route", "route: which hosts hold how many leading pages of a prompt, best first", runRoute},
		{"route-proxy", "route-proxy: the reference router, an HTTP proxy that sends each completion to the host holding its prefix", runRouteProxy},
		{"pki", "pki init | pki issue: make the cluster's CA, gossip key and peer certificates", runPKI},
		{"bench", "bench tiers|lookup|ssd: benchmarks with their baselines", runBench},
		{"sim", "sim --trace PATH: replay a request trace against the tiers in virtual time", runSim},
		{"version", "print the version, git revision and Go version", runVersion},
	}
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	err := run(ctx, os.Args[1:], os.Stdout)
	if err != nil && !errors.Is(err, flag.ErrHelp) && !errors.Is(err, errUsage) {
		fmt.Fprintln(os.Stderr, "orbitkv:", err)
	}
	os.Exit(exitCode(err))
}

// stderr is where usage goes when it answers a mistake (tests replace it).
var stderr io.Writer = os.Stderr

// errUsage reports a command line answered with its usage text alone (a
// bare orbitkv, a group without its subcommand): exit status 2.
var errUsage = errors.New("usage")

// exitCode is 0 for success and for help that was asked for, 2 otherwise.
func exitCode(err error) int {
	if err == nil || errors.Is(err, flag.ErrHelp) {
		return 0
	}
	return 2
}

func isHelp(arg string) bool {
	return arg == "help" || arg == "-h" || arg == "--help" || arg == "-help"
}

func run(ctx context.Context, args []string, out io.Writer) error {
	if len(args) == 0 {
		usage(stderr)
		return errUsage
	}
	if isHelp(args[0]) {
		usage(out)
		return nil
	}
	for _, c := range commands() {
		if c.name == args[0] {
			return c.run(ctx, args[1:], out)
		}
	}
	usage(stderr)
	return fmt.Errorf("unknown command %q", args[0])
}

func usage(w io.Writer) {
	fmt.Fprintln(w, "usage: orbitkv <command> [flags]\n\ncommands:")
	for _, c := range commands() {
		fmt.Fprintf(w, "  %-8s %s\n", c.name, c.summary)
	}
	fmt.Fprintln(w, "\n'orbitkv <command> --help' lists a command's subcommands or flags; docs/configuration.md has them all.")
}

// subcommand dispatches to one of subs by the first argument; --help (or
// help) lists them, and so does a missing one, as an error.
func subcommand(ctx context.Context, group string, args []string, out io.Writer, subs map[string]func(context.Context, []string, io.Writer) error) error {
	if len(args) == 0 || isHelp(args[0]) {
		w := out
		if len(args) == 0 {
			w = stderr
		}
		names := make([]string, 0, len(subs))
		for name := range subs {
			names = append(names, name)
		}
		sort.Strings(names)
		fmt.Fprintf(w, "usage: orbitkv %s <subcommand> [flags]\n\nsubcommands: %s\n\n'orbitkv %s <subcommand> --help' lists its flags.\n",
			group, strings.Join(names, ", "), group)
		if len(args) == 0 {
			return fmt.Errorf("%s needs a subcommand: %s", group, strings.Join(names, ", "))
		}
		return nil
	}
	f, ok := subs[args[0]]
	if !ok {
		return fmt.Errorf("unknown %s subcommand %q", group, args[0])
	}
	return f(ctx, args[1:], out)
}

func runVersion(_ context.Context, args []string, out io.Writer) error {
	fs := flag.NewFlagSet("version", flag.ContinueOnError)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("version takes no arguments, got %q", fs.Arg(0))
	}
	fmt.Fprintln(out, version())
	return nil
}
