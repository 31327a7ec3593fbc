package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/orbitkv/orbitkv/fabric"
	"github.com/orbitkv/orbitkv/internal/router"
	pb "github.com/orbitkv/orbitkv/proto/orbitkv/v1"
)

// runRoute asks the local peer which hosts hold how many leading pages of a
// prompt (the admin service's Route): "where should this request go?".
func runRoute(ctx context.Context, args []string, out io.Writer) error {
	var d dialFlags
	fs := flag.NewFlagSet("route", flag.ContinueOnError)
	d.register(fs)
	layoutArg := fs.String("layout", "", "the engine's layout: JSON (the fields of orbitkv.keys.Layout) or a file holding it")
	tokensArg := fs.String("tokens", "", "the prompt's token ids, comma- or space-separated (needs --layout)")
	tokensFile := fs.String("tokens-file", "", "a file of token ids; - reads stdin (needs --layout)")
	asJSON := fs.Bool("json", false, "print the answer as POST /v1/route answers it")
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "usage: orbitkv route [flags] KEY...\n       orbitkv route [flags] --layout JSON|FILE --tokens IDS|--tokens-file FILE")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	info := io.Discard
	if !*asJSON {
		info = out
	}
	keys, err := lookupKeys(fs.Args(), *layoutArg, *tokensArg, *tokensFile, info, false)
	if err != nil {
		return err
	}
	c, cctx, done, err := d.admin(ctx)
	if err != nil {
		return err
	}
	defer done()
	res, err := c.Route(cctx, &pb.RouteRequest{Keys: keys})
	if err != nil {
		return fmt.Errorf("route: %w", err)
	}
	if *asJSON {
		enc := json.NewEncoder(out)
		enc.SetIndent("", "  ")
		return enc.Encode(fabric.RouteAnswerOf(res))
	}
	printRoute(out, res)
	return nil
}

func printRoute(out io.Writer, res *pb.RouteResponse) {
	fmt.Fprintf(out, "%d pages; %d hosts hold a leading run\n", res.PromptPages, len(res.Hosts))
	for i, h := range res.Hosts {
		var runs []string
		for _, r := range h.Runs {
			t := tierName(r.Tier)
			if r.Tier == pb.Tier_TIER_UNSPECIFIED {
				t = "unknown"
			}
			runs = append(runs, fmt.Sprintf("%s:%d", t, r.Pages))
		}
		name := h.Name
		if h.Self {
			name = strings.TrimSpace(name + " (self)")
		}
		confirmed := "confirmed"
		if !h.Confirmed {
			confirmed = "gossip only"
		}
		fmt.Fprintf(out, "%2d %-24s %-7s %5d pages  %s  %s\n", i+1, name, h.State, h.Pages, strings.Join(runs, " "), confirmed)
	}
}

// runRouteProxy runs the reference router (internal/router) until ctx ends.
func runRouteProxy(ctx context.Context, args []string, out io.Writer) error {
	var cfg router.Config
	fs := flag.NewFlagSet("route-proxy", flag.ContinueOnError)
	listen := fs.String("listen", "127.0.0.1:8100", "address the router serves POST /v1/completions on")
	fs.StringVar(&cfg.Peer, "peer", "127.0.0.1:9464", "the local peer's metrics address (POST /v1/route)")
	layoutArg := fs.String("layout", "", "the engines' layout: JSON (the fields of orbitkv.keys.Layout) or a file holding it")
	fs.DurationVar(&cfg.RouteTimeout, "route-timeout", 200*time.Millisecond, "deadline of one route query")
	fs.BoolVar(&cfg.RoundRobin, "round-robin", false, "never ask the peer: send requests to the engines in turn (the baseline; several engines of one host)")
	engines := map[string]string{}
	fs.Func("engine", "NAME=URL: the engine on the host whose peer is named NAME (repeat; with -round-robin any name)", func(s string) error {
		name, url, ok := strings.Cut(s, "=")
		if !ok || name == "" || url == "" {
			return fmt.Errorf("want NAME=URL, got %q", s)
		}
		engines[name] = strings.TrimSuffix(url, "/")
		return nil
	})
	if err := fs.Parse(args); err != nil {
		return err
	}
	cfg.Engines = engines
	if !cfg.RoundRobin {
		layout, err := parseLayout(*layoutArg)
		if err != nil {
			return err
		}
		if cfg.Layout, err = json.Marshal(layout); err != nil {
			return err
		}
	}
	rt, err := router.New(cfg)
	if err != nil {
		return err
	}
	lis, err := net.Listen("tcp", *listen)
	if err != nil {
		return fmt.Errorf("route-proxy: %w", err)
	}
	fmt.Fprintf(out, "route-proxy listening on http://%s\n", lis.Addr())
	srv := &http.Server{Handler: rt, ReadHeaderTimeout: 5 * time.Second, ReadTimeout: 60 * time.Second}
	shut := make(chan struct{})
	go func() {
		defer close(shut)
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}()
	if err := srv.Serve(lis); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	<-shut // the requests in flight have ended (or 5 s passed): the counts are final
	c := rt.Counts()
	fmt.Fprintf(out, "route-proxy: %d requests routed, %d round robin; %d route queries failed or timed out\n",
		c.Routed, c.RoundRobin, c.RouteFailed)
	return nil
}
