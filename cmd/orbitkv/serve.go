package main

import (
	"context"
	"flag"
	"io"
	"os"
	"runtime/debug"

	"github.com/rs/zerolog"

	"github.com/orbitkv/orbitkv/fabric"
)

func version() string {
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, s := range bi.Settings {
			if s.Key == "vcs.revision" {
				return "orbitkv " + s.Value
			}
		}
	}
	return "orbitkv " + fabric.Version
}

func runServe(ctx context.Context, args []string, _ io.Writer) error {
	cfg := fabric.DefaultConfig()
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	cfg.RegisterFlags(fs)
	level := fs.String("log-level", "info", "log level: debug, info, warn, error")
	if err := fs.Parse(args); err != nil {
		return err
	}
	lvl, err := zerolog.ParseLevel(*level)
	if err != nil {
		return err
	}
	log := zerolog.New(os.Stderr).Level(lvl).With().Timestamp().Logger()
	if err := cfg.Validate(); err != nil {
		return err
	}
	log.Info().Interface("config", cfg).Str("version", version()).Msg("starting")
	peer, err := fabric.New(cfg, log)
	if err != nil {
		return err
	}
	return peer.Run(ctx)
}
