package main

import (
	"context"
	"flag"
	"io"
)

func runBench(ctx context.Context, args []string, out io.Writer) error {
	return subcommand(ctx, "bench", args, out, map[string]func(context.Context, []string, io.Writer) error{
		"ssd": runBenchSSD,
	})
}

func runBenchSSD(ctx context.Context, args []string, out io.Writer) error {
	fs := flag.NewFlagSet("bench ssd", flag.ContinueOnError)
	dir := fs.String("dir", "data/bench", "directory on the SSD to test (not tmpfs)")
	pageBytes := fs.Uint64("page-bytes", 2<<20, "page data bytes")
	pages := fs.Int("pages", 512, "pages written then read")
	depth := fs.Int("depth", 32, "pages in flight (fio iodepth)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	return benchSSD(ctx, out, *dir, *pageBytes, *pages, *depth)
}
